#include "worker/comm/process_group.h"

#include "absl/strings/str_cat.h"

namespace joule::worker {

absl::Status CheckAllgatherSizes(size_t input, size_t output, int world) {
  if (output == input * static_cast<size_t>(world)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("allgather of ", input, " floats over ", world,
                                                 " ranks needs ", input * world,
                                                 " output floats, got ", output));
}

}  // namespace joule::worker
