#ifndef JOULE_SERVER_ADMISSION_H_
#define JOULE_SERVER_ADMISSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "joule/v1/job.pb.h"

namespace joule::server {

// What a submitted job must pass before it is stored, as pure functions beside the
// scheduler: the spec's own rules, the paths it names, and what it needs of a worker
// against what the workers reported. The coordinator applies them (Coordinator::Submit);
// thread-safe.

// Normalizes and validates `spec` (NormalizeAndValidateSpec with `limits`), makes the
// files it names absolute and canonical under `data_roots` (ResolveUserPaths), checks the
// client's request id (valid UTF-8, at most 256 bytes), and estimates what one worker
// needs (EstimateResources). Errors: INVALID_ARGUMENT naming the field, the path outside
// the roots, or a job larger than kMaxJobBytesPerWorker (no machine Joule targets holds
// it), with the figures.
absl::StatusOr<ResourceEstimate> AdmitSpec(v1::JobSpec& spec, const SpecLimits& limits,
                                           const std::vector<std::string>& data_roots,
                                           const std::string& request_id);

// Whether a job of `spec` needing `need` fits the largest worker of its kind: host memory
// `largest_host_bytes` and GPU memory `largest_device_bytes` (what the workers reported;
// 0: unknown, never a reason to refuse). A GPU job's model must fit the device and its
// data the host; a CPU job's model and data the host. Errors: RESOURCE_EXHAUSTED with the
// figures.
absl::Status CheckFits(const v1::JobSpec& spec, const ResourceEstimate& need,
                       int64_t largest_host_bytes, int64_t largest_device_bytes);

// Why a job of `spec` cannot start with `registered` workers of its device kind (fewer
// than it needs), or "" when it can. Advisory: the job waits for them.
std::string CapacityWarning(const v1::JobSpec& spec, int registered);

}  // namespace joule::server

#endif  // JOULE_SERVER_ADMISSION_H_
