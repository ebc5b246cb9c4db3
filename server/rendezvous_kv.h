#ifndef JOULE_SERVER_RENDEZVOUS_KV_H_
#define JOULE_SERVER_RENDEZVOUS_KV_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace joule::server {

// The rendezvous key-value store: one scope per job attempt ("job/7/attempt/1"), through
// which the ranks of a gang exchange their transport addresses (Gloo's store, NCCL's
// unique id). A scope exists from the start of its attempt to its end; closing it wakes
// every waiter with ABORTED and frees its keys.
//
// Thread-safe. Blocking calls wait at most their timeout.
class RendezvousKv {
 public:
  static constexpr size_t kMaxKeyBytes = 512;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  static constexpr size_t kMaxKeysPerScope = 65536;

  void OpenScope(const std::string& scope);
  void CloseScope(const std::string& scope);

  // Errors: NOT_FOUND for a scope that is not open; INVALID_ARGUMENT for an empty or
  // oversized key or value, or too many keys in the scope.
  absl::Status Set(const std::string& scope, const std::string& key, std::string value);

  // Waits up to `timeout` for `key`. Errors: NOT_FOUND (scope), DEADLINE_EXCEEDED naming
  // the key, ABORTED when the scope closes while waiting.
  absl::StatusOr<std::string> Get(const std::string& scope, const std::string& key,
                                  std::chrono::milliseconds timeout);

  // Waits up to `timeout` until all `keys` are set. Errors as for Get.
  absl::Status Wait(const std::string& scope, const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout);

  size_t ScopeCount() const;

 private:
  absl::Status WaitLocked(std::unique_lock<std::mutex>& lock, const std::string& scope,
                          const std::vector<std::string>& keys,
                          std::chrono::milliseconds timeout);
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::map<std::string, std::string>> scopes_;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_RENDEZVOUS_KV_H_
