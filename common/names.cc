#include "common/names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace joule {

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_PENDING: return "pending";
    case v1::JOB_STATE_RUNNING: return "running";
    case v1::JOB_STATE_SUCCEEDED: return "succeeded";
    case v1::JOB_STATE_FAILED: return "failed";
    case v1::JOB_STATE_CANCELLED: return "cancelled";
    case v1::JOB_STATE_BUDGET_EXCEEDED: return "budget_exceeded";
    default: return "unknown";
  }
}

std::string DeviceKindName(v1::DeviceKind kind) {
  switch (kind) {
    case v1::DEVICE_KIND_CPU: return "cpu";
    case v1::DEVICE_KIND_GPU: return "gpu";
    default: return "unspecified";
  }
}

std::string WorkerStateName(v1::WorkerState state) {
  switch (state) {
    case v1::WORKER_STATE_IDLE: return "idle";
    case v1::WORKER_STATE_BUSY: return "busy";
    case v1::WORKER_STATE_REGISTERED: return "registered";
    default: return "unknown";
  }
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED || state == v1::JOB_STATE_BUDGET_EXCEEDED;
}

absl::StatusOr<v1::DeviceKind> ParseDeviceKind(const std::string& name) {
  std::string n = absl::AsciiStrToLower(name);
  if (n == "cpu") return v1::DEVICE_KIND_CPU;
  if (n == "gpu") return v1::DEVICE_KIND_GPU;
  return absl::InvalidArgumentError(absl::StrCat("device kind \"", name,
                                                 "\" is unknown (want cpu or gpu)"));
}

absl::StatusOr<v1::JobState> ParseJobState(const std::string& name) {
  std::string n = absl::AsciiStrToLower(name);
  for (auto s : {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                 v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED,
                 v1::JOB_STATE_BUDGET_EXCEEDED}) {
    if (JobStateName(s) == n) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "job state \"", name, "\" is unknown (want pending, running, succeeded, failed, "
      "cancelled or budget_exceeded)"));
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string VersionLine(const std::string& program) {
  return absl::StrCat(program, " ", JOULE_VERSION, " (api joule.v1)");
}

}  // namespace joule
