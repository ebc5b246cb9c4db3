#include "server/grpc_services.h"

#include <spdlog/spdlog.h>


#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/names.h"
#include "common/security.h"

namespace joule::server {
namespace {

constexpr std::chrono::milliseconds kMaxKvWait{300000};

std::chrono::milliseconds ClampWait(int32_t ms) {
  return std::min(std::chrono::milliseconds(std::max(ms, 0)), kMaxKvWait);
}

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  absl::StatusOr<std::string> client = Authenticate(*ctx, tokens_);
  if (!client.ok()) return ToGrpcStatus(client.status());
  bool existing = false;
  absl::StatusOr<int64_t> id = c_->Submit(req->spec(), req->request_id(), &existing, *client);
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_job_id(*id);
  resp->set_existing(existing);
  std::string warning = c_->CapacityWarning(req->spec());
  if (req->spec().carbon_aware()) {
    // A carbon-aware job that cannot wait for a greener start says why (no forecast, one
    // that does not cover its run, no slack before its deadline).
    if (absl::StatusOr<v1::Job> job = c_->GetJob(*id);
        job.ok() && !job->carbon_plan().note().empty()) {
      absl::StrAppend(&warning, warning.empty() ? "" : "; ",
                      "carbon-aware, but it starts without waiting: ", job->carbon_plan().note());
    }
  }
  resp->set_warning(warning);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJobLog(grpc::ServerContext* ctx,
                                      const v1::GetJobLogRequest* req,
                                      v1::GetJobLogResponse* resp) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  absl::StatusOr<v1::GetJobLogResponse> log = c_->GetJobLog(*req);
  if (!log.ok()) return ToGrpcStatus(log.status());
  *resp = *std::move(log);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                    v1::Job* resp) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  absl::StatusOr<v1::Job> job = c_->GetJob(req->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Usage(grpc::ServerContext* ctx, const v1::UsageRequest* req,
                                   v1::UsageResponse* resp) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  absl::StatusOr<v1::UsageResponse> r = c_->Usage(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  absl::StatusOr<v1::ListJobsResponse> r = c_->ListJobs(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                                       v1::CancelJobResponse* resp) {
  absl::StatusOr<std::string> client = Authenticate(*ctx, tokens_);
  if (!client.ok()) return ToGrpcStatus(client.status());
  absl::StatusOr<v1::Job> job = c_->CancelJob(req->job_id(), *client);
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::Job>* writer) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  v1::Job last;
  while (!ctx->IsCancelled()) {
    bool final = false;
    absl::StatusOr<v1::Job> job = c_->WaitForJobChange(
        req->job_id(), &last, std::chrono::steady_clock::now() + std::chrono::seconds(1), &final);
    if (!job.ok()) return ToGrpcStatus(job.status());
    if (!writer->Write(*job)) break;
    if (final) break;  // ended, and the end is stored: no crash can undo it
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* resp) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  for (v1::WorkerInfo& w : c_->ListWorkers()) *resp->add_workers() = std::move(w);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                               const v1::RegisterWorkerRequest* req,
                                               v1::RegisterWorkerResponse* resp) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  absl::StatusOr<v1::RegisterWorkerResponse> r = c_->RegisterWorker(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

namespace {

class SessionReactor;

// The coordinator's handle on one session. The coordinator may keep it after the stream
// is gone: Send and Close then do nothing.
class ReactorSink final : public SessionSink {
 public:
  explicit ReactorSink(SessionReactor* reactor) : reactor_(reactor) {}
  void Send(const v1::CoordinatorMessage& message) override;
  void Close(std::string_view why) override;
  // Called by the reactor when the stream is done.
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
  }

 private:
  std::mutex mu_;  // held while calling into the reactor, so it cannot be deleted meanwhile
  SessionReactor* reactor_;
};

// One worker's session stream: reads hello, then heartbeats, progress and results, and
// writes assignments and cancels from a queue. Deletes itself when the stream is done.
class SessionReactor final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  SessionReactor(Coordinator* c, const std::map<std::string, std::string>& tokens,
                 grpc::CallbackServerContext* ctx)
      : c_(c), sink_(std::make_shared<ReactorSink>(this)) {
    if (absl::Status a = Authenticate(*ctx, tokens).status(); !a.ok()) {
      Finish(ToGrpcStatus(a));
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      End(grpc::Status::OK);
      return;
    }
    if (worker_id_.empty()) {
      if (in_.kind_case() != v1::WorkerMessage::kHelloWorkerId) {
        End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "the first session message must be hello_worker_id"));
        return;
      }
      if (absl::Status s = c_->OpenSession(in_.hello_worker_id(), sink_); !s.ok()) {
        End(ToGrpcStatus(s));
        return;
      }
      worker_id_ = in_.hello_worker_id();
    } else {
      c_->OnWorkerMessage(worker_id_, in_);
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok || finished_) return;
    out_.pop_front();
    WriteNextLocked();
  }

  void OnDone() override {
    sink_->Detach();
    if (!worker_id_.empty()) c_->CloseSession(worker_id_, sink_.get(), "session stream ended");
    delete this;
  }

  void Enqueue(const v1::CoordinatorMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    out_.push_back(m);
    WriteNextLocked();
  }

  // The coordinator ends the session (the worker was declared lost).
  void End(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

 private:
  void WriteNextLocked() {
    if (writing_ || out_.empty()) return;
    writing_ = true;
    StartWrite(&out_.front());
  }

  Coordinator* c_;
  std::shared_ptr<ReactorSink> sink_;
  v1::WorkerMessage in_;
  std::string worker_id_;  // set by hello; read only on the reactor's read path and OnDone
  std::mutex mu_;          // guards the write queue and finished_
  std::deque<v1::CoordinatorMessage> out_;
  bool writing_ = false;
  bool finished_ = false;
};

void ReactorSink::Send(const v1::CoordinatorMessage& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reactor_) reactor_->Enqueue(message);
}

void ReactorSink::Close(std::string_view why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reactor_) reactor_->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(why)));
}

}  // namespace

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* WorkerServiceImpl::Session(
    grpc::CallbackServerContext* ctx) {
  return new SessionReactor(c_, tokens_, ctx);
}

grpc::Status WorkerServiceImpl::KvSet(grpc::ServerContext* ctx, const v1::KvSetRequest* req,
                                      v1::KvSetResponse*) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  return ToGrpcStatus(c_->kv().Set(req->prefix(), req->key(), req->value()));
}

grpc::Status WorkerServiceImpl::KvGet(grpc::ServerContext* ctx, const v1::KvGetRequest* req,
                                      v1::KvGetResponse* resp) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  absl::StatusOr<std::string> v =
      c_->kv().Get(req->prefix(), req->key(), ClampWait(req->timeout_ms()));
  if (!v.ok()) return ToGrpcStatus(v.status());
  resp->set_value(*std::move(v));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::KvWait(grpc::ServerContext* ctx, const v1::KvWaitRequest* req,
                                       v1::KvWaitResponse*) {
  if (absl::Status a = Authenticate(*ctx, tokens_).status(); !a.ok()) return ToGrpcStatus(a);
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  return ToGrpcStatus(c_->kv().Wait(req->prefix(), keys, ClampWait(req->timeout_ms())));
}

}  // namespace joule::server
