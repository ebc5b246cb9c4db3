#ifndef JOULE_COMMON_NAMES_H_
#define JOULE_COMMON_NAMES_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace joule {

// Short lower-case names for users: "pending", "cpu", "idle", ...
std::string JobStateName(v1::JobState state);
std::string DeviceKindName(v1::DeviceKind kind);
std::string WorkerStateName(v1::WorkerState state);
bool IsTerminal(v1::JobState state);

// Parses "cpu" / "gpu" (any case). Errors: INVALID_ARGUMENT naming the input.
absl::StatusOr<v1::DeviceKind> ParseDeviceKind(const std::string& name);
// Parses "pending", "running", ... Errors: INVALID_ARGUMENT naming the input.
absl::StatusOr<v1::JobState> ParseJobState(const std::string& name);

// Milliseconds since the Unix epoch, from the system clock.
int64_t NowUnixMs();

// "PROGRAM 0.1.0 (api joule.v1)": what --version prints (the project's version).
std::string VersionLine(const std::string& program);

}  // namespace joule

#endif  // JOULE_COMMON_NAMES_H_
