#include "worker/comm/process_group.h"

#include "absl/strings/str_cat.h"

namespace joule::worker {

absl::Status CheckAllgatherSizes(size_t input, size_t output, int world) {
  if (output == input * static_cast<size_t>(world)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("allgather of ", input, " floats over ", world,
                                                 " ranks needs ", input * world,
                                                 " output floats, got ", output));
}

std::string DescribeCall(const CollectiveCall& call) {
  auto op = [&] {
    return call.arg == static_cast<uint64_t>(ReduceOp::kAverage) ? " (average)" : " (sum)";
  };
  switch (call.kind) {
    case CollectiveCall::kAllreduce:
      return absl::StrCat("allreduce", op(), " of ", call.count, " floats");
    case CollectiveCall::kAllreduceHalf:
      return absl::StrCat("half allreduce", op(), " of ", call.count, " halves");
    case CollectiveCall::kAllreduceFp16Wire:
      return absl::StrCat("fp16-wire allreduce", op(), " of ", call.count, " floats");
    case CollectiveCall::kRegisteredAllreduce:
      return absl::StrCat("registered-buffer allreduce", op(), " of ", call.count, " floats");
    case CollectiveCall::kBroadcast:
      return absl::StrCat("broadcast from rank ", call.arg, " of ", call.count, " floats");
    case CollectiveCall::kAllgather:
      return absl::StrCat("allgather of ", call.count, " floats per rank");
    case CollectiveCall::kBarrier:
      return "barrier";
    case CollectiveCall::kNewBuffer:
      return absl::StrCat("buffer registration of ", call.count, " floats");
    case CollectiveCall::kProbeLinks:
      return absl::StrCat("link probe of ", call.count, " bytes");
  }
  return absl::StrCat("unknown collective ", call.kind);
}

absl::Status CompareCalls(const char* transport, const char* what, int rank,
                          const std::vector<CollectiveCall>& calls) {
  std::string differ;
  for (size_t r = 1; r < calls.size(); ++r) {
    if (calls[r] == calls[0]) continue;
    absl::StrAppend(&differ, ", rank ", r, " ", DescribeCall(calls[r]));
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(transport, " ", what, " on rank ", rank,
                   ": the ranks issued different collectives: rank 0 ",
                   DescribeCall(calls[0]), differ));
}

int RoundRobinRounds(int size) {
  if (size <= 1) return 0;
  return size % 2 == 0 ? size - 1 : size;
}

int RoundRobinPartner(int rank, int size, int round) {
  // Even m ranks (a ghost m-1 when size is odd): m-1 stays put, the others rotate; in
  // round r, m-1 meets r and x meets (2r - x) mod (m - 1), an involution since m - 1 is odd.
  const int m = size % 2 == 0 ? size : size + 1;
  const int ring = m - 1;
  int partner;
  if (rank == m - 1) {
    partner = round;
  } else if (rank == round) {
    partner = m - 1;
  } else {
    partner = ((2 * round - rank) % ring + ring) % ring;
  }
  return partner >= size ? -1 : partner;
}

}  // namespace joule::worker
