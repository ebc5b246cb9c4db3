// The worker's session against a real coordinator in this process (an in-process channel),
// its attempt a fake: registration as the worker said, a superseded leader refused, the
// coordinator's data roots handed to the attempt with its assignment, heartbeats that carry the
// attempt's phase, cancels that reach it, a busy answer the coordinator hears, and a Stop that ends
// Run.
#include "worker/agent/session.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/liveness_datagram.h"
#include "server/coordinator_server.h"
#include "server/liveness_listener.h"
#include "tests/testing/specs.h"
#include "worker/agent/job_log.h"
#include "worker/agent/liveness_sender.h"

namespace joule::worker {
namespace {

using namespace std::chrono_literals;

// An attempt that runs only as the test says: Start records the assignment (or refuses,
// when told to), Apply records the cancel, and the test sends the result itself.
class FakeAttempt final : public AttemptControl {
 public:
  absl::Status Start(const v1::Assignment& a, std::vector<std::string> roots) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (refuse_) return absl::FailedPreconditionError("still busy with job 99 attempt 1");
    assignments_.push_back(a);
    roots_ = std::move(roots);
    job_id_ = a.job_id();
    attempt_ = a.attempt();
    active_ = true;
    cv_.notify_all();
    return absl::OkStatus();
  }
  bool Apply(const v1::CancelAttempt& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(c);
    cv_.notify_all();
    return true;
  }
  void Cancel() override { cancelled_ = true; }
  void Join() override { ++joins_; }
  bool active() const override { return active_; }
  int64_t job_id() const override { return job_id_; }
  int32_t attempt() const override { return attempt_; }
  v1::RankPhase phase() const override { return phase_; }

  // Waits up to 60 s for `done()`, under the lock.
  bool WaitFor(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 60s, done);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> refuse_{false};
  std::vector<v1::Assignment> assignments_;
  std::vector<v1::CancelAttempt> cancels_;
  std::vector<std::string> roots_;
  std::atomic<bool> active_{false}, cancelled_{false};
  std::atomic<int> joins_{0};
  std::atomic<int64_t> job_id_{0};
  std::atomic<int32_t> attempt_{0};
  std::atomic<v1::RankPhase> phase_{v1::RANK_PHASE_UNSPECIFIED};
};

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::CoordinatorServerOptions options;
    options.address = "127.0.0.1:0";
    options.coordinator.join_token = "join";
    options.coordinator.heartbeat_interval = 100ms;
    // The worker abandons a session silent for a third of this: long enough for a loaded
    // machine.
    options.coordinator.heartbeat_timeout = 15000ms;
    options.coordinator.data_roots = {"/usr/share/datasets", "/srv/data"};
    options.tls.insecure = true;
    auto server = server::CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    SessionOptions session;
    session.coordinator = "in-process";
    session.join_token = "join";
    session.registration.set_host("session-under-test");
    session.registration.set_device_kind(v1::DEVICE_KIND_CPU);
    session.registration.set_cores(2);
    session.registration.set_pid(4242);
    session_ = std::make_unique<CoordinatorSession>(
        session, v1::WorkerService::NewStub(server_->InProcessChannel()), nullptr, nullptr);
    session_->set_attempts(&attempt_);
    run_ = std::thread([this] { session_->Run(); });
  }
  void TearDown() override {
    if (session_) session_->Stop();
    if (run_.joinable()) run_.join();
  }
  server::Coordinator& c() { return server_->coordinator(); }
  int64_t Submit() {
    bool existing;
    absl::StatusOr<int64_t> id = c().Submit(testing::SmallMlpSpec(1), "", &existing);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }
  // Waits up to 60 s for the job to satisfy `done`.
  v1::Job WaitJob(int64_t id, const std::function<bool(const v1::Job&)>& done) {
    v1::Job job;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto changed = c().WaitForJobChange(id, &job, deadline);
      if (!changed.ok()) {
        ADD_FAILURE() << changed.status();
        return job;
      }
      if (done(*changed)) return *changed;
    }
    ADD_FAILURE() << "job " << id << " never got there: " << job.ShortDebugString();
    return job;
  }

  std::unique_ptr<server::CoordinatorServer> server_;
  FakeAttempt attempt_;
  std::unique_ptr<CoordinatorSession> session_;
  std::thread run_;
};

