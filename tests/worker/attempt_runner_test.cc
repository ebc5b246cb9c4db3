// The attempt runner with the real trainer on small synthetic jobs, its outbox a recorder
// and its rendezvous the coordinator's KV in this process: what an attempt hands over
// (progress, its log before its result, the result), the busy answer, cancels, and two
// ranks that connect and agree.
#include "worker/agent/attempt_runner.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "server/rendezvous_kv.h"
#include "tests/testing/in_process_kv.h"

namespace joule::worker {
namespace {

using namespace std::chrono_literals;

// Records what the attempt sends, in order; WaitResult blocks until a result came.
class RecordingOutbox final : public AttemptOutbox {
 public:
  void SendProgress(const v1::WorkerMessage& m) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back("progress");
    progress_.push_back(m);
    cv_.notify_all();
  }
  void SendResult(v1::WorkerMessage m) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back("result");
    results_.push_back(std::move(m));
    cv_.notify_all();
  }
  void FlushLog() override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back("log");
  }
  // The first result; fails the test after 120 s without one.
  v1::WorkerMessage WaitResult() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 120s, [&] { return !results_.empty(); }));
    return results_.empty() ? v1::WorkerMessage() : results_.front();
  }
  // Whether a progress report came within 120 s.
  bool WaitProgress() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 120s, [&] { return !progress_.empty(); });
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::vector<v1::WorkerMessage> progress() {
    std::lock_guard<std::mutex> lock(mu_);
    return progress_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
  std::vector<v1::WorkerMessage> progress_, results_;
};

v1::Assignment Assignment(int epochs, int rank = 0, int world_size = 1) {
  v1::Assignment a;
  a.set_job_id(7);
  a.set_attempt(1);
  a.set_rank(rank);
  a.set_world_size(world_size);
  a.set_job_uid("00000000000000aa");
  a.set_rendezvous_prefix("job/7/attempt/1");
  v1::JobSpec* s = a.mutable_spec();
  s->set_model("logreg");
  s->set_dataset("synthetic:1x4x4:2:256");
  s->set_workers(world_size);
  s->set_global_batch_size(32);
  s->set_local_batch_size(32 / world_size);
  s->set_epochs(epochs);
  s->mutable_optimizer()->set_lr(0.1);
  return a;
}

// One rank's runner, its metrics and phases, over the shared KV.
struct Rank {
  explicit Rank(server::RendezvousKv& kv)
      : metrics(std::make_shared<prometheus::Registry>()),
        phases(Clock::Real()),
        runner(Options(), /*meter=*/nullptr, &metrics, &phases, &outbox,
               [&kv](const v1::Assignment& a) -> std::unique_ptr<KvClient> {
                 return std::make_unique<testing::InProcessKv>(kv, a.rendezvous_prefix());
               }) {}
  static AttemptRunnerOptions Options() {
    AttemptRunnerOptions o;
    o.transport = Transport::kGloo;
    o.collective_timeout = 60s;
    o.trainer.progress_period_seconds = 0;  // a report at every chance
    return o;
  }
  RecordingOutbox outbox;
  WorkerMetrics metrics;
  PhaseClock phases;
  AttemptRunner runner;
};

class AttemptRunnerTest : public ::testing::Test {
 protected:
  AttemptRunnerTest() { kv_.OpenScope("job/7/attempt/1"); }
  server::RendezvousKv kv_;
};

TEST_F(AttemptRunnerTest, AnAttemptsProgressThenItsLogThenItsResultGoToTheOutbox) {
  Rank r(kv_);
  ASSERT_TRUE(r.runner.Start(Assignment(2), {}).ok());
  EXPECT_EQ(r.runner.job_id(), 7);
  EXPECT_EQ(r.runner.attempt(), 1);
  const v1::WorkerMessage m = r.outbox.WaitResult();
  r.runner.Join();
  EXPECT_FALSE(r.runner.active());
  EXPECT_EQ(r.runner.phase(), v1::RANK_PHASE_UNSPECIFIED);  // idle again
  ASSERT_TRUE(m.has_result());
  EXPECT_EQ(m.result().job_id(), 7);
  EXPECT_EQ(m.result().attempt(), 1);
  EXPECT_EQ(m.result().job_uid(), "00000000000000aa");
  const v1::RankResult& result = m.result().result();
  ASSERT_TRUE(result.ok()) << result.error();
  EXPECT_EQ(result.rank(), 0);
  EXPECT_EQ(result.steps(), 2 * 256 / 32);
  EXPECT_FALSE(result.parameter_hash().empty());
  EXPECT_EQ(result.energy_size(), 0);  // no meter: nothing metered, nothing made up
  const std::vector<std::string> events = r.outbox.events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[events.size() - 2], "log");  // the attempt's last lines before its result
  EXPECT_EQ(events.back(), "result");
  const std::vector<v1::WorkerMessage> progress = r.outbox.progress();
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().progress().job_id(), 7);
  EXPECT_EQ(progress.back().progress().rank(), 0);
  EXPECT_EQ(progress.back().progress().progress().transport(), "gloo");
}

