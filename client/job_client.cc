#include "client/job_client.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "common/grpc_status.h"

namespace joule::client {

JobClient::JobClient(std::shared_ptr<v1::JobService::StubInterface> stub, std::string address)
    : stubs_{std::move(stub)}, addresses_{std::move(address)} {}

JobClient::JobClient(std::vector<std::shared_ptr<v1::JobService::StubInterface>> stubs,
                     std::vector<std::string> addresses)
    : stubs_(std::move(stubs)), addresses_(std::move(addresses)) {}

JobClient JobClient::ForCoordinator(const GlobalOptions& g) {
  std::vector<std::shared_ptr<v1::JobService::StubInterface>> stubs;
  std::vector<std::string> addresses;
  for (absl::string_view a : absl::StrSplit(ResolveCoordinator(g), ',')) {
    const std::string address(absl::StripAsciiWhitespace(a));
    if (address.empty()) continue;
    stubs.push_back(JobStub(address));
    addresses.push_back(address);
  }
  if (addresses.empty()) return JobClient(JobStub("127.0.0.1:7070"), "127.0.0.1:7070");
  return JobClient(std::move(stubs), std::move(addresses));
}

template <typename Response, typename Call>
absl::StatusOr<Response> JobClient::Unary(Call call) {
  absl::Status best;  // a leader's or an unreachable coordinator's error before a standby's
  bool best_from_standby = true;
  std::vector<bool> tried(stubs_.size(), false);
  size_t at = current_.load();
  for (;;) {
    tried[at] = true;
    grpc::ClientContext ctx;
    PrepareContext(&ctx);
    ctx.set_deadline(RpcDeadline());
    Response response;
    const grpc::Status s = call(*stubs_[at], &ctx, &response);
    if (s.ok()) {
      current_ = at;
      return response;
    }
    const auto& trailers = ctx.GetServerTrailingMetadata();
    const auto leader = trailers.find("joule-leader");
    const bool standby = leader != trailers.end();
    if (best.ok() || (best_from_standby && !standby)) {
      best = FromGrpcStatus(s);
      best_from_standby = standby;
    }
    const bool elsewhere =
        s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && stubs_.size() > 1);
    if (!elsewhere) {
      current_ = at;
      return FromGrpcStatus(s);
    }
    // The leader a standby named, if it is one of ours and not tried yet; else the next.
    size_t next = at;
    if (standby) {
      const std::string named(leader->second.data(), leader->second.size());
      for (size_t i = 0; i < addresses_.size(); ++i) {
        if (addresses_[i] == named && !tried[i]) next = i;
      }
    }
    for (size_t k = 1; k < stubs_.size() && next == at; ++k) {
      if (!tried[(at + k) % stubs_.size()]) next = (at + k) % stubs_.size();
    }
    if (next == at) return best;  // every address tried
    at = next;
    current_ = at;
  }
}

absl::StatusOr<v1::SubmitJobResponse> JobClient::Submit(const v1::SubmitJobRequest& given) {
  v1::SubmitJobRequest request = given;
  if (request.request_id().empty()) {
    std::random_device rd;
    request.set_request_id(absl::StrFormat("auto-%08x%08x%08x%08x", rd(), rd(), rd(), rd()));
  }
  return Unary<v1::SubmitJobResponse>(
      [&](v1::JobService::StubInterface& stub, grpc::ClientContext* ctx,
          v1::SubmitJobResponse* resp) { return stub.SubmitJob(ctx, request, resp); });
}

absl::StatusOr<v1::Job> JobClient::GetJob(int64_t id) {
  v1::GetJobRequest request;
  request.set_job_id(id);
  return Unary<v1::Job>([&](v1::JobService::StubInterface& stub, grpc::ClientContext* ctx,
                            v1::Job* resp) { return stub.GetJob(ctx, request, resp); });
}

absl::StatusOr<v1::CancelJobResponse> JobClient::Cancel(int64_t id) {
  v1::CancelJobRequest request;
  request.set_job_id(id);
  return Unary<v1::CancelJobResponse>(
      [&](v1::JobService::StubInterface& stub, grpc::ClientContext* ctx,
          v1::CancelJobResponse* resp) { return stub.CancelJob(ctx, request, resp); });
}

absl::StatusOr<v1::ListJobsResponse> JobClient::ListJobs(const v1::ListJobsRequest& request) {
  return Unary<v1::ListJobsResponse>(
      [&](v1::JobService::StubInterface& stub, grpc::ClientContext* ctx,
          v1::ListJobsResponse* resp) { return stub.ListJobs(ctx, request, resp); });
}

absl::StatusOr<v1::UsageResponse> JobClient::Usage(const v1::UsageRequest& request) {
  return Unary<v1::UsageResponse>(
      [&](v1::JobService::StubInterface& stub, grpc::ClientContext* ctx, v1::UsageResponse* resp) {
        return stub.Usage(ctx, request, resp);
      });
}

absl::StatusOr<v1::GetJobLogResponse> JobClient::GetJobLog(const v1::GetJobLogRequest& request) {
  return Unary<v1::GetJobLogResponse>(
      [&](v1::JobService::StubInterface& stub, grpc::ClientContext* ctx,
          v1::GetJobLogResponse* resp) { return stub.GetJobLog(ctx, request, resp); });
}

absl::StatusOr<v1::ListWorkersResponse> JobClient::ListWorkers() {
  return Unary<v1::ListWorkersResponse>([&](v1::JobService::StubInterface& stub,
                                            grpc::ClientContext* ctx,
                                            v1::ListWorkersResponse* resp) {
    return stub.ListWorkers(ctx, v1::ListWorkersRequest(), resp);
  });
}

int JobClient::Report(const std::string& what, const absl::Status& status) const {
  return ReportRpcError(what, address(), ToGrpcStatus(status));
}

}  // namespace joule::client
