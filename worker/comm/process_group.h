#ifndef JOULE_WORKER_COMM_PROCESS_GROUP_H_
#define JOULE_WORKER_COMM_PROCESS_GROUP_H_

#include <span>

#include "absl/status/status.h"

namespace joule::worker {

// The collectives one rank of a gang takes part in. Every rank must call the same
// collectives in the same order with buffers of the same length, or the call fails with
// its timeout. Buffers are host memory, float32.
//
// Not thread-safe, except Abort(): one thread issues the collectives of a group.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Element-wise sum over ranks, in place. Errors: DEADLINE_EXCEEDED or UNAVAILABLE when
  // a peer is gone or too slow.
  virtual absl::Status AllreduceSum(std::span<float> data) = 0;
  // Copies `root`'s buffer into every rank's buffer.
  virtual absl::Status Broadcast(std::span<float> data, int root) = 0;
  virtual absl::Status Barrier() = 0;
  // Makes the collective in progress (if any) and every later one fail promptly, e.g.
  // when the coordinator aborts the attempt. Thread-safe; the only call that may come
  // from another thread.
  virtual void Abort() = 0;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_PROCESS_GROUP_H_