// Quiet-time energy reports: one a period after the last report of either kind, and
// (almost) none while progress comes more often than the period.
TEST(QuietEnergyReportsTest, ReportsAfterEachQuietPeriodOnly) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::chrono::steady_clock::time_point> at;
  const auto count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return at.size();
  };
  const auto start = std::chrono::steady_clock::now();
  QuietEnergyReports reports(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        at.push_back(std::chrono::steady_clock::now());
        cv.notify_all();
      },
      250ms);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return at.size() >= 2; }));
    EXPECT_GE(at[0] - start, 250ms);
    EXPECT_GE(at[1] - at[0], 250ms);
  }
  // Heard every 20 ms for 1.5 s (six periods): a report under way at the start, and one
  // more for a loaded machine's late wake-up, at most.
  const size_t before = count();
  const auto heard_until = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < heard_until) {
    reports.Heard();
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_LE(count(), before + 2) << "quiet reports while progress was heard";
  // Silent again: the reports resume.
  const size_t heard = count();
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, 30s, [&] { return at.size() > heard; }));
}

TEST_F(AttemptRunnerTest, WhileBusyASecondAssignmentIsRefusedAndACancelEndsTheFirst) {
  Rank r(kv_);
  ASSERT_TRUE(r.runner.Start(Assignment(100000), {}).ok());
  EXPECT_TRUE(r.runner.active());
  v1::Assignment other = Assignment(1);
  other.set_job_id(8);
  const absl::Status busy = r.runner.Start(other, {});
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.message().find("job 7 attempt 1"), std::string::npos) << busy;
  // A cancel for another attempt is not this one's.
  v1::CancelAttempt cancel;
  cancel.set_job_id(7);
  cancel.set_attempt(2);
  EXPECT_FALSE(r.runner.Apply(cancel));
  EXPECT_TRUE(r.runner.active());
  // A graceful stop is for budgeted jobs only: this one is cancelled at once.
  cancel.set_attempt(1);
  cancel.set_checkpoint(true);
  EXPECT_TRUE(r.runner.Apply(cancel));
  const v1::WorkerMessage m = r.outbox.WaitResult();
  EXPECT_FALSE(m.result().result().ok());
  EXPECT_TRUE(m.result().result().cancelled()) << m.result().result().error();
  r.runner.Join();
  // Idle again: the next assignment starts.
  EXPECT_TRUE(r.runner.Start(other, {}).ok());
  r.runner.Cancel();
  r.runner.Join();
}

TEST_F(AttemptRunnerTest, TwoRanksConnectThroughTheKvAndEndWithTheSameParameters) {
  Rank r0(kv_), r1(kv_);
  ASSERT_TRUE(r0.runner.Start(Assignment(1, 0, 2), {}).ok());
  ASSERT_TRUE(r1.runner.Start(Assignment(1, 1, 2), {}).ok());
  const v1::RankResult a = r0.outbox.WaitResult().result().result();
  const v1::RankResult b = r1.outbox.WaitResult().result().result();
  ASSERT_TRUE(a.ok()) << a.error();
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(b.rank(), 1);
  EXPECT_EQ(a.parameter_hash(), b.parameter_hash());
}

TEST_F(AttemptRunnerTest, APeerThatIsCancelledEndsTheOtherRanksAttemptWithAnError) {
  Rank r0(kv_), r1(kv_);
  ASSERT_TRUE(r0.runner.Start(Assignment(100000, 0, 2), {}).ok());
  ASSERT_TRUE(r1.runner.Start(Assignment(100000, 1, 2), {}).ok());
  // Wait until both train (a progress report each), then stop rank 1 only.
  ASSERT_TRUE(r0.outbox.WaitProgress());
  ASSERT_TRUE(r1.outbox.WaitProgress());
  r1.runner.Cancel();
  EXPECT_TRUE(r1.outbox.WaitResult().result().result().cancelled());
  const v1::RankResult survivor = r0.outbox.WaitResult().result().result();
  EXPECT_FALSE(survivor.ok());
  EXPECT_FALSE(survivor.cancelled());  // it was not told to stop: its peer is gone
  EXPECT_FALSE(survivor.error().empty());
}

}  // namespace
}  // namespace joule::worker
