#ifndef JOULE_TESTS_TESTING_IN_PROCESS_KV_H_
#define JOULE_TESTS_TESTING_IN_PROCESS_KV_H_

#include <string>

#include "server/rendezvous_kv.h"
#include "worker/comm/kv_client.h"

namespace joule::testing {

// A worker-side KvClient backed directly by the coordinator's RendezvousKv, for ranks
// run as threads in one test process (Gloo's own tests use an in-memory store the same way).
class InProcessKv final : public worker::KvClient {
 public:
  InProcessKv(server::RendezvousKv& kv, std::string scope) : kv_(kv), scope_(std::move(scope)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return kv_.Set(scope_, key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override {
    return kv_.Get(scope_, key, timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override {
    return kv_.Wait(scope_, keys, timeout);
  }

 private:
  server::RendezvousKv& kv_;
  std::string scope_;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_IN_PROCESS_KV_H_
