#ifndef JOULE_WORKER_COMM_SHM_PROCESS_GROUP_H_
#define JOULE_WORKER_COMM_SHM_PROCESS_GROUP_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "worker/comm/kv_client.h"
#include "worker/comm/process_group.h"
#include "worker/comm/shm_segment.h"
#include "worker/comm/shm_sync.h"

namespace joule::worker {

struct ShmOptions {
  // Bound on the rendezvous and on every collective: a peer that does not arrive within it
  // is an error.
  std::chrono::milliseconds timeout{60000};
  // Floats each rank stages per round; longer buffers are reduced in rounds. The segment
  // holds (size + 1) x this many floats (plus a header of about 16 KiB).
  size_t slot_floats = size_t{1} << 19;  // 2 MiB
  // Bytes of /dev/shm that NewBuffer may register over the group's lifetime (all ranks'
  // regions of all buffers, freed ones included: the count must be the same on every
  // rank, and ranks free buffers independently); beyond it buffers are heap memory.
  // (Docker gives containers 64 MiB of /dev/shm unless told otherwise.)
  size_t registered_bytes_limit = size_t{1} << 30;
  // Where POSIX shared memory lives; only used to report free space in errors.
  std::string shm_dir = "/dev/shm";
};

// ProcessGroup for ranks that all run on one host, over one POSIX shared-memory segment
// (the idea of NCCL's SHM transport and of the intra-node path of Horovod/MPI): a
// collective is a memcpy into this rank's slot, a reduction of this rank's 1/N of the
// elements over all slots (a reduce-scatter, so the work is spread over the ranks), and a
// copy of the result back (an allgather), with two synchronisation points per round.
// Over loopback TCP (Gloo) the same allreduce costs a syscall per message and copies
// through the kernel; here it costs about three passes over the buffer.
//
// Synchronisation (ShmSync, in the segment's header): each rank publishes two per-round
// counters (arrived, reduced); waiters spin briefly, then sleep on a futex, checking the
// deadline, Abort() and whether the peers still live, so a dead peer is an error within
// ~100 ms and a stopped one within the timeout. A rank that fails, aborts or destroys its
// group marks the segment, so its peers stop waiting for it at once.
//
// Before its data moves, every collective compares what the ranks pass (CollectiveCall,
// published next to the counters, read after the first synchronisation): a difference
// fails the collective on every rank with FAILED_PRECONDITION and breaks the group.
//
// Collectives complete on the calling thread: AllreduceAsync returns finished Work (the
// reduction is CPU work the caller's core does either way; there is nothing to overlap
// it with on a CPU that computes the backward pass). After any error or Abort() the group
// is broken: every later collective fails with ABORTED, naming the first error.
//
// The segment (ShmSegment) is unlinked as soon as every rank has mapped it, so nothing is
// left in /dev/shm when processes die. Not thread-safe, except Abort().
class ShmProcessGroup final : public ProcessGroup {
 public:
  // Rank 0 creates the segment and publishes its name through `kv` (key "shm/name");
  // the others map it. Errors: UNAVAILABLE when the segment cannot be created or mapped
  // (e.g. /dev/shm too small, or ranks in different IPC namespaces such as containers);
  // DEADLINE_EXCEEDED when a rank does not show up within the timeout.
  static absl::StatusOr<std::unique_ptr<ShmProcessGroup>> Create(int rank, int size,
                                                                 KvClient& kv,
                                                                 const ShmOptions& options);
  ~ShmProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  using ProcessGroup::AllreduceAsync;
  std::shared_ptr<Work> AllreduceAsync(SharedBuffer data, ReduceOp op, Precision wire) override;
  absl::Status AllreduceHalf(std::span<Half> data, ReduceOp op) override;
  // A buffer in a segment of its own that every rank maps (rank r's buffer is the r-th
  // region): AllreduceAsync of it copies nothing. Each rank sums its 1/N of the elements
  // over every region and writes the sums into every region (a reduce-scatter whose
  // allgather is the writes). Heap memory on every rank when any rank cannot map it.
  SharedBuffer NewBuffer(size_t n) override;
  absl::Status Allreduce(std::span<float> data, ReduceOp op) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  absl::Status Allgather(std::span<const float> input, std::span<float> output) override;
  absl::Status Barrier() override;
  void Abort() override;

  // Segments of killed workers left in `dir`: ShmSegment::SweepStale. Call at worker start.
  static int SweepStaleSegments(const std::string& dir = "/dev/shm") {
    return ShmSegment::SweepStale(dir);
  }

  // Bytes of the mapped segment.
  size_t segment_bytes() const { return segment_.bytes(); }

 private:
  struct Header;
  class RegistrationExchange;
  static size_t HeaderBytes();  // the header, rounded up to a page
  ShmProcessGroup(int rank, int size, ShmSegment segment, const ShmOptions& options);
  // Publishes this rank's counter `which` (0 arrived, 1 reduced) for round `round_` and
  // waits until every rank published it (ShmSync::Arrive); an error breaks the group.
  absl::Status Sync(int which, const char* what);
  absl::Status Check(const char* what) const;
  // Marks the group broken with `s` (kept for later calls), tells the peers through the
  // segment, and returns `s`.
  absl::Status Break(absl::Status s);
  // The allreduce rounds: `load` fills this rank's slot with elements [off, off + len) as
  // float32, `store` takes the reduced ones back.
  using Load = std::function<void(float* slot, size_t off, size_t len)>;
  using Store = std::function<void(const float* result, size_t off, size_t len)>;
  // `call.count` elements; at least one round, in which the ranks' calls are compared.
  absl::Status Rounds(const CollectiveCall& call, ReduceOp op, const Load& load,
                      const Store& store);
  // Publishes what this rank passes to the collective it starts (before its first Sync(0)).
  void Announce(const CollectiveCall& call);
  // After the first Sync(0) of a collective: OK when every rank announced the same call;
  // else completes the round, breaks the group and returns FAILED_PRECONDITION naming the
  // ranks (every rank does, as every rank sees the same announcements).
  absl::Status Agree(const char* what);
  // Allreduce of a buffer from NewBuffer, in place in every rank's region.
  absl::Status RegisteredAllreduce(uint64_t registration, ReduceOp op);
  struct Region {
    float* base;    // rank 0's region; rank r's is base + r * stride
    size_t stride;  // floats between regions
    size_t n;       // floats in use
  };
  std::unordered_map<uint64_t, Region> regions_;
  size_t registered_bytes_ = 0;
  float* slot(int r) const;
  float* result() const;

  int rank_;
  int size_;
  ShmSegment segment_;
  ShmOptions options_;
  Header* header_;
  ShmSync sync_;  // over header_->sync
  uint64_t round_ = 0;
  bool broken_ = false;
  std::string first_error_;  // why the group broke
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_SHM_PROCESS_GROUP_H_
