#ifndef JOULE_WORKER_COMM_GLOO_PROCESS_GROUP_H_
#define JOULE_WORKER_COMM_GLOO_PROCESS_GROUP_H_

#include <chrono>
#include <memory>
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
// the data path. Collectives use Gloo's ring allreduce and one-to-all broadcast.
// Gloo's exceptions are caught here and returned as Status.
//
// Not thread-safe (see ProcessGroup). Destroying it closes the connections, so peers
// blocked in a collective with this rank fail promptly instead of waiting for the timeout.
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
  absl::Status AllreduceSum(std::span<float> data) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  absl::Status Barrier() override;

 private:
  GlooProcessGroup(int rank, int size, std::shared_ptr<gloo::Context> context);
  int rank_;
  int size_;
  uint32_t next_tag_ = 0;
  std::shared_ptr<gloo::Context> context_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_GLOO_PROCESS_GROUP_H_
