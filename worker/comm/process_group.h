#ifndef JOULE_WORKER_COMM_PROCESS_GROUP_H_
#define JOULE_WORKER_COMM_PROCESS_GROUP_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace joule::worker {

enum class ReduceOp {
  kSum,
  kAverage,  // the sum divided by the world size
};

// What travels between ranks for a float32 allreduce: float32, or IEEE binary16 (PyTorch
// DDP's fp16_compress_hook: each rank's values rounded to half and, for an average,
// divided by the world size in half before the sum, so that N large values do not
// overflow it; the result rounded to half; half the bytes).
enum class Precision { kFloat32, kFloat16 };

// IEEE 754 binary16 values as their bit patterns (the layout of c10::Half and
// gloo::float16; the comm layer does not depend on LibTorch).
using Half = uint16_t;

// A float32 buffer that collectives read and write in place: either heap memory it owns,
// or memory a transport registered for copy-free collectives (ProcessGroup::NewBuffer),
// kept mapped for as long as any SharedBuffer to it lives.
class Buffer {
 public:
  explicit Buffer(size_t n, float value = 0.0f) : owned_(n, value), data_(owned_.data()), size_(n) {}
  template <typename It>
  Buffer(It first, It last) : owned_(first, last), data_(owned_.data()), size_(owned_.size()) {}
  // Memory owned elsewhere: `keep` holds it alive; `registration` identifies it to the
  // transport that made it (0: none).
  Buffer(float* data, size_t n, std::shared_ptr<void> keep, uint64_t registration)
      : data_(data), size_(n), keep_(std::move(keep)), registration_(registration) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float& operator[](size_t i) { return data_[i]; }
  float operator[](size_t i) const { return data_[i]; }
  float& back() { return data_[size_ - 1]; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }
  uint64_t registration() const { return registration_; }

 private:
  std::vector<float> owned_;
  float* data_;
  size_t size_;
  std::shared_ptr<void> keep_;
  uint64_t registration_ = 0;
};

// Shared between the caller and the group's communication thread, so an abandoned
// (aborted) collective that is still waiting on a peer never writes memory the caller has
// freed or reused.
using SharedBuffer = std::shared_ptr<Buffer>;

// One collective in flight (the c10d Work of PyTorch).
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective finished, failed, or the group was aborted. Errors: those
  // of the collective (DEADLINE_EXCEEDED, UNAVAILABLE), ABORTED after Abort(). Returns the
  // same status when called again.
  virtual absl::Status Wait() = 0;
};

