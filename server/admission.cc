#include "server/admission.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/names.h"
#include "common/text.h"

namespace joule::server {
namespace {

// Bytes as "12.3 GiB", for messages.
std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}

}  // namespace

absl::StatusOr<ResourceEstimate> AdmitSpec(v1::JobSpec& spec, const SpecLimits& limits,
                                           const std::vector<std::string>& data_roots,
                                           const std::string& request_id) {
  if (absl::Status s = NormalizeAndValidateSpec(spec, limits); !s.ok()) return s;
  // idx:/csv: data, torchscript: models: under the roots, absolute and canonical.
  if (absl::Status s = ResolveUserPaths(spec, data_roots); !s.ok()) return s;
  if (absl::Status s = CheckText("request_id", request_id, 256); !s.ok()) return s;
  absl::StatusOr<ResourceEstimate> need = EstimateResources(spec);
  if (!need.ok()) return need.status();
  if (need->total_bytes() > kMaxJobBytesPerWorker) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job needs about ", Gib(need->total_bytes()), " per worker (", need->parameters,
        " parameters: ", Gib(need->model_bytes), "; data: ", Gib(need->dataset_bytes),
        "), more than any worker can hold (limit ", Gib(kMaxJobBytesPerWorker), ")"));
  }
  return need;
}

absl::Status CheckFits(const v1::JobSpec& spec, const ResourceEstimate& need,
                       int64_t largest_host_bytes, int64_t largest_device_bytes) {
  const std::string kind = DeviceKindName(spec.device_kind());
  if (spec.device_kind() == v1::DEVICE_KIND_GPU && largest_device_bytes > 0 &&
      need.model_bytes > largest_device_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model needs about ", Gib(need.model_bytes), " of GPU memory (", need.parameters,
        " parameters), more than the largest gpu worker's ", Gib(largest_device_bytes)));
  }
  const int64_t host_need =
      spec.device_kind() == v1::DEVICE_KIND_GPU ? need.dataset_bytes : need.total_bytes();
  if (largest_host_bytes > 0 && host_need > largest_host_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job needs about ", Gib(host_need), " of memory per worker (", need.parameters,
        " parameters: ", Gib(need.model_bytes), "; data: ", Gib(need.dataset_bytes),
        "), more than the ", Gib(largest_host_bytes), " available on the largest ", kind,
        " worker"));
  }
  return absl::OkStatus();
}

std::string CapacityWarning(const v1::JobSpec& spec, int registered) {
  if (spec.workers() <= registered) return "";
  const v1::DeviceKind kind =
      spec.device_kind() == v1::DEVICE_KIND_GPU ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU;
  return absl::StrCat("the job needs ", spec.workers(), " ", DeviceKindName(kind),
                      " workers and ",
                      registered == 0 ? "none is"
                                      : absl::StrCat("only ", registered,
                                                     registered == 1 ? " is" : " are"),
                      " registered: it waits until enough join");
}

}  // namespace joule::server