TEST_F(SessionTest, RegistersAsTheWorkerSaysAndHandsTheAssignmentWithTheCoordinatorsRoots) {
  const int64_t id = Submit();
  ASSERT_TRUE(attempt_.WaitFor([&] { return !attempt_.assignments_.empty(); }));
  {
    std::lock_guard<std::mutex> lock(attempt_.mu_);
    EXPECT_EQ(attempt_.assignments_[0].job_id(), id);
    EXPECT_EQ(attempt_.roots_, (std::vector<std::string>{"/usr/share/datasets", "/srv/data"}));
  }
  const std::vector<v1::WorkerInfo> workers = c().ListWorkers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].host(), "session-under-test");
  EXPECT_EQ(workers[0].pid(), 4242);
  EXPECT_GT(workers[0].memory_bytes(), 0);  // MemAvailable, read at registration
}

TEST_F(SessionTest, HeartbeatsCarryTheAttemptsPhaseToTheJob) {
  const int64_t id = Submit();
  ASSERT_TRUE(attempt_.WaitFor([&] { return !attempt_.assignments_.empty(); }));
  attempt_.phase_ = v1::RANK_PHASE_EVALUATION;
  WaitJob(id, [](const v1::Job& j) { return j.progress().phase() == v1::JOB_PHASE_EVALUATION; });
  attempt_.phase_ = v1::RANK_PHASE_BACKWARD;
  WaitJob(id, [](const v1::Job& j) { return j.progress().phase() == v1::JOB_PHASE_TRAINING; });
}

TEST_F(SessionTest, TheCoordinatorsCancelReachesTheAttemptAndItsResultEndsTheJob) {
  const int64_t id = Submit();
  ASSERT_TRUE(attempt_.WaitFor([&] { return !attempt_.assignments_.empty(); }));
  // Cancel waits until the cancel is stored; the stop goes to the worker meanwhile.
  ASSERT_TRUE(c().CancelJob(id).ok());
  ASSERT_TRUE(attempt_.WaitFor([&] { return !attempt_.cancels_.empty(); }));
  {
    std::lock_guard<std::mutex> lock(attempt_.mu_);
    EXPECT_EQ(attempt_.cancels_[0].job_id(), id);
    EXPECT_EQ(attempt_.cancels_[0].attempt(), 1);
  }
  // The attempt's result, as the runner would send it: the worker is idle again.
  v1::WorkerMessage m;
  m.mutable_result()->set_job_id(id);
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->mutable_result()->set_cancelled(true);
  m.mutable_result()->mutable_result()->set_error("cancelled");
  attempt_.active_ = false;
  session_->SendResult(m);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto idle = [&] {
    const std::vector<v1::WorkerInfo> w = c().ListWorkers();
    return w.size() == 1 && w[0].state() == v1::WORKER_STATE_IDLE;
  };
  while (std::chrono::steady_clock::now() < deadline && !idle()) {
    std::this_thread::sleep_for(10ms);  // no change of the worker's to wait on: polled
  }
  EXPECT_TRUE(idle());
}

TEST_F(SessionTest, ABusyAttemptsRefusalReachesTheCoordinatorAsAFailedRank) {
  attempt_.refuse_ = true;
  const int64_t id = Submit();
  const v1::Job job = WaitJob(
      id, [](const v1::Job& j) { return j.reason().find("still busy") != std::string::npos; });
  EXPECT_NE(job.reason().find("is still busy with job 99 attempt 1"), std::string::npos)
      << job.reason();
}

TEST_F(SessionTest, StopEndsRunAndJoinsTheAttempt) {
  Submit();
  ASSERT_TRUE(attempt_.WaitFor([&] { return !attempt_.assignments_.empty(); }));
  session_->Stop();
  run_.join();
  EXPECT_TRUE(attempt_.cancelled_);
  EXPECT_GE(attempt_.joins_, 1);
  session_.reset();
}

