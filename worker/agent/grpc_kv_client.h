#ifndef JOULE_WORKER_AGENT_GRPC_KV_CLIENT_H_
#define JOULE_WORKER_AGENT_GRPC_KV_CLIENT_H_

#include <memory>
#include <string>

#include "joule/v1/worker.grpc.pb.h"
#include "worker/comm/kv_client.h"

namespace joule::worker {

// KvClient over the coordinator's KvSet/KvGet/KvWait RPCs, scoped to one attempt's
// rendezvous prefix. Thread-safe (gRPC stubs are).
class GrpcKvClient final : public KvClient {
 public:
  GrpcKvClient(std::shared_ptr<v1::WorkerService::StubInterface> stub, std::string prefix,
               std::string token = "")
      : stub_(std::move(stub)), prefix_(std::move(prefix)), token_(std::move(token)) {}
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override;

 private:
  std::shared_ptr<v1::WorkerService::StubInterface> stub_;
  std::string prefix_;
  std::string token_;  // the join token
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_AGENT_GRPC_KV_CLIENT_H_
