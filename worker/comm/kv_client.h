#ifndef JOULE_WORKER_COMM_KV_CLIENT_H_
#define JOULE_WORKER_COMM_KV_CLIENT_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace joule::worker {

// A rendezvous key-value store scoped to one job attempt: in production the
// coordinator's KV RPCs (agent/grpc_kv_client.h); in tests the in-process
// server::RendezvousKv. Thread-safe.
class KvClient {
 public:
  virtual ~KvClient() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for the key. Errors: DEADLINE_EXCEEDED naming the key.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          std::chrono::milliseconds timeout) = 0;
  virtual absl::Status Wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) = 0;
};

// Every rank's `value` under `name`, in rank order: sets "NAME/RANK" to `value`, then
// reads "NAME/0" .. "NAME/(size-1)", waiting up to `timeout` for each. Every rank of the
// attempt must call it with the same name, once (keys are never overwritten). Errors:
// Set's, and Get's (DEADLINE_EXCEEDED naming the key of a rank that never set it).
absl::StatusOr<std::vector<std::string>> KvAllgather(KvClient& kv, const std::string& name,
                                                     int rank, int size, const std::string& value,
                                                     std::chrono::milliseconds timeout);

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_KV_CLIENT_H_