// A coordinator that answers every registration with leader epoch `epoch` whatever the
// worker says it was given (an older leader that does not check, or a hostile one), and
// records what the worker said; its session stream is never opened by a worker that
// refuses it.
// With `reset`, it says its store confirmed its lease after the worker's claim
// (RegisterWorkerResponse.epoch_reset: a restored store).
class StaleLeader final : public v1::WorkerService::Service {
 public:
  explicit StaleLeader(int64_t epoch, bool reset = false) : epoch_(epoch), reset_(reset) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      seen_epochs.push_back(req->leader_epoch_seen());
    }
    resp->set_worker_id("w1.stale");
    resp->set_heartbeat_interval_ms(100);
    resp->set_heartbeat_timeout_ms(15000);
    resp->set_leader_epoch(epoch_);
    resp->set_epoch_reset(reset_ && req->leader_epoch_seen() > epoch_);
    return grpc::Status::OK;
  }
  grpc::Status Session(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*) override {
    ++sessions;
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "a stale leader");
  }
  std::mutex mu;
  std::vector<int64_t> seen_epochs;  // guarded by mu
  std::atomic<int> sessions{0};

 private:
  const int64_t epoch_;
  const bool reset_;
};

std::unique_ptr<server::CoordinatorServer> LeaderAt(int64_t epoch) {
  server::CoordinatorServerOptions options;
  options.address = "127.0.0.1:0";
  options.coordinator.join_token = "join";
  options.coordinator.heartbeat_interval = 100ms;
  options.coordinator.heartbeat_timeout = 15000ms;
  options.coordinator.lease_epoch = epoch;  // no writes here: registration writes nothing
  options.tls.insecure = true;
  auto server = server::CoordinatorServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Polls `done` for up to 60 s (registrations change nothing a test can wait on).
bool Eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// A worker that registered with a leader of epoch 5 (later stopped) and then meets `stale`
// (and, if it moves on, a leader of epoch 6), in the order its channel factory gives them.
// Runs `check` while the session runs.
void MeetLeaders(StaleLeader& stale, FakeAttempt& attempt,
                 const std::function<void(server::CoordinatorServer& third)>& check) {
  std::unique_ptr<server::CoordinatorServer> first = LeaderAt(5), third = LeaderAt(6);
  ASSERT_TRUE(first && third);
  grpc::ServerBuilder builder;
  int stale_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &stale_port);
  builder.RegisterService(&stale);
  std::unique_ptr<grpc::Server> stale_server = builder.BuildAndStart();
  ASSERT_NE(stale_server, nullptr);
  // Over loopback TCP, not in-process channels: the first coordinator is stopped while the
  // worker still calls it (an in-process channel to a stopped server is not allowed).
  auto tcp = [](const std::string& address) {
    return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  };
  std::vector<std::shared_ptr<grpc::Channel>> channels = {
      tcp(first->address()), tcp("127.0.0.1:" + std::to_string(stale_port)), tcp(third->address())};
  std::atomic<size_t> next{1};
  SessionOptions options;
  options.coordinator = "first,stale,third";  // several: a failed try moves on
  options.join_token = "join";
  options.registration.set_host("fenced-worker");
  options.registration.set_pid(4243);
  options.reconnect_backoff = 50ms;
  CoordinatorSession session(
      options, v1::WorkerService::NewStub(channels[0]),
      [&] { return channels[std::min<size_t>(next++, 2)]; }, channels[0]);
  session.set_attempts(&attempt);
  std::thread run([&] { session.Run(); });
  EXPECT_TRUE(Eventually([&] { return first->coordinator().ListWorkers().size() == 1; }));
  first->Shutdown();  // the session ends; the worker tries the next coordinators
  first->Wait();
  check(*third);
  session.Stop();
  run.join();
  stale_server->Shutdown();
}