// A collective that completed on the caller's thread (transports whose collectives are
// synchronous: shared memory, NCCL's host path).
class CompletedWork final : public Work {
 public:
  explicit CompletedWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

// INVALID_ARGUMENT unless an allgather of `input` floats over `world` ranks has an output
// of world x input floats.
absl::Status CheckAllgatherSizes(size_t input, size_t output, int world);

// What one rank passes to a collective. Before a collective runs, the transports exchange
// these (a fixed-size message that cannot itself mismatch) and fail the collective on
// every rank when they differ, instead of reducing misaligned buffers, hanging, or
// crashing inside the transport: the check PyTorch's ProcessGroupWrapper makes under
// TORCH_DISTRIBUTED_DEBUG=DETAIL, here always on.
struct CollectiveCall {
  enum Kind : uint64_t {
    kAllreduce = 1,       // arg: ReduceOp
    kAllreduceHalf,       // arg: ReduceOp
    kAllreduceFp16Wire,   // arg: ReduceOp
    kRegisteredAllreduce, // arg: ReduceOp (a buffer from NewBuffer)
    kBroadcast,           // arg: root
    kAllgather,           // count: elements per rank
    kBarrier,
    kNewBuffer,
    kProbeLinks,          // count: bytes each way
  };
  uint64_t kind = 0;
  uint64_t count = 0;  // elements
  uint64_t arg = 0;
  bool operator==(const CollectiveCall&) const = default;
};
// "allreduce (sum) of 100 elements".
std::string DescribeCall(const CollectiveCall& call);
// OK when every rank's call (in rank order) equals rank 0's; else FAILED_PRECONDITION
// "<transport> <what> on rank <rank>: the ranks issued different collectives: rank 0 ...,
// rank 2 ..." naming each rank that differs from rank 0 (the same text on every rank).
absl::Status CompareCalls(const char* transport, const char* what, int rank,
                          const std::vector<CollectiveCall>& calls);

// One link's throughput as ProcessGroup::ProbeLinks measured it: this rank and `peer`
// each sent `bytes` to the other at the same time; `seconds` from the start until this
// rank had received the peer's bytes.
struct LinkProbe {
  int peer = 0;
  int64_t bytes = 0;
  double seconds = 0;
  // Received from the peer, 10^6 bytes a second (0 when not timed).
  double megabytes_per_second() const { return seconds > 0 ? bytes / seconds / 1e6 : 0; }
};

// The round-robin ("circle method") tournament schedule over `size` ranks: in each of
// RoundRobinRounds(size) rounds every rank meets at most one other, and every pair meets
// exactly once over the rounds. RoundRobinPartner is rank's partner in `round` (0-based),
// or -1 when it sits out (odd sizes). size >= 1, 0 <= rank < size.
int RoundRobinRounds(int size);
int RoundRobinPartner(int rank, int size, int round);

// The collectives one rank of a gang takes part in. Every rank must issue the same
// collectives in the same order with buffers of the same length: the transports compare
// the calls (CollectiveCall) first, and a difference fails the collective on every rank
// with FAILED_PRECONDITION naming the ranks (empty buffers take part too). A rank that
// never issues the collective makes the others fail with their timeout. Buffers are host
// memory, float32.
//
// Collectives run in the order they were issued. Not thread-safe, except Abort(): one
// thread issues the collectives of a group (and may Wait() for them from any thread).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Starts an element-wise reduction over ranks of `data`, in place, and returns at once.
  // `data` must not be touched until the Work's Wait() returned OK.
  // With `wire` kFloat16 the values are exchanged and reduced as half precision (see
  // Precision); `data` stays float32.
  virtual std::shared_ptr<Work> AllreduceAsync(SharedBuffer data, ReduceOp op,
                                               Precision wire) = 0;
  std::shared_ptr<Work> AllreduceAsync(SharedBuffer data, ReduceOp op) {
    return AllreduceAsync(std::move(data), op, Precision::kFloat32);
  }
  // AllreduceAsync for a call that belongs to a fixed cycle of allreduces whose every call
  // the ranks have already checked (a gradient reducer's buckets, after a first step made
  // with AllreduceAsync): the per-call check is skipped, which on Gloo saves a round trip
  // per call. Every rank must issue these calls in the same order, with the same sizes,
  // op and wire, as the checked ones did. A rank that departs from the cycle cannot mix
  // buffers with another kind of collective (Gloo: these calls have their own tags); it
  // fails with the collective timeout instead of at once. Default: AllreduceAsync.
  virtual std::shared_ptr<Work> AllreduceAgreedAsync(SharedBuffer data, ReduceOp op,
                                                     Precision wire) {
    return AllreduceAsync(std::move(data), op, wire);
  }
  // A buffer of `n` floats (zeros) for repeated AllreduceAsync calls, placed where this
  // transport reduces it without copying (the shared-memory group: a segment every rank
  // maps). Collective: every rank must call it in the same order with the same `n`. Falls
  // back to heap memory (same results, with copies) when registration is impossible, on
  // every rank alike. Default: heap memory.
  virtual SharedBuffer NewBuffer(size_t n) { return std::make_shared<Buffer>(n); }
  // Element-wise reduction over ranks, in place; `data` is unchanged on error.
  // Errors: DEADLINE_EXCEEDED or UNAVAILABLE when a peer is gone or too slow; ABORTED.
  virtual absl::Status Allreduce(std::span<float> data, ReduceOp op) = 0;
  absl::Status AllreduceSum(std::span<float> data) { return Allreduce(data, ReduceOp::kSum); }
  // Element-wise reduction of half-precision values, in place; sums are rounded to half
  // (the shared-memory group sums in float32 and rounds once).
  virtual absl::Status AllreduceHalf(std::span<Half> data, ReduceOp op) = 0;
  // Copies `root`'s buffer into every rank's buffer.
  virtual absl::Status Broadcast(std::span<float> data, int root) = 0;
  // Concatenates every rank's `input` in rank order into `output`, which holds
  // size() x input.size() elements. Errors: INVALID_ARGUMENT for a wrong output length.
  virtual absl::Status Allgather(std::span<const float> input, std::span<float> output) = 0;
  virtual absl::Status Barrier() = 0;
  // Times this rank's link to every other rank: round by round (RoundRobinPartner), each
  // pair exchanges `bytes` both ways at once while no other transfer involves either of
  // them, the rounds apart by a barrier. Collective: every rank calls it with the same
  // `bytes`. Returns one probe per peer, by round. Default: none (a transport whose ranks
  // share one machine's memory, or that cannot time a pair: an empty list).
  // Errors: those of the collectives.
  virtual absl::StatusOr<std::vector<LinkProbe>> ProbeLinks(int64_t bytes) {
    (void)bytes;
    return std::vector<LinkProbe>{};
  }
  // Makes the collectives in progress or queued (if any) and every later one fail
  // promptly with ABORTED, e.g. when the coordinator aborts the attempt. Thread-safe; the
  // only call that may come from any thread.
  virtual void Abort() = 0;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_PROCESS_GROUP_H_
