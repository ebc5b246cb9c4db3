// The coordinator's gRPC layer, in process on an in-process channel: authentication of
// every call, worker sessions carrying assignments and results, rendezvous waits, and a
// graceful shutdown. The logic below it is tested by direct calls elsewhere.
#include "server/coordinator_server.h"
#include "server/grpc_services.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "tests/testing/temp_cleanup.h"

namespace joule::server {
namespace {

const auto* const kGrpcCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_grpc_"));

using namespace std::chrono_literals;

v1::JobSpec GrpcSpec() {
  v1::JobSpec s;
  s.set_model("logreg");
  s.set_dataset("fashion-mnist");
  s.set_workers(1);
  s.set_global_batch_size(64);
  s.set_epochs(1);
  s.mutable_optimizer()->set_lr(0.1);
  return s;
}

class GrpcServicesTest : public ::testing::Test {
 protected:
  void Start(const std::string& db = ":memory:") {
    CoordinatorServerOptions options;
    options.address = "127.0.0.1:0";
    options.coordinator.store = db;
    options.coordinator.client_tokens = {{"alice-token", "alice"}, {"bob-token", "bob"}};
    options.coordinator.join_token = "join";
    options.tls.insecure = true;
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    jobs_ = v1::JobService::NewStub(server_->InProcessChannel());
    workers_ = v1::WorkerService::NewStub(server_->InProcessChannel());
  }
  static void Bearer(grpc::ClientContext& ctx, const std::string& token) {
    ctx.AddMetadata("authorization", "Bearer " + token);
  }
  int64_t Submit(const std::string& token = "alice-token") {
    grpc::ClientContext ctx;
    Bearer(ctx, token);
    v1::SubmitJobRequest req;
    *req.mutable_spec() = GrpcSpec();
    v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->SubmitJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job_id();
  }
  v1::Job Get(int64_t id) {
    grpc::ClientContext ctx;
    Bearer(ctx, "alice-token");
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    EXPECT_TRUE(jobs_->GetJob(&ctx, req, &job).ok());
    return job;
  }
  // A worker: registered, with its session open and greeted.
  struct FakeWorker {
    std::string id;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>>
        stream;
  };
  FakeWorker Join() {
    FakeWorker w;
    grpc::ClientContext reg_ctx;
    Bearer(reg_ctx, "join");
    v1::RegisterWorkerRequest reg;
    reg.set_host("in-process");
    v1::RegisterWorkerResponse registered;
    grpc::Status s = workers_->RegisterWorker(&reg_ctx, reg, &registered);
    EXPECT_TRUE(s.ok()) << s.error_message();
    w.id = registered.worker_id();
    w.ctx = std::make_unique<grpc::ClientContext>();
    // A test that waits on the session fails at this deadline, not at ctest's timeout.
    w.ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    Bearer(*w.ctx, "join");
    w.stream = workers_->Session(w.ctx.get());
    v1::WorkerMessage hello;
    hello.set_hello_worker_id(w.id);
    EXPECT_TRUE(w.stream->Write(hello));
    return w;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::JobService::StubInterface> jobs_;
  std::unique_ptr<v1::WorkerService::StubInterface> workers_;
};

TEST_F(GrpcServicesTest, EveryCallAsksForItsToken) {
  Start();
  const int64_t id = Submit();
  for (const std::string token : {"", "wrong", "join"}) {
    grpc::ClientContext get;
    if (!token.empty()) Bearer(get, token);
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    EXPECT_EQ(jobs_->GetJob(&get, req, &job).error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << token;
    grpc::ClientContext list;
    if (!token.empty()) Bearer(list, token);
    v1::ListWorkersResponse workers;
    EXPECT_EQ(jobs_->ListWorkers(&list, {}, &workers).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  for (const std::string token : {"", "alice-token"}) {  // clients cannot join as workers
    grpc::ClientContext reg;
    if (!token.empty()) Bearer(reg, token);
    v1::RegisterWorkerResponse resp;
    EXPECT_EQ(workers_->RegisterWorker(&reg, {}, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Only the submitter cancels.
  grpc::ClientContext cancel;
  Bearer(cancel, "bob-token");
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::CancelJobResponse resp;
  EXPECT_EQ(jobs_->CancelJob(&cancel, req, &resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(GrpcServicesTest, ASessionCarriesTheAssignmentAndTheResultAndAWatchSeesTheEnd) {
  Start();
  FakeWorker w = Join();
  const int64_t id = Submit();
  v1::CoordinatorMessage m;
  ASSERT_TRUE(w.stream->Read(&m));  // blocks until the assignment comes
  ASSERT_TRUE(m.has_assignment());
  EXPECT_EQ(m.assignment().job_id(), id);
  EXPECT_EQ(m.assignment().world_size(), 1);
  EXPECT_FALSE(m.assignment().job_uid().empty());

  // A watcher sees it run, then end.
  grpc::ClientContext watch_ctx;
  Bearer(watch_ctx, "alice-token");
  v1::WatchJobRequest watch_req;
  watch_req.set_job_id(id);
  auto watch = jobs_->WatchJob(&watch_ctx, watch_req);

  v1::WorkerMessage result;
  result.mutable_result()->set_job_id(id);
  result.mutable_result()->set_attempt(m.assignment().attempt());
  result.mutable_result()->set_job_uid(m.assignment().job_uid());
  result.mutable_result()->mutable_result()->set_ok(true);
  result.mutable_result()->mutable_result()->set_steps(5);
  ASSERT_TRUE(w.stream->Write(result));

  v1::Job seen;
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  while (watch->Read(&seen)) last = seen.state();  // the stream ends once the end is stored
  EXPECT_TRUE(watch->Finish().ok());
  EXPECT_EQ(last, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Get(id).result().steps(), 5);
}

TEST_F(GrpcServicesTest, RendezvousWaitsAreBoundedAndWokenBySets) {
  Start();
  FakeWorker w = Join();
  Submit();
  v1::CoordinatorMessage m;
  ASSERT_TRUE(w.stream->Read(&m));
  const std::string scope = m.assignment().rendezvous_prefix();

  grpc::ClientContext missing;
  Bearer(missing, "join");
  v1::KvGetRequest get;
  get.set_prefix(scope);
  get.set_key("never");
  get.set_timeout_ms(50);
  v1::KvGetResponse got;
  EXPECT_EQ(workers_->KvGet(&missing, get, &got).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  // A waiter is woken by a set from another caller, without polling.
  std::thread setter([&] {
    grpc::ClientContext ctx;
    Bearer(ctx, "join");
    v1::KvWaitRequest wait;
    wait.set_prefix(scope);
    wait.add_keys("addr/0");
    wait.set_timeout_ms(30000);
    v1::KvWaitResponse waited;
    EXPECT_TRUE(workers_->KvWait(&ctx, wait, &waited).ok());
  });
  grpc::ClientContext set_ctx;
  Bearer(set_ctx, "join");
  v1::KvSetRequest set;
  set.set_prefix(scope);
  set.set_key("addr/0");
  set.set_value("127.0.0.1:1");
  v1::KvSetResponse set_resp;
  ASSERT_TRUE(workers_->KvSet(&set_ctx, set, &set_resp).ok());
  setter.join();

  grpc::ClientContext other;
  Bearer(other, "join");
  v1::KvSetRequest outside = set;
  outside.set_prefix("job/999/attempt/1");  // no such attempt
  EXPECT_EQ(workers_->KvSet(&other, outside, &set_resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(GrpcServicesTest, AShutdownLeavesTheRunningAttemptForTheNextStart) {
  const std::string db = (std::filesystem::temp_directory_path() /
                          ("joule_grpc_" + std::to_string(getpid()) + ".db")).string();
  Start(db);
  FakeWorker w = Join();
  const int64_t id = Submit();
  v1::CoordinatorMessage m;
  ASSERT_TRUE(w.stream->Read(&m));
  grpc::ClientContext watch_ctx;
  Bearer(watch_ctx, "alice-token");
  // A regression fails at the deadline (DEADLINE_EXCEEDED), not at ctest's timeout.
  watch_ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  v1::WatchJobRequest watch_req;
  watch_req.set_job_id(id);
  auto watch = jobs_->WatchJob(&watch_ctx, watch_req);
  v1::Job seen;
  ASSERT_TRUE(watch->Read(&seen));  // the watch is open
  // What SIGTERM does first: the coordinator ends the session and the watch itself, at
  // once, rather than leaving them to be cancelled at the server's shutdown deadline
  // (which made a SIGTERM take seconds: longer than `podman stop -t 5` waits).
  server_->coordinator().BeginShutdown();
  while (w.stream->Read(&m)) {
  }
  const grpc::Status session_end = w.stream->Finish();
  EXPECT_EQ(session_end.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(session_end.error_message(), Coordinator::kShuttingDown);
  while (watch->Read(&seen)) {
  }
  const grpc::Status watch_end = watch->Finish();
  EXPECT_EQ(watch_end.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(watch_end.error_message(), Coordinator::kShuttingDown);
  // The worker, back before the server stops, is refused: registered now, it would be
  // told it resumes nothing and stop its attempt.
  grpc::ClientContext reg_ctx;
  Bearer(reg_ctx, "join");
  v1::RegisterWorkerRequest reg;
  reg.set_host("in-process");
  reg.set_resume_worker_id(w.id);
  reg.set_resume_job_id(id);
  reg.set_resume_attempt(m.assignment().attempt());
  v1::RegisterWorkerResponse registered;
  const grpc::Status back = workers_->RegisterWorker(&reg_ctx, reg, &registered);
  EXPECT_EQ(back.error_code(), grpc::StatusCode::UNAVAILABLE) << back.error_message();
  server_->Shutdown();  // then the server, as SIGTERM does
  server_.reset();
  Start(db);
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.result().failed_attempts_size(), 0);
  EXPECT_NE(job.reason().find("re-queued"), std::string::npos) << job.reason();
}

// What the coordinator may expose, for every kind of address: plain text only on
// loopback; off loopback, client tokens and a way to admit workers; the web UI only on a
// loopback metrics address; --allow-unauthenticated lifts the last two, never the first.
// What the coordinator checks before it serves (CoordinatorServerOptions::Validate).
absl::Status CheckExposure(const CoordinatorOptions& coordinator, const std::string& address,
                           const std::string& metrics_address, const ServerTls& tls,
                           bool allow_unauthenticated) {
  CoordinatorServerOptions o;
  o.coordinator = coordinator;
  o.address = address;
  o.metrics_address = metrics_address;
  o.tls = tls;
  o.allow_unauthenticated = allow_unauthenticated;
  return o.Validate();
}

TEST(CoordinatorServerOptionsTest, PlainTextTokensAndTheWebUiFollowTheAddress) {
  CoordinatorOptions open;
  CoordinatorOptions guarded;
  guarded.client_tokens = {{"tester", "s3cret"}};
  guarded.join_token = "join-me";
  ServerTls plain;
  plain.insecure = true;
  ServerTls tls;
  tls.cert_file = "cert.pem";
  tls.key_file = "key.pem";
  for (const std::string loopback : {"127.0.0.1:0", "localhost:7070", "[::1]:7070"}) {
    EXPECT_TRUE(CheckExposure(open, loopback, "", plain, false).ok()) << loopback;
    EXPECT_TRUE(CheckExposure(open, loopback, "127.0.0.1:0", tls, false).ok()) << loopback;
  }
  for (const std::string off : {"0.0.0.0:7070", "198.18.0.1:7070", "[::]:7070"}) {
    absl::Status s = CheckExposure(guarded, off, "", plain, true);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << off;
    EXPECT_NE(s.message().find("--tls-cert"), std::string::npos) << s;
    s = CheckExposure(open, off, "", tls, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << off;
    EXPECT_NE(s.message().find("--client-tokens-file"), std::string::npos) << s;
    EXPECT_TRUE(CheckExposure(open, off, "", tls, true).ok()) << off;
    EXPECT_TRUE(CheckExposure(guarded, off, "", tls, false).ok()) << off;
    // Tokens for clients but nothing for workers: refused; a client CA admits them.
    CoordinatorOptions no_join = guarded;
    no_join.join_token.clear();
    EXPECT_FALSE(CheckExposure(no_join, off, "", tls, false).ok()) << off;
    ServerTls mutual = tls;
    mutual.client_ca_file = "ca.pem";
    EXPECT_TRUE(CheckExposure(no_join, off, "", mutual, false).ok()) << off;
  }
  CoordinatorOptions ui = guarded;
  ui.web_ui = true;
  EXPECT_TRUE(CheckExposure(ui, "198.18.0.1:7070", "127.0.0.1:9100", tls, false).ok());
  absl::Status s = CheckExposure(ui, "198.18.0.1:7070", "0.0.0.0:9100", tls, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--web-ui"), std::string::npos) << s;
  EXPECT_TRUE(CheckExposure(ui, "198.18.0.1:7070", "0.0.0.0:9100", tls, true).ok());
  // Metrics without the web UI may be served anywhere (Prometheus scrapes them).
  EXPECT_TRUE(CheckExposure(guarded, "198.18.0.1:7070", "0.0.0.0:9100", tls, false).ok());
}

// The coordinator's own options are validated with the rest, and Start refuses what
// Validate refuses, before it opens the job store or binds a port.
TEST(CoordinatorServerOptionsTest, StartRefusesWhatValidateRefuses) {
  CoordinatorServerOptions o;
  o.address = "127.0.0.1:0";
  o.tls.insecure = true;
  o.coordinator.heartbeat_timeout = std::chrono::milliseconds(1000);  // not > 2 intervals
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  auto refused = CoordinatorServer::Start(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  o.coordinator.heartbeat_timeout = std::chrono::milliseconds(10000);
  o.address = "198.18.0.1:0";  // plain text off loopback
  refused = CoordinatorServer::Start(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("--tls-cert"), std::string::npos);
}

}  // namespace
}  // namespace joule::server
