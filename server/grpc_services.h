#ifndef JOULE_SERVER_GRPC_SERVICES_H_
#define JOULE_SERVER_GRPC_SERVICES_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
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
  grpc::Status Usage(grpc::ServerContext*, const v1::UsageRequest*, v1::UsageResponse*) override;
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

}  // namespace joule::server

#endif  // JOULE_SERVER_GRPC_SERVICES_H_
