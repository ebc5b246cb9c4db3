#include "client/job_client.h"

#include "client/cli.h"
#include "common/grpc_status.h"

namespace joule::client {
namespace {

// One unary call with the client's token and deadline.
template <typename Request, typename Response, typename Call>
absl::StatusOr<Response> Unary(const Request& request, Call call) {
  grpc::ClientContext ctx;
  PrepareContext(&ctx);
  ctx.set_deadline(RpcDeadline());
  Response response;
  if (grpc::Status s = call(&ctx, request, &response); !s.ok()) return FromGrpcStatus(s);
  return response;
}

}  // namespace

JobClient::JobClient(std::shared_ptr<v1::JobService::StubInterface> stub, std::string address)
    : stub_(std::move(stub)), address_(std::move(address)) {}

JobClient JobClient::ForCoordinator(const GlobalOptions& g) {
  const std::string address = ResolveCoordinator(g);
  return JobClient(JobStub(address), address);
}

absl::StatusOr<v1::SubmitJobResponse> JobClient::Submit(const v1::SubmitJobRequest& request) {
  return Unary<v1::SubmitJobRequest, v1::SubmitJobResponse>(
      request, [&](auto* ctx, auto& req, auto* resp) { return stub_->SubmitJob(ctx, req, resp); });
}

absl::StatusOr<v1::Job> JobClient::GetJob(int64_t id) {
  v1::GetJobRequest request;
  request.set_job_id(id);
  return Unary<v1::GetJobRequest, v1::Job>(
      request, [&](auto* ctx, auto& req, auto* resp) { return stub_->GetJob(ctx, req, resp); });
}

absl::StatusOr<v1::CancelJobResponse> JobClient::Cancel(int64_t id) {
  v1::CancelJobRequest request;
  request.set_job_id(id);
  return Unary<v1::CancelJobRequest, v1::CancelJobResponse>(
      request, [&](auto* ctx, auto& req, auto* resp) { return stub_->CancelJob(ctx, req, resp); });
}

absl::StatusOr<v1::ListJobsResponse> JobClient::ListJobs(const v1::ListJobsRequest& request) {
  return Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
      request, [&](auto* ctx, auto& req, auto* resp) { return stub_->ListJobs(ctx, req, resp); });
}

absl::StatusOr<v1::GetJobLogResponse> JobClient::GetJobLog(const v1::GetJobLogRequest& request) {
  return Unary<v1::GetJobLogRequest, v1::GetJobLogResponse>(
      request, [&](auto* ctx, auto& req, auto* resp) { return stub_->GetJobLog(ctx, req, resp); });
}

absl::StatusOr<v1::ListWorkersResponse> JobClient::ListWorkers() {
  return Unary<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      v1::ListWorkersRequest(),
      [&](auto* ctx, auto& req, auto* resp) { return stub_->ListWorkers(ctx, req, resp); });
}

int JobClient::Report(const std::string& what, const absl::Status& status) const {
  return ReportRpcError(what, address_, ToGrpcStatus(status));
}

}  // namespace joule::client
