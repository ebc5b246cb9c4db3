#ifndef JOULE_WORKER_COMM_NCCL_PROCESS_GROUP_H_
#define JOULE_WORKER_COMM_NCCL_PROCESS_GROUP_H_

// Built only when CMake finds the CUDA toolkit and NCCL (JOULE_WITH_NCCL).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/comm/kv_client.h"
#include "worker/comm/process_group.h"

namespace joule::worker {

enum class DataType { kFloat32, kFloat16 };

struct NcclOptions {
  // CUDA device ordinal this rank uses (one GPU per rank; NCCL refuses two ranks of one
  // communicator on the same GPU).
  int device = 0;
  // Bound on the rendezvous and on every collective: NCCL kernels that do not finish in
  // time (a dead or stopped peer) abort the communicator and fail the call.
  std::chrono::milliseconds timeout{60000};
};

// ProcessGroup over NCCL (CUDA device memory). Rank 0 creates the ncclUniqueId and
// publishes it through the rendezvous store (key "nccl/id"); every rank then joins a
// non-blocking communicator (ncclCommInitRankConfig with blocking = 0), so that no NCCL
// call can block the caller forever.
//
// Collectives are enqueued on the group's own CUDA stream; the caller waits by polling
// the stream's completion event and ncclCommGetAsyncError, and gives up at the timeout
// or on Abort() with ncclCommAbort (the watchdog of PyTorch's ProcessGroupNCCL, run on
// the waiting thread). After an error or Abort() the group is broken: every later call
// fails with ABORTED. Before each collective the ranks compare what they pass (Agree): a
// length, kind, reduction or root that differs fails it on every rank with
// FAILED_PRECONDITION naming the ranks, instead of a hang or misaligned sums.
//
// The device-memory calls (AllreduceDevice) are the data path of GPU training. The host
// interface of ProcessGroup stages through a device buffer, for the small control
// collectives (evaluation sums, resume headers). Not thread-safe, except Abort().
class NcclProcessGroup final : public ProcessGroup {
 public:
  // Errors: FAILED_PRECONDITION when the device does not exist; UNAVAILABLE on NCCL or
  // CUDA errors; DEADLINE_EXCEEDED when a rank does not join within the timeout.
  static absl::StatusOr<std::unique_ptr<NcclProcessGroup>> Create(int rank, int size,
                                                                  KvClient& kv,
                                                                  const NcclOptions& options);
  ~NcclProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Reduces `count` elements of `type` at device pointer `data` in place and waits for
  // the result (or the timeout). `data` must be on this group's device.
  absl::Status AllreduceDevice(void* data, size_t count, DataType type, ReduceOp op);
  // Broadcasts `count` elements at device pointer `data` from `root`.
  absl::Status BroadcastDevice(void* data, size_t count, DataType type, int root);

  // Host-memory collectives, staged through device memory.
  using ProcessGroup::AllreduceAsync;
  std::shared_ptr<Work> AllreduceAsync(SharedBuffer data, ReduceOp op, Precision wire) override;
  absl::Status AllreduceHalf(std::span<Half> data, ReduceOp op) override;
  absl::Status Allreduce(std::span<float> data, ReduceOp op) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  absl::Status Allgather(std::span<const float> input, std::span<float> output) override;
  absl::Status Barrier() override;
  void Abort() override;

  int device() const { return device_; }

 private:
  struct Impl;
  NcclProcessGroup(int rank, int size, int device, std::unique_ptr<Impl> impl,
                   std::chrono::milliseconds timeout);
  // After an NCCL call that returned `result` (an ncclResult_t): waits until the call is
  // really on the stream (ncclInProgress on a non-blocking communicator), then Wait().
  absl::Status Enqueued(int result, const char* what);
  // Waits for the work enqueued on the stream so far. `what` names the collective.
  absl::Status Wait(const char* what);
  absl::Status Check(const char* what) const;
  // Allgathers every rank's `call` through a small device buffer (one more NCCL call and
  // host round trip per collective) and returns FAILED_PRECONDITION naming the ranks
  // when they differ; every rank then skips the collective.
  absl::Status Agree(const CollectiveCall& call, const char* what);
  // Copies `bytes` of host memory to the staging buffer (growing it), runs `op` on the
  // device copy, copies back.
  absl::Status Staged(void* host, size_t bytes, const char* what,
                      const std::function<absl::Status(void*)>& op);

  int rank_;
  int size_;
  int device_;
  std::unique_ptr<Impl> impl_;
  std::chrono::milliseconds timeout_;
  bool broken_ = false;
  std::atomic<bool> aborted_{false};
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_NCCL_PROCESS_GROUP_H_