// A leader older than the worker's newest epoch is left before any session: nothing it
// could assign reaches the worker, which goes on to the newer one.
TEST(SessionFencingTest, AWorkerRefusesALeaderOlderThanOneItWasGiven) {
  StaleLeader stale(3);
  FakeAttempt attempt;
  MeetLeaders(stale, attempt, [](server::CoordinatorServer& third) {
    EXPECT_TRUE(Eventually([&] { return third.coordinator().ListWorkers().size() == 1; }));
  });
  std::lock_guard<std::mutex> lock(stale.mu);
  ASSERT_FALSE(stale.seen_epochs.empty());
  EXPECT_EQ(stale.seen_epochs[0], 5);  // it heard the worker's newest epoch
  EXPECT_EQ(stale.sessions, 0);
  EXPECT_TRUE(attempt.assignments_.empty());
}

// One whose store confirmed its lease after the worker's claim (a restored store) is
// taken: the worker opens its session and from then on counts from that epoch.
TEST(SessionFencingTest, AWorkerTakesAnOlderEpochWhenTheStoreWasReset) {
  StaleLeader restored(3, /*reset=*/true);
  FakeAttempt attempt;
  MeetLeaders(restored, attempt, [&](server::CoordinatorServer& third) {
    EXPECT_TRUE(Eventually([&] {
      std::lock_guard<std::mutex> lock(restored.mu);
      return restored.sessions > 0 && restored.seen_epochs.size() >= 2;
    }));
    EXPECT_TRUE(third.coordinator().ListWorkers().empty());
  });
  std::lock_guard<std::mutex> lock(restored.mu);
  EXPECT_EQ(restored.seen_epochs[0], 5);
  EXPECT_EQ(restored.seen_epochs[1], 3);  // the epoch it took
}

// A coordinator that acknowledges each heartbeat with the interval `interval_for(n)` (n: the
// heartbeats heard so far), and records when each heartbeat arrived.
class PacingCoordinator final : public v1::WorkerService::Service {
 public:
  // `timeout_ms`: the heartbeat timeout it gives (intervals up to a quarter of it).
  explicit PacingCoordinator(std::function<int32_t(int)> interval_for, int32_t timeout_ms = 4000)
      : interval_for_(std::move(interval_for)), timeout_ms_(timeout_ms) {}
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* resp) override {
    resp->set_worker_id("w1.paced");
    resp->set_heartbeat_interval_ms(100);
    resp->set_heartbeat_timeout_ms(timeout_ms_);
    resp->set_liveness_port(liveness_port);
    resp->set_liveness_key(liveness_key);
    ++registrations;
    return grpc::Status::OK;
  }
  grpc::Status Session(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    v1::WorkerMessage in;
    while (stream->Read(&in)) {
      if (in.has_log()) {
        std::lock_guard<std::mutex> lock(mu);
        for (const v1::LogLine& l : in.log().lines()) {
          logged.push_back({l.text(), static_cast<int>(arrivals.size())});
        }
      }
      if (!in.has_heartbeat()) continue;
      int n;
      {
        std::lock_guard<std::mutex> lock(mu);
        arrivals.push_back(std::chrono::steady_clock::now());
        n = static_cast<int>(arrivals.size());
      }
      v1::CoordinatorMessage ack;
      ack.mutable_heartbeat_ack()->set_unix_ms(1);
      ack.mutable_heartbeat_ack()->set_heartbeat_interval_ms(interval_for_(n));
      if (!stream->Write(ack)) break;
    }
    return grpc::Status::OK;
  }
  // Heartbeats over UDP offered at registration (0: none), and registrations seen.
  int liveness_port = 0;
  std::string liveness_key;
  std::atomic<int> registrations{0};
  std::mutex mu;
  std::vector<std::chrono::steady_clock::time_point> arrivals;  // guarded by mu
  // Each log line received, with the heartbeats heard before it; guarded by mu.
  std::vector<std::pair<std::string, int>> logged;

 private:
  const std::function<int32_t(int)> interval_for_;
  const int32_t timeout_ms_;
};

