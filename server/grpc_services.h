#ifndef JOULE_SERVER_GRPC_SERVICES_H_
#define JOULE_SERVER_GRPC_SERVICES_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "common/http_server.h"
#include "common/security.h"
#include "joule/v1/job.grpc.pb.h"
#include "joule/v1/worker.grpc.pb.h"
#include "server/coordinator.h"

namespace joule::server {

// Thin gRPC adapters over Coordinator: unpack, call, convert the status. Thread-safe as
// the Coordinator is; they own nothing.
class JobServiceImpl final : public v1::JobService::Service {
 public:
  // `tokens`: accepted bearer tokens -> client name; empty: no authentication.
  JobServiceImpl(Coordinator* coordinator, std::map<std::string, std::string> tokens)
      : c_(coordinator), tokens_(std::move(tokens)) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*,
                         v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override;
  grpc::Status GetJobLog(grpc::ServerContext*, const v1::GetJobLogRequest*,
                         v1::GetJobLogResponse*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*,
                         v1::CancelJobResponse*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::Job>*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse*) override;

 private:
  Coordinator* c_;
  const std::map<std::string, std::string> tokens_;
};

// Session is served with gRPC's callback API (a reactor per stream, no thread per worker):
// a coordinator holds a session for every worker, and 1,000 idle sessions must cost next
// to nothing. The unary methods stay synchronous.
class WorkerServiceImpl final
    : public v1::WorkerService::WithCallbackMethod_Session<v1::WorkerService::Service> {
 public:
  // `tokens`: the join token -> "worker"; empty: no authentication.
  WorkerServiceImpl(Coordinator* coordinator, std::map<std::string, std::string> tokens)
      : c_(coordinator), tokens_(std::move(tokens)) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override;
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::Status KvSet(grpc::ServerContext*, const v1::KvSetRequest*, v1::KvSetResponse*) override;
  grpc::Status KvGet(grpc::ServerContext*, const v1::KvGetRequest*, v1::KvGetResponse*) override;
  grpc::Status KvWait(grpc::ServerContext*, const v1::KvWaitRequest*,
                      v1::KvWaitResponse*) override;

 private:
  Coordinator* c_;
  const std::map<std::string, std::string> tokens_;
};

// The coordinator's rules for what it may expose, checked before it starts serving:
// plain text (tls.insecure) only on a loopback `address`; off loopback, client tokens and a
// way to admit workers (a join token or a client CA) unless `allow_unauthenticated`; the
// web UI (every job's spec, log and workers over plain HTTP) only on a loopback
// `metrics_address` unless `allow_unauthenticated`. Errors: INVALID_ARGUMENT naming the
// flag that fixes it. Pure; thread-safe.
absl::Status CheckExposure(const CoordinatorOptions& options, const std::string& address,
                           const std::string& metrics_address, const ServerTls& tls,
                           bool allow_unauthenticated);

// A running coordinator: the Coordinator plus a gRPC server bound to `address`
// ("127.0.0.1:0" picks a free port). Owns both; Shutdown() (or the destructor) stops the
// server and ends every stream. Thread-safe.
class CoordinatorServer {
 public:
  // Errors: UNAVAILABLE when the address cannot be bound; those of Coordinator::Create.
  // `metrics_address`: where /metrics and /http_sd are served ("127.0.0.1:0" picks a
  // free port; empty: not served).
  // `tls`: the server's TLS (plain text only with tls.insecure on loopback).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      CoordinatorOptions options, const std::string& address,
      const std::string& metrics_address, const ServerTls& tls);
  ~CoordinatorServer();
  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }
  // "host:port" of the metrics endpoint, or empty.
  std::string metrics_address() const { return http_ ? http_->address() : ""; }
  Coordinator& coordinator() { return *coordinator_; }
  // A channel to this server inside the process (no socket): for tests and embedders.
  std::shared_ptr<grpc::Channel> InProcessChannel() {
    return server_->InProcessChannel(grpc::ChannelArguments());
  }
  void Wait() { server_->Wait(); }
  void Shutdown();

 private:
  CoordinatorServer() = default;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobServiceImpl> jobs_;
  std::unique_ptr<WorkerServiceImpl> workers_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::string address_;
  std::once_flag shutdown_once_;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_GRPC_SERVICES_H_
