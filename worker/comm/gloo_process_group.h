#ifndef JOULE_WORKER_COMM_GLOO_PROCESS_GROUP_H_
#define JOULE_WORKER_COMM_GLOO_PROCESS_GROUP_H_

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/kv_client.h"
#include "worker/comm/process_group.h"

namespace gloo {
class Context;
}

namespace joule::worker {

struct GlooOptions {
  // Address this rank's TCP transport listens on; peers must be able to reach it.
  std::string hostname = "127.0.0.1";
  // Bound on rendezvous and on every collective: a dead peer is an error after this long.
  std::chrono::milliseconds timeout{60000};
};

// ProcessGroup over Gloo's TCP transport (CPU tensors). Ranks find each other through a
// KvClient (Gloo's rendezvous store), then talk peer to peer; the coordinator is not on
// the data path. Collectives use Gloo's ring allreduce, one-to-all broadcast and ring
// allgather. Gloo's exceptions are caught here and returned as Status. Before each
// collective the ranks allgather what they pass (CollectiveCall, 24 bytes each) and all
// fail it with FAILED_PRECONDITION naming the ranks when the calls differ: a length
// mismatch would otherwise throw on Gloo's transport thread and abort the process. The
// price is one small allgather per collective (a network round trip: measured at ~0.3 ms
// between two namespaces on this 2-core machine, a fifth of an mlp step over Gloo), which
// AllreduceAgreedAsync skips for the gradient buckets after their first step.
//
// Collectives run one after another, in issue order, on the group's own communication
// thread, on buffers the group shares ownership of (SharedBuffer; the blocking calls copy
// in and out). So Abort() can release a caller blocked on a peer that stopped without
// closing its sockets (SIGSTOP, a hung host), which Gloo's TCP transport would otherwise
// wait out until the timeout: the abandoned operation finishes (or times out) on the
// communication thread, writing only to memory it co-owns, and the thread then exits.
//
// Not thread-safe (see ProcessGroup), except Abort() and Work::Wait(). Destroying it
// closes the connections, so peers blocked in a collective with this rank fail promptly.
class GlooProcessGroup final : public ProcessGroup {
 public:
  // Connects a full mesh of `size` ranks. Errors: DEADLINE_EXCEEDED when some rank does
  // not show up within the timeout; UNAVAILABLE on transport errors.
  static absl::StatusOr<std::unique_ptr<GlooProcessGroup>> Create(int rank, int size,
                                                                  KvClient& kv,
                                                                  const GlooOptions& options);
  ~GlooProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  using ProcessGroup::AllreduceAsync;
  std::shared_ptr<Work> AllreduceAsync(SharedBuffer data, ReduceOp op, Precision wire) override;
  absl::Status AllreduceHalf(std::span<Half> data, ReduceOp op) override;
  absl::Status Allreduce(std::span<float> data, ReduceOp op) override;
  std::shared_ptr<Work> AllreduceAgreedAsync(SharedBuffer data, ReduceOp op,
                                             Precision wire) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  absl::Status Allgather(std::span<const float> input, std::span<float> output) override;
  absl::Status Barrier() override;
  // Times each pair's TCP link with unbound-buffer sends and receives on Gloo's pairs.
  absl::StatusOr<std::vector<LinkProbe>> ProbeLinks(int64_t bytes) override;
  // Releases the callers of collectives in progress and fails queued and later ones. The
  // abandoned operation is left to finish or time out on the communication thread (Gloo's
  // TCP transport does not wake a waiting receive when its connections are closed).
  void Abort() override;

 private:
  struct State;
  class Op;
  GlooProcessGroup(int rank, int size, std::shared_ptr<gloo::Context> context);
  // Queues `fn` for the communication thread.
  std::shared_ptr<Work> Enqueue(const char* what, std::function<void(const std::shared_ptr<gloo::Context>&)> fn);
  // Two Gloo tags per collective: the agreement on the ranks' calls, then the data. Below
  // kAgreedTagBit; AllreduceAgreedAsync's calls take one tag each above it, so a checked
  // collective and an agreed one never share a tag (wrapping within each space).
  static constexpr uint32_t kAgreedTagBit = 1u << 31;
  uint32_t NextTags() {
    const uint32_t tag = next_tag_ & ~kAgreedTagBit;
    next_tag_ = (next_tag_ + 2) & ~kAgreedTagBit;
    return tag;
  }
  uint32_t NextAgreedTag() { return kAgreedTagBit | (next_agreed_tag_++ & ~kAgreedTagBit); }
  // The allreduce of AllreduceAsync and AllreduceAgreedAsync; `check`: agree on the call
  // first, with tag `tag` (the data then takes tag + 1); else the data takes `tag`.
  std::shared_ptr<Work> StartAllreduce(SharedBuffer data, ReduceOp op, Precision wire,
                                       uint32_t tag, bool check);
  int rank_;
  int size_;
  uint32_t next_tag_ = 0;
  uint32_t next_agreed_tag_ = 0;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_GLOO_PROCESS_GROUP_H_