// An idle worker in session with `coordinator`, served over loopback TCP, until Stop.
class PacedWorker {
 public:
  explicit PacedWorker(PacingCoordinator& coordinator) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&coordinator);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                       grpc::InsecureChannelCredentials());
    SessionOptions options;
    options.coordinator = "paced";
    options.registration.set_host("paced-worker");
    session_ = std::make_unique<CoordinatorSession>(options, v1::WorkerService::NewStub(channel),
                                                    nullptr, channel);
    session_->set_attempts(&attempt_);
    run_ = std::thread([this] { session_->Run(); });
  }
  ~PacedWorker() { Stop(); }
  void Stop() {
    if (!run_.joinable()) return;
    session_->Stop();
    run_.join();
    if (server_) server_->Shutdown();
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  FakeAttempt attempt_;
  std::unique_ptr<CoordinatorSession> session_;
  std::thread run_;
};

// The worker heartbeats at the interval of the coordinator's latest ack (it grows with the
// cluster), kept within [100 ms, a quarter of the heartbeat timeout] whatever it says, and a
// longer interval does not make the worker take the coordinator's silence for a lost link.
TEST(SessionPacingTest, HeartbeatsFollowTheAcksIntervalWithinBounds) {
  // Heartbeats 1-4 acked with 100 ms, 5-7 with 600 ms, then 60 s (kept to 1 s).
  PacingCoordinator coordinator([](int n) { return n <= 4 ? 100 : n <= 7 ? 600 : 60000; });
  PacedWorker worker(coordinator);
  EXPECT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(coordinator.mu);
    return coordinator.arrivals.size() >= 11;
  }));
  worker.Stop();
  std::lock_guard<std::mutex> lock(coordinator.mu);
  ASSERT_GE(coordinator.arrivals.size(), 11u);
  auto gap_ms = [&](size_t i) {  // between heartbeat i and i + 1 (1-based)
    return std::chrono::duration<double, std::milli>(coordinator.arrivals[i] -
                                                     coordinator.arrivals[i - 1])
        .count();
  };
  for (size_t i = 1; i <= 3; ++i) EXPECT_LT(gap_ms(i), 450) << "heartbeat " << i;
  // The ack of heartbeat 5 arrives while the worker already waits 100 ms for 6.
  for (size_t i = 6; i <= 7; ++i) EXPECT_GE(gap_ms(i), 550) << "heartbeat " << i;
  for (size_t i = 9; i <= 10; ++i) {
    EXPECT_GE(gap_ms(i), 950) << "heartbeat " << i;
    EXPECT_LT(gap_ms(i), 3000) << "heartbeat " << i;  // not 60 s
  }
}

// Spread heartbeats do not hold back the attempt's log: its lines go within a second,
// between two heartbeats 8 s apart.
TEST(SessionPacingTest, LogLinesDoNotWaitForTheNextHeartbeat) {
  PacingCoordinator coordinator([](int) { return 8000; }, /*timeout_ms=*/40000);
  PacedWorker worker(coordinator);
  // The first heartbeat's ack sets the 8 s interval.
  EXPECT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(coordinator.mu);
    return coordinator.arrivals.size() >= 1;
  }));
  ProcessJobLog().Bind(7, 1);
  ProcessJobLog().log(spdlog::details::log_msg("worker", spdlog::level::info, "epoch 1 done"));
  const bool sent = Eventually([&] {
    std::lock_guard<std::mutex> lock(coordinator.mu);
    return !coordinator.logged.empty();
  });
  ProcessJobLog().Unbind();
  worker.Stop();
  ASSERT_TRUE(sent);
  std::lock_guard<std::mutex> lock(coordinator.mu);
  EXPECT_NE(coordinator.logged[0].first.find("epoch 1 done"), std::string::npos);
  EXPECT_EQ(coordinator.logged[0].second, 1) << "the line waited for the second heartbeat";
}

// Offered a UDP port, the worker heartbeats there while the coordinator acks there, and
// its stream falls silent. When the acks stop, the next beat goes on the stream as well, so
// the session is kept although the interval is a quarter of the timeout (the worker's
// silence limit is then two intervals); when they come back, the stream falls silent again.
TEST(SessionUdpTest, HeartbeatsGoOverUdpWhileAckedAndOnTheStreamWhileNot) {
  // Timeout 4 s: intervals of 1 s are a quarter of it.
  PacingCoordinator coordinator([](int) { return 1000; }, /*timeout_ms=*/4000);
  const std::string key = NewLivenessKey();
  std::atomic<bool> answer{true};
  std::atomic<int> udp_beats{0};
  auto listener = server::LivenessListener::Start(
      "127.0.0.1", 0,
      [&](const std::vector<server::LivenessListener::Datagram>& in,
          std::vector<std::string>* replies) {
        for (size_t i = 0; i < in.size(); ++i) {
          absl::StatusOr<v1::LivenessBeat> beat =
              OpenLivenessBeat(in[i].bytes, [&](const std::string& id) -> const std::string* {
                return id == "w1.paced" ? &key : nullptr;
              });
          if (!beat.ok()) continue;
          ++udp_beats;
          if (!answer) continue;
          v1::LivenessAck ack;
          ack.set_seq(beat->seq());
          ack.set_heartbeat_interval_ms(1000);
          (*replies)[i] = SealLivenessAck(ack, key);
        }
      });
  ASSERT_TRUE(listener.ok()) << listener.status();
  coordinator.liveness_port = (*listener)->port();
  coordinator.liveness_key = key;
  auto stream_beats = [&] {
    std::lock_guard<std::mutex> lock(coordinator.mu);
    return static_cast<int>(coordinator.arrivals.size());
  };
  // Over UDP only, once acked: `beats` more UDP beats and at most one on the stream (one
  // whose ack a loaded machine delayed past an interval).
  auto expect_udp_only = [&](int beats, const char* when) {
    const int stream0 = stream_beats(), udp0 = udp_beats;
    ASSERT_TRUE(Eventually([&] { return udp_beats >= udp0 + beats; })) << when;
    EXPECT_LE(stream_beats() - stream0, 1) << when;
  };
  PacedWorker worker(coordinator);
  ASSERT_TRUE(Eventually([&] { return udp_beats >= 2; }));
  expect_udp_only(3, "acked");

  answer = false;
  const int stream1 = stream_beats();
  EXPECT_TRUE(Eventually([&] { return stream_beats() >= stream1 + 3; }))
      << "no heartbeats on the stream after UDP stopped answering";
  EXPECT_EQ(coordinator.registrations.load(), 1) << "the session was abandoned";

  answer = true;
  const int udp2 = udp_beats;
  ASSERT_TRUE(Eventually([&] { return udp_beats >= udp2 + 2; }));  // acked again
  expect_udp_only(3, "acked again");
  worker.Stop();
  EXPECT_EQ(coordinator.registrations.load(), 1);
}

// The coordinator's address as gRPC's ClientContext::peer() gives it, in each form: IPv4,
// IPv6 in brackets and percent-encoded (gRPC 1.48 and later), and what is no IP address.
TEST(LivenessSenderTest, ThePeerAddressInEachForm) {
  const std::string key(kLivenessKeyBytes, 'k');
  for (const auto& [peer, target] : std::vector<std::pair<std::string, std::string>>{
           {"ipv4:127.0.0.1:7070", "127.0.0.1:9000"},
           {"ipv6:[::1]:7070", "[::1]:9000"},
           {"ipv6:%5B::1%5D:7070", "[::1]:9000"},
           {"ipv6:%5Bfd00::1%5D:7070", "[fd00::1]:9000"}}) {
    absl::StatusOr<std::unique_ptr<LivenessSender>> s =
        LivenessSender::Open(peer, 9000, key, "w1", 0);
    ASSERT_TRUE(s.ok()) << peer << ": " << s.status();
    EXPECT_EQ((*s)->target(), target) << peer;
  }
  for (const std::string& peer :
       std::vector<std::string>{"unix:/tmp/coordinator.sock", "inproc", "",
                                "ipv4:not-an-address:7070", "ipv6:%5Bzz%5D:1"}) {
    EXPECT_FALSE(LivenessSender::Open(peer, 9000, key, "w1", 0).ok()) << peer;
  }
  EXPECT_FALSE(LivenessSender::Open("ipv4:127.0.0.1:7070", 0, key, "w1", 0).ok());
  EXPECT_FALSE(LivenessSender::Open("ipv4:127.0.0.1:7070", 9000, "short", "w1", 0).ok());
}

}  // namespace
}  // namespace joule::worker
