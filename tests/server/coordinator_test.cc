#include "server/coordinator.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/liveness_datagram.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_session_sink.h"
#include "tests/testing/specs.h"
#include "tests/testing/temp_cleanup.h"

namespace joule::server {
namespace {

const auto* const kCoordinatorCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_coord_"));

using testing::FakeSessionSink;

v1::JobSpec Spec(int workers) { return testing::SmallMlpSpec(workers); }

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.clock = &clock_;  // heartbeats and their timeout move only when a test says
    auto c = Coordinator::Create(options);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = *std::move(c);
  }

  // Registers a worker and opens its session; returns its id.
  std::string AddWorker() {
    v1::RegisterWorkerRequest req;
    req.set_host("test");
    req.set_device_kind(v1::DEVICE_KIND_CPU);
    std::string id = c_->RegisterWorker(req)->worker_id();
    auto sink = std::make_shared<FakeSessionSink>();
    EXPECT_TRUE(c_->OpenSession(id, sink).ok());
    sinks_[id] = sink;
    return id;
  }

  std::vector<v1::Assignment> Assignments(const std::string& worker) {
    std::vector<v1::Assignment> out;
    for (const auto& m : sinks_[worker]->sent()) {
      if (m.has_assignment()) out.push_back(m.assignment());
    }
    return out;
  }

  void Report(const std::string& worker, const v1::Assignment& a, bool ok,
              const std::string& error = "",
              absl::StatusCode code = absl::StatusCode::kDataLoss) {
    v1::WorkerMessage m;
    if (!ok) m.mutable_result()->mutable_result()->set_error_code(static_cast<int>(code));
    m.mutable_result()->set_job_id(a.job_id());
    m.mutable_result()->set_attempt(a.attempt());
    m.mutable_result()->mutable_result()->set_ok(ok);
    m.mutable_result()->mutable_result()->set_error(error);
    m.mutable_result()->mutable_result()->set_test_accuracy(0.8);
    m.mutable_result()->mutable_result()->set_samples(100);
    m.mutable_result()->mutable_result()->set_train_seconds(2);
    m.mutable_result()->mutable_result()->set_devices(1);
    v1::EnergyRecord* e = m.mutable_result()->mutable_result()->add_energy();
    e->set_device("cpu");
    e->set_source("estimated");
    e->set_phase("forward");
    e->set_joules(10);
    c_->OnWorkerMessage(worker, m);
  }

  v1::Job Get(int64_t id) {
    auto job = c_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }

  int64_t Submit(int workers) {
    bool existing;
    auto id = c_->Submit(Spec(workers), "", &existing);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }

  // A registration that asks to be `worker` again, running `attempt` of `job`.
  static v1::RegisterWorkerRequest ResumeRequest(const std::string& worker, int64_t job,
                                                 int32_t attempt, const std::string& host = "test",
                                                 int pid = 0) {
    v1::RegisterWorkerRequest req;
    req.set_host(host);
    req.set_pid(pid);
    req.set_device_kind(v1::DEVICE_KIND_CPU);
    req.set_resume_worker_id(worker);
    req.set_resume_job_id(job);
    req.set_resume_attempt(attempt);
    return req;
  }

  void Heartbeat(const std::string& worker) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_unix_ms(clock_.UnixMs());
    c_->OnWorkerMessage(worker, m);
  }

  testing::FakeClock clock_;
  std::unique_ptr<Coordinator> c_;
  std::map<std::string, std::shared_ptr<FakeSessionSink>> sinks_;
};

TEST_F(CoordinatorTest, RejectsInvalidSpecAndStoresNothing) {
  bool existing;
  v1::JobSpec bad = Spec(2);
  bad.set_global_batch_size(3);
  auto id = c_->Submit(bad, "", &existing);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  auto list = c_->ListJobs({});
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->jobs_size(), 0);
}

TEST_F(CoordinatorTest, GangRunsToSuccessWithRanksInOrder) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  int64_t id = Submit(2);
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  ASSERT_EQ(Assignments(w0).size(), 1u);
  ASSERT_EQ(Assignments(w1).size(), 1u);
  v1::Assignment a0 = Assignments(w0)[0], a1 = Assignments(w1)[0];
  EXPECT_EQ(a0.rank(), 0);
  EXPECT_EQ(a1.rank(), 1);
  EXPECT_EQ(a0.world_size(), 2);
  EXPECT_EQ(a0.spec().local_batch_size(), 64);
  EXPECT_EQ(a0.rendezvous_prefix(), a1.rendezvous_prefix());
  EXPECT_EQ(c_->kv().ScopeCount(), 1u);

  Report(w1, a1, true);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  Report(w0, a0, true);
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.result().ranks_size(), 2);
  EXPECT_EQ(job.result().ranks(0).rank(), 0);
  EXPECT_EQ(job.result().samples(), 200);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 20.0);
  EXPECT_EQ(job.result().energy().devices(), 2);
  EXPECT_DOUBLE_EQ(job.result().samples_per_second(), 100.0);
  EXPECT_EQ(c_->kv().ScopeCount(), 0u);
  for (const auto& w : c_->ListWorkers()) EXPECT_EQ(w.state(), v1::WORKER_STATE_IDLE);
}

TEST_F(CoordinatorTest, PendingUntilTheGangIsComplete) {
  AddWorker();
  AddWorker();
  int64_t id = Submit(3);
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.reason(), "waiting for 3 idle cpu workers: 2 registered, 2 idle");
  std::string w2 = AddWorker();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Assignments(w2).size(), 1u);
}

TEST_F(CoordinatorTest, ARankFailureFailsTheJobAndStopsTheOthers) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  int64_t id = Submit(2);
  Report(w1, Assignments(w1)[0], false, "train-images: truncated");
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find("rank 1"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("truncated"), std::string::npos) << job.reason();
  auto sent = sinks_[w0]->sent();
  ASSERT_TRUE(sent.back().has_cancel());
  EXPECT_EQ(sent.back().cancel().job_id(), id);
  // w0 stays busy until it reports; then both are idle and a new job runs.
  Report(w0, Assignments(w0)[0], false, "cancelled");
  int64_t next = Submit(2);
  EXPECT_EQ(Get(next).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorTest, CancelRunningJobFreesWorkersWhenTheyReport) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  int64_t id = Submit(2);
  auto cancelled = c_->CancelJob(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(sinks_[w0]->sent().back().has_cancel());
  EXPECT_TRUE(sinks_[w1]->sent().back().has_cancel());
  EXPECT_EQ(c_->CancelJob(id).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Get(id).result().energy().ranks_reported(), 0);
  Report(w0, Assignments(w0)[0], false, "cancelled");
  Report(w1, Assignments(w1)[0], false, "cancelled");
  Report(w1, Assignments(w1)[0], false, "cancelled");  // a duplicate is not counted twice
  // The job had ended and left memory: late results are merged into the stored job.
  ASSERT_TRUE(c_->WaitStored(std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);  // late results keep the state...
  EXPECT_EQ(job.result().energy().ranks_reported(), 2);  // ...and add their energy
  EXPECT_EQ(job.result().energy().ranks_expected(), 2);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 20.0);
  for (const auto& w : c_->ListWorkers()) EXPECT_EQ(w.state(), v1::WORKER_STATE_IDLE);
}

// The energy meter of each rank is faked by the joules its progress reports carry.
void SendProgress(Coordinator& c, const std::string& worker, const v1::Assignment& a, double joules,
                  int64_t step = 1) {
  v1::WorkerMessage m;
  m.mutable_progress()->set_job_id(a.job_id());
  m.mutable_progress()->set_attempt(a.attempt());
  m.mutable_progress()->set_rank(a.rank());
  m.mutable_progress()->mutable_progress()->set_epoch(1);
  m.mutable_progress()->mutable_progress()->set_step(step);
  m.mutable_progress()->mutable_progress()->set_energy_joules(joules);
  m.mutable_progress()->mutable_progress()->set_energy_estimated(true);
  c.OnWorkerMessage(worker, m);
}

// The job's progress carries the job's power and each rank's (issue 29): `watch` and the
// web UI show those, not rank 0's beside the job's joules.
TEST_F(CoordinatorTest, ProgressCarriesTheJobsPowerAndEachRanks) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  bool existing;
  const int64_t id = *c_->Submit(Spec(2), "", &existing);
  const v1::Assignment a0 = Assignments(w0)[0], a1 = Assignments(w1)[0];
  const auto progress = [&](const std::string& worker, const v1::Assignment& a, double watts) {
    v1::WorkerMessage m;
    m.mutable_progress()->set_job_id(a.job_id());
    m.mutable_progress()->set_attempt(a.attempt());
    m.mutable_progress()->set_rank(a.rank());
    v1::RankProgress* p = m.mutable_progress()->mutable_progress();
    p->set_epoch(1);
    p->set_energy_joules(10);
    p->set_power_watts(watts);
    p->set_elapsed_seconds(1);
    c_->OnWorkerMessage(worker, m);
  };
  progress(w1, a1, 20);  // rank 1 first: rank 0 not heard yet
  v1::JobProgress p = Get(id).progress();
  ASSERT_EQ(p.rank_power_watts_size(), a1.rank() + 1);
  EXPECT_DOUBLE_EQ(p.rank_power_watts(a1.rank()), 20);
  progress(w0, a0, 10);  // rank 0's report replaces the shown figures, not these
  p = Get(id).progress();
  ASSERT_EQ(p.rank_power_watts_size(), 2);
  EXPECT_DOUBLE_EQ(p.rank_power_watts(a0.rank()), 10);
  EXPECT_DOUBLE_EQ(p.rank_power_watts(a1.rank()), 20);
  EXPECT_DOUBLE_EQ(p.job_power_watts(), 30);
  EXPECT_DOUBLE_EQ(p.power_watts(), 10);  // rank 0's own, as before
}

TEST_F(CoordinatorTest, EnergyBudgetWarnsAtNinetyPercentAndStopsTheRanksAtTheBudget) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  v1::JobSpec spec = Spec(2);
  spec.set_energy_budget_joules(100);
  bool existing;
  const int64_t id = *c_->Submit(spec, "", &existing);
  const v1::Assignment a0 = Assignments(w0)[0], a1 = Assignments(w1)[0];
  // The job's energy is every rank's: rank 1's reports count, though rank 0's view stands.
  SendProgress(*c_, w0, a0, 30);
  SendProgress(*c_, w1, a1, 40);
  v1::Job job = Get(id);
  EXPECT_DOUBLE_EQ(job.progress().job_energy_joules(), 70);
  EXPECT_DOUBLE_EQ(job.progress().energy_joules(), 30);  // rank 0's own
  EXPECT_NEAR(job.progress().energy_budget_used(), 0.7, 1e-12);
  // Each worker lists its own rank's energy so far and, apart, the job's (issue 23).
  for (const v1::WorkerInfo& w : c_->ListWorkers()) {
    EXPECT_DOUBLE_EQ(w.rank_energy_joules(), w.worker_id() == w0 ? 30 : 40) << w.worker_id();
    EXPECT_DOUBLE_EQ(w.job_energy_joules(), 70) << w.worker_id();
  }
  EXPECT_FALSE(job.progress().budget_warning());
  SendProgress(*c_, w0, a0, 50);  // 90 J: 90%
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(job.progress().budget_warning());
  for (const auto& [w, sink] : sinks_) {
    for (const auto& m : sink->sent()) EXPECT_FALSE(m.has_cancel()) << w;
  }
  SendProgress(*c_, w0, a0, 50);  // rank 0 again: its report must not clear the warning
  EXPECT_TRUE(Get(id).progress().budget_warning());
  SendProgress(*c_, w1, a1, 50);  // 100 J
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_BUDGET_EXCEEDED);
  EXPECT_NE(job.reason().find("energy budget reached: 100.0 J spent of 100 J"), std::string::npos)
      << job.reason();
  for (const std::string& w : {w0, w1}) {
    ASSERT_TRUE(sinks_[w]->sent().back().has_cancel()) << w;
    EXPECT_TRUE(sinks_[w]->sent().back().cancel().checkpoint()) << "a graceful stop";
  }
  // Until the ranks report, what their progress said stands in the one figure (issue 23).
  EXPECT_DOUBLE_EQ(job.progress().job_energy_joules(), 100);
  EXPECT_DOUBLE_EQ(job.progress().energy_budget_used(), 1.0);
  EXPECT_DOUBLE_EQ(job.result().energy().unreported_joules(), 100);
  EXPECT_DOUBLE_EQ(JobJoulesSoFar(job.result().energy()), 100);
  // The ranks stop after their checkpoint and report: the partial report is kept.
  Report(w0, a0, false, "stopped at step 8 as the coordinator asked, after a checkpoint",
         absl::StatusCode::kCancelled);
  Report(w1, a1, false, "stopped at step 8", absl::StatusCode::kCancelled);
  ASSERT_TRUE(c_->WaitStored(std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_BUDGET_EXCEEDED);
  EXPECT_EQ(job.result().energy().ranks_reported(), 2);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 20.0);
  EXPECT_EQ(job.result().samples(), 200);
  // Their results replace their progress: one figure, the report's, everywhere.
  EXPECT_DOUBLE_EQ(job.result().energy().unreported_joules(), 0);
  EXPECT_DOUBLE_EQ(job.progress().job_energy_joules(), 20.0);
  EXPECT_DOUBLE_EQ(job.progress().energy_budget_used(), 0.2);
  for (const auto& w : c_->ListWorkers()) EXPECT_EQ(w.state(), v1::WORKER_STATE_IDLE);
}

// Issue 23: the stop is called when the spend plus what the stop itself will cost at the
// job's power (kStopCheckInterval steps and a progress period) reaches the budget, so a
// fast, power-hungry job does not run far past it.
TEST_F(CoordinatorTest, TheBudgetStopAllowsForWhatStoppingCosts) {
  std::string w0 = AddWorker();
  v1::JobSpec spec = Spec(1);  // global batch 64
  spec.set_energy_budget_joules(100);
  bool existing;
  const int64_t id = *c_->Submit(spec, "", &existing);
  const v1::Assignment a0 = Assignments(w0)[0];
  // 10 W at 640 samples/s: a step takes 0.1 s, the stop 8 x 0.1 + 1 = 1.8 s, 18 J.
  auto progress = [&](double joules, double elapsed) {
    v1::WorkerMessage m;
    m.mutable_progress()->set_job_id(a0.job_id());
    m.mutable_progress()->set_attempt(a0.attempt());
    m.mutable_progress()->set_rank(0);
    v1::RankProgress* p = m.mutable_progress()->mutable_progress();
    p->set_epoch(1);
    p->set_step(static_cast<int64_t>(elapsed * 10));
    p->set_energy_joules(joules);
    p->set_power_watts(10);
    p->set_samples_per_second(640);
    p->set_elapsed_seconds(elapsed);
    c_->OnWorkerMessage(w0, m);
  };
  progress(70, 7);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);  // 70 + 18 < 100
  progress(81, 8.1);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);  // 81 + 18 < 100
  progress(83, 8.3);                                  // 83 + 18 >= 100
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_BUDGET_EXCEEDED);
  EXPECT_NE(job.reason().find("83.0 J spent of 100 J, and about 18.0 J more while the ranks "
                              "stop (10.0 W for 1.8 s)"),
            std::string::npos)
      << job.reason();
  ASSERT_TRUE(sinks_[w0]->sent().back().has_cancel());
  EXPECT_TRUE(sinks_[w0]->sent().back().cancel().checkpoint());
}

// What the ranks spend before their first step (loading the data, connecting) reaches the
// coordinator in energy-only reports: it counts for the budget and shows in the job's
// energy, and rank 0's does not replace its training figures. Ranks not heard from yet
// are forecast as the mean of those heard.
TEST_F(CoordinatorTest, EnergyOnlyReportsCountForTheBudgetAndSilentRanksAreForecast) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  v1::JobSpec spec = Spec(2);
  spec.set_energy_budget_joules(100);
  bool existing;
  const int64_t id = *c_->Submit(spec, "", &existing);
  const v1::Assignment a0 = Assignments(w0)[0];
  const auto energy_only = [&](const std::string& worker, const v1::Assignment& a, double joules) {
    v1::WorkerMessage m;
    m.mutable_progress()->set_job_id(a.job_id());
    m.mutable_progress()->set_attempt(a.attempt());
    m.mutable_progress()->set_rank(a.rank());
    m.mutable_progress()->set_energy_only(true);
    v1::RankProgress* p = m.mutable_progress()->mutable_progress();
    p->set_energy_joules(joules);
    p->set_power_watts(1);
    p->set_elapsed_seconds(joules);
    c_->OnWorkerMessage(worker, m);
  };
  v1::WorkerMessage trained;  // rank 0 trained a little: epoch 3, step 12
  trained.mutable_progress()->set_job_id(a0.job_id());
  trained.mutable_progress()->set_attempt(a0.attempt());
  trained.mutable_progress()->set_rank(0);
  trained.mutable_progress()->mutable_progress()->set_epoch(3);
  trained.mutable_progress()->mutable_progress()->set_step(12);
  trained.mutable_progress()->mutable_progress()->set_energy_joules(10);
  c_->OnWorkerMessage(w0, trained);
  energy_only(w0, a0, 30);  // rank 1 silent: forecast 30 J, 60 + 2 W x 1 s < 100
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_DOUBLE_EQ(job.progress().job_energy_joules(), 30);
  EXPECT_EQ(job.progress().epoch(), 3) << "an energy-only report shows no training";
  EXPECT_EQ(job.progress().step(), 12);
  energy_only(w0, a0, 49);  // 49 + 49 forecast + 2 W x 1 s: the budget
  job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_BUDGET_EXCEEDED);
  EXPECT_NE(job.reason().find("1 of 2 ranks not heard from yet: 49.0 J forecast"),
            std::string::npos)
      << job.reason();
  EXPECT_DOUBLE_EQ(job.progress().job_energy_joules(), 49) << "the measured figure shown";
  for (const std::string& w : {w0, w1}) {
    ASSERT_TRUE(sinks_[w]->sent().back().has_cancel()) << w;
    EXPECT_TRUE(sinks_[w]->sent().back().cancel().checkpoint()) << w;
  }
}

// A budget spent before any rank reported a step (loading the data, connecting) stops
// every rank at once: there is nothing new to checkpoint, and every rank gets the same
// word (a rank that decided alone could wait for a checkpoint its peers never join).
TEST_F(CoordinatorTest, ABudgetSpentBeforeAnyStepStopsEveryRankAtOnce) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  v1::JobSpec spec = Spec(2);
  spec.set_energy_budget_joules(10);
  bool existing;
  const int64_t id = *c_->Submit(spec, "", &existing);
  const v1::Assignment a0 = Assignments(w0)[0], a1 = Assignments(w1)[0];
  SendProgress(*c_, w0, a0, 2, /*step=*/0);  // epoch 1, no step yet
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  SendProgress(*c_, w1, a1, 9, /*step=*/0);  // 11 J
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_BUDGET_EXCEEDED);
  for (const std::string& w : {w0, w1}) {
    ASSERT_TRUE(sinks_[w]->sent().back().has_cancel()) << w;
    EXPECT_FALSE(sinks_[w]->sent().back().cancel().checkpoint()) << w;
  }
}

TEST_F(CoordinatorTest, AFailureAfterTheBudgetIsSpentStopsTheRanksAtOnceWithoutARestart) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  v1::JobSpec spec = Spec(2);
  spec.set_energy_budget_joules(100);
  bool existing;
  const int64_t id = *c_->Submit(spec, "", &existing);
  const v1::Assignment a0 = Assignments(w0)[0], a1 = Assignments(w1)[0];
  SendProgress(*c_, w1, a1, 4);   // rank 0 not heard yet: forecast as rank 1, 8 J
  SendProgress(*c_, w0, a0, 95);  // 99 J
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  // Rank 1 fails (retryable) after its last report: the 10 J of its result pass the
  // budget: no restart, and rank 0 is stopped at once (its attempt is broken: nothing to
  // agree a checkpoint with).
  Report(w1, a1, false, "gloo: connection reset", absl::StatusCode::kUnavailable);
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_BUDGET_EXCEEDED) << job.reason();
  EXPECT_NE(job.reason().find("no restart: its energy budget is spent"), std::string::npos)
      << job.reason();
  ASSERT_TRUE(sinks_[w0]->sent().back().has_cancel());
  EXPECT_FALSE(sinks_[w0]->sent().back().cancel().checkpoint());
}

TEST_F(CoordinatorTest, AFailureWithNoRestartLeftIsAFailureWhateverTheBudget) {
  std::string w0 = AddWorker();
  v1::JobSpec spec = Spec(1);
  spec.set_energy_budget_joules(10);
  spec.set_no_restarts(true);
  bool existing;
  const int64_t id = *c_->Submit(spec, "", &existing);
  SendProgress(*c_, w0, Assignments(w0)[0], 9);
  Report(w0, Assignments(w0)[0], false, "gloo: connection reset", absl::StatusCode::kUnavailable);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_FAILED) << Get(id).reason();
}

void SendLog(Coordinator& c, const std::string& worker, int64_t job, int32_t attempt,
             std::vector<std::string> texts, int64_t dropped = 0) {
  v1::WorkerMessage m;
  m.mutable_log()->set_job_id(job);
  m.mutable_log()->set_attempt(attempt);
  m.mutable_log()->set_dropped(dropped);
  for (const std::string& t : texts) {
    v1::LogLine* l = m.mutable_log()->add_lines();
    l->set_text(t);
    l->set_unix_ms(5);
    l->set_rank(99);  // a worker does not choose its rank
  }
  c.OnWorkerMessage(worker, m);
}

TEST_F(CoordinatorTest, JobLogsKeepTheGangsLinesByRankAndNothingElse) {
  const std::vector<std::string> workers = {AddWorker(), AddWorker(), AddWorker()};
  bool existing;
  const int64_t id = *c_->Submit(Spec(2), "", &existing);
  const v1::Job job = Get(id);
  std::string outsider;
  for (const std::string& w : workers) {
    if (w != job.worker_ids(0) && w != job.worker_ids(1)) outsider = w;
  }
  SendLog(*c_, job.worker_ids(1), id, 1, {"I rank one speaks", std::string(5000, 'x') + "\xff"});
  SendLog(*c_, job.worker_ids(0), id, 1, {"I rank zero speaks"}, /*dropped=*/3);
  SendLog(*c_, outsider, id, 1, {"I not of the gang"});
  SendLog(*c_, job.worker_ids(0), id, 2, {"I another attempt"});
  std::vector<std::string> flood(2000, "I flood");
  SendLog(*c_, job.worker_ids(0), id, 1, flood);
  // Stored by the writer: wait for the evidence.
  absl::StatusOr<v1::GetJobLogResponse> log;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    v1::GetJobLogRequest req;
    req.set_job_id(id);
    req.set_rank(-1);
    req.set_limit(10000);
    log = c_->GetJobLog(req);
    ASSERT_TRUE(log.ok()) << log.status();
  } while (log->lines_size() < 4 + 500 && std::chrono::steady_clock::now() < until);
  ASSERT_EQ(log->lines_size(), 4 + 500);  // at most 500 lines a report
  EXPECT_EQ(log->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(log->lines(0).rank(), 1);
  EXPECT_EQ(log->lines(0).text(), "I rank one speaks");
  EXPECT_LE(log->lines(1).text().size(), 2048u);  // cut, and valid UTF-8
  EXPECT_EQ(log->lines(1).text().find('\xff'), std::string::npos);
  EXPECT_NE(log->lines(2).text().find("3 lines dropped by the worker"), std::string::npos);
  EXPECT_EQ(log->lines(3).rank(), 0);
  EXPECT_EQ(log->lines(3).text(), "I rank zero speaks");
  for (const v1::LogLine& l : log->lines()) {
    EXPECT_EQ(l.text().find("not of the gang"), std::string::npos);
    EXPECT_EQ(l.text().find("another attempt"), std::string::npos);
  }
  EXPECT_EQ(log->last_seq(), log->lines(log->lines_size() - 1).seq());
  v1::GetJobLogRequest bad;
  bad.set_job_id(id);
  bad.set_limit(-1);
  EXPECT_EQ(c_->GetJobLog(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.set_limit(0);
  bad.set_job_id(12345);
  EXPECT_EQ(c_->GetJobLog(bad).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, RankZerosHeartbeatsTellTheJobsPhase) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  bool existing;
  const int64_t id = *c_->Submit(Spec(2), "", &existing);
  const v1::Assignment a0 = Assignments(w0)[0], a1 = Assignments(w1)[0];
  auto beat = [&](const std::string& w, const v1::Assignment& a, v1::RankPhase phase) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_job_id(a.job_id());
    m.mutable_heartbeat()->set_attempt(a.attempt());
    m.mutable_heartbeat()->set_phase(phase);
    c_->OnWorkerMessage(w, m);
    return Get(id).progress().phase();
  };
  EXPECT_EQ(beat(w0, a0, v1::RANK_PHASE_FORWARD), v1::JOB_PHASE_TRAINING);
  EXPECT_EQ(beat(w0, a0, v1::RANK_PHASE_EVALUATION), v1::JOB_PHASE_EVALUATION);
  // Rank 1's phase is not the job's.
  EXPECT_EQ(beat(w1, a1, v1::RANK_PHASE_CHECKPOINT), v1::JOB_PHASE_EVALUATION);
  EXPECT_EQ(beat(w0, a0, v1::RANK_PHASE_CHECKPOINT), v1::JOB_PHASE_CHECKPOINT);
  SendProgress(*c_, w0, a0, 1);  // a progress report keeps the phase its heartbeats set
  EXPECT_EQ(Get(id).progress().phase(), v1::JOB_PHASE_CHECKPOINT);
  v1::Assignment stale = a0;
  stale.set_attempt(5);
  // Not its attempt.
  EXPECT_EQ(beat(w0, stale, v1::RANK_PHASE_EVALUATION), v1::JOB_PHASE_CHECKPOINT);
  EXPECT_EQ(beat(w0, a0, v1::RANK_PHASE_UNSPECIFIED), v1::JOB_PHASE_UNSPECIFIED);
}

TEST_F(CoordinatorTest, ProgressOfAWorkerNotInTheAttemptIsIgnored) {
  const std::vector<std::string> workers = {AddWorker(), AddWorker(), AddWorker()};
  v1::JobSpec spec = Spec(2);
  spec.set_energy_budget_joules(100);
  bool existing;
  const int64_t id = *c_->Submit(spec, "", &existing);
  const v1::Job started = Get(id);
  std::string member = started.worker_ids(0), idle;
  for (const std::string& w : workers) {
    if (w != started.worker_ids(0) && w != started.worker_ids(1)) idle = w;
  }
  v1::Assignment forged = Assignments(member)[0];
  SendProgress(*c_, idle, forged, 1000);    // not one of the gang
  forged.set_attempt(7);
  SendProgress(*c_, member, forged, 1000);  // not its attempt
  const v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_DOUBLE_EQ(job.progress().job_energy_joules(), 0);
}

TEST_F(CoordinatorTest, LostWorkerRequeuesItsJobToResume) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  int64_t id = Submit(2);
  // Its session ends mid-attempt: the attempt waits for it, up to the heartbeat timeout
  // (10 s) from its last word, while the other rank goes on heartbeating.
  c_->CloseSession(w1, sinks_[w1].get(), "stream broke");
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(std::chrono::seconds(9));
  Heartbeat(w0);
  c_->CheckHeartbeats(clock_.Now());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(c_->ListWorkers().size(), 2u);
  clock_.Advance(std::chrono::seconds(2));
  Heartbeat(w0);
  c_->CheckHeartbeats(clock_.Now());
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find("was lost: no heartbeat for more than 10000 ms"), std::string::npos)
      << job.reason();
  EXPECT_NE(job.reason().find("restart 1 of 3"), std::string::npos) << job.reason();
  EXPECT_TRUE(sinks_[w0]->sent().back().has_cancel());
  EXPECT_EQ(c_->ListWorkers().size(), 1u);
  // The surviving rank reports (cancelled): its energy is kept for the job.
  Report(w0, Assignments(w0)[0], false, "cancelled", absl::StatusCode::kCancelled);
  // A new worker joins: attempt 2 runs and succeeds; the report counts both attempts.
  std::string w2 = AddWorker();
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 2);
  Report(w0, Assignments(w0).back(), true);
  Report(w2, Assignments(w2).back(), true);
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(job.result().failed_attempts_size(), 1);
  EXPECT_DOUBLE_EQ(job.result().energy().earlier_attempts_joules(), 10.0);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 30.0);
}

// A worker whose session ended mid-attempt (a link outage) and that registers again
// within the heartbeat timeout, asking to resume, keeps its id and its attempt: the job
// runs on, attempt 1, and succeeds with no failed attempt. Its new session is answered
// (heartbeat acks); the old one's end, if it comes late, changes nothing.
TEST_F(CoordinatorTest, AWorkerBackWithinTheHeartbeatTimeoutResumesItsAttempt) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  int64_t id = Submit(2);
  const v1::Assignment a1 = Assignments(w1)[0];
  c_->CloseSession(w1, sinks_[w1].get(), "keepalive watchdog timeout");
  EXPECT_FALSE(sinks_[w1]->closed());
  bool listed = false;
  for (const v1::WorkerInfo& w : c_->ListWorkers()) {
    if (w.worker_id() != w1) continue;
    listed = true;
    EXPECT_EQ(w.state(), v1::WORKER_STATE_BUSY);
    EXPECT_EQ(w.session_lost_unix_ms(), clock_.UnixMs());
  }
  EXPECT_TRUE(listed);
  clock_.Advance(std::chrono::seconds(7));  // a 7 s outage
  Heartbeat(w0);
  c_->CheckHeartbeats(clock_.Now());
  auto r = c_->RegisterWorker(ResumeRequest(w1, id, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->resumed());
  EXPECT_EQ(r->worker_id(), w1);
  EXPECT_EQ(r->heartbeat_timeout_ms(), 10000);
  auto fresh = std::make_shared<FakeSessionSink>();
  ASSERT_TRUE(c_->OpenSession(w1, fresh).ok());
  // The old session's end, reported after the new one opened, is not this session's.
  c_->CloseSession(w1, sinks_[w1].get(), "late");
  sinks_[w1] = fresh;
  Heartbeat(w1);
  ASSERT_FALSE(fresh->sent().empty());
  EXPECT_TRUE(fresh->sent().back().has_heartbeat_ack());
  clock_.Advance(std::chrono::seconds(5));  // past 10 s since the outage began
  Heartbeat(w0);
  Heartbeat(w1);
  c_->CheckHeartbeats(clock_.Now());
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  for (const auto& w : c_->ListWorkers()) {
    EXPECT_EQ(w.state(), v1::WORKER_STATE_BUSY) << w.worker_id();
    EXPECT_EQ(w.session_lost_unix_ms(), 0) << w.worker_id();
  }
  Report(w0, Assignments(w0)[0], true);
  Report(w1, a1, true);
  const v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.result().failed_attempts_size(), 0);
  EXPECT_EQ(job.result().ranks_size(), 2);
}

// A resume is granted only to the same process (host and pid) for the attempt it holds,
// while that attempt runs. Every other claim registers a new worker: a claim from another
// host or pid leaves the real worker as it was; the same process claiming an attempt it
// does not hold, or one that has ended, gives up what it held (the attempt fails over).
TEST_F(CoordinatorTest, AResumeIsGrantedOnlyToItsOwnProcessForItsRunningAttempt) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  int64_t id = Submit(2);
  c_->CloseSession(w1, sinks_[w1].get(), "outage");
  auto claim = [&](const std::string& host, int pid, const std::string& worker, int64_t job,
                   int attempt) {
    auto r = c_->RegisterWorker(ResumeRequest(worker, job, attempt, host, pid));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::RegisterWorkerResponse{};
  };
  // Not its process, an unknown id, an idle-or-other worker's id: new workers, and the
  // job still waits for w1.
  for (const auto& r : {claim("elsewhere", 0, w1, id, 1), claim("test", 4242, w1, id, 1),
                        claim("test", 0, "w99.nope", id, 1), claim("test", 0, "", id, 1)}) {
    EXPECT_FALSE(r.resumed());
    EXPECT_NE(r.worker_id(), w1);
  }
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  // The same process naming another attempt: what it held ends now.
  const auto wrong = claim("test", 0, w1, id, 7);
  EXPECT_FALSE(wrong.resumed());
  EXPECT_NE(wrong.worker_id(), w1);
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find("registered again as a new worker"), std::string::npos)
      << job.reason();
  // Its attempt has ended now: a late claim for attempt 1 is a new worker too.
  const auto late = claim("test", 0, w1, id, 1);
  EXPECT_FALSE(late.resumed());
  for (const auto& w : c_->ListWorkers()) EXPECT_NE(w.worker_id(), w1);
  (void)w0;
}

// The worker comes back before this side noticed its old stream end (a pulled cable tells
// the coordinator nothing): the new session replaces the old one, which is closed.
TEST_F(CoordinatorTest, AResumeReplacesASessionThatStillLooksOpen) {
  std::string w0 = AddWorker(), w1 = AddWorker();
  int64_t id = Submit(2);
  auto r = c_->RegisterWorker(ResumeRequest(w1, id, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->resumed());
  EXPECT_TRUE(sinks_[w1]->closed());
  auto fresh = std::make_shared<FakeSessionSink>();
  ASSERT_TRUE(c_->OpenSession(w1, fresh).ok());
  c_->CloseSession(w1, sinks_[w1].get(), "the old stream's end");
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  (void)w0;
}

TEST_F(CoordinatorTest, RetryableFailuresStopAfterMaxRestarts) {
  std::string w0 = AddWorker();
  bool existing;
  v1::JobSpec spec = Spec(1);
  spec.set_max_restarts(2);
  int64_t id = *c_->Submit(spec, "", &existing);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_EQ(Get(id).attempt(), attempt);
    Report(w0, Assignments(w0).back(), false, "peer vanished", absl::StatusCode::kUnavailable);
  }
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find("after 2 restarts"), std::string::npos) << job.reason();
  EXPECT_EQ(job.result().failed_attempts_size(), 2);
}

TEST_F(CoordinatorTest, NoRestartsMeansTheFirstFailureIsFinal) {
  std::string w0 = AddWorker();
  bool existing;
  v1::JobSpec spec = Spec(1);
  spec.set_no_restarts(true);
  int64_t id = *c_->Submit(spec, "", &existing);
  Report(w0, Assignments(w0).back(), false, "peer vanished", absl::StatusCode::kUnavailable);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_FAILED);
}

TEST_F(CoordinatorTest, SilentWorkerIsDeclaredLost) {
  std::string w0 = AddWorker();
  clock_.Advance(std::chrono::seconds(10));  // the timeout itself: not yet
  c_->CheckHeartbeats(clock_.Now());
  EXPECT_FALSE(sinks_[w0]->closed());
  EXPECT_EQ(c_->ListWorkers().size(), 1u);
  clock_.Advance(std::chrono::seconds(1));
  c_->CheckHeartbeats(clock_.Now());
  EXPECT_TRUE(sinks_[w0]->closed());
  EXPECT_TRUE(c_->ListWorkers().empty());
}

// The liveness check runs on its own period, not at every change: a burst of submissions
// into a long queue once woke it per submission, and each pass walked every queued job
// (most of a core at 20,000 pending jobs, bench/store.sh).
TEST_F(CoordinatorTest, TheLivenessCheckDoesNotRunAtEveryChange) {
  const uint64_t passes_before = c_->liveness_passes();
  const auto start = std::chrono::steady_clock::now();
  constexpr int kSubmits = 300;
  for (int i = 0; i < kSubmits; ++i) Submit(1);  // each one a change that wakes waiters
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // At most one pass per 500 ms of the burst, and the ones at its edges.
  const uint64_t passes = c_->liveness_passes() - passes_before;
  EXPECT_LE(passes, static_cast<uint64_t>(seconds / 0.5) + 2)
      << passes << " passes over " << kSubmits << " submissions in " << seconds << " s";
}

// Heartbeats over UDP (common/liveness_datagram.h): a beat sealed with the worker's
// registration key keeps it alive as one on its stream does; a replay, a forgery or a
// beat of a worker without a session does not, and gets no ack.
class CoordinatorUdpTest : public CoordinatorTest {
 protected:
  // Registers a worker (the coordinator offering UDP on `port`) and opens its session.
  std::string AddUdpWorker(std::string* key) {
    c_->SetLivenessPort(4242);
    v1::RegisterWorkerRequest req;
    req.set_host("test");
    req.set_device_kind(v1::DEVICE_KIND_CPU);
    absl::StatusOr<v1::RegisterWorkerResponse> r = c_->RegisterWorker(req);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->liveness_port(), 4242);
    EXPECT_EQ(r->liveness_key().size(), kLivenessKeyBytes);
    *key = r->liveness_key();
    auto sink = std::make_shared<FakeSessionSink>();
    EXPECT_TRUE(c_->OpenSession(r->worker_id(), sink).ok());
    sinks_[r->worker_id()] = sink;
    return r->worker_id();
  }
  // The coordinator's reply to one beat of `worker` numbered `seq`, sealed with `key`
  // ("" when it sent none).
  std::string Beat(const std::string& worker, uint64_t seq, const std::string& key) {
    v1::LivenessBeat beat;
    beat.set_worker_id(worker);
    beat.set_seq(seq);
    beat.mutable_heartbeat()->set_unix_ms(clock_.UnixMs());
    std::vector<LivenessListener::Datagram> in(1);
    in[0].bytes = SealLivenessBeat(beat, key);
    std::vector<std::string> replies(1);
    c_->OnLivenessDatagrams(in, &replies);
    return replies[0];
  }
};

TEST_F(CoordinatorUdpTest, BeatsKeepAWorkerAliveAndReplaysAndForgeriesDoNot) {
  std::string key;
  const std::string w = AddUdpWorker(&key);
  clock_.Advance(std::chrono::seconds(8));
  const std::string reply = Beat(w, 1, key);
  absl::StatusOr<v1::LivenessAck> ack = OpenLivenessAck(reply, key);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->seq(), 1u);
  EXPECT_GT(ack->heartbeat_interval_ms(), 0);
  clock_.Advance(std::chrono::seconds(8));  // 16 s registered, 8 s since the beat
  c_->CheckHeartbeats(clock_.Now());
  ASSERT_FALSE(sinks_[w]->closed());

  EXPECT_EQ(Beat(w, 1, key), "");               // the same beat again
  EXPECT_EQ(Beat(w, 2, NewLivenessKey()), "");  // not its key
  EXPECT_EQ(Beat("w99.0000", 3, key), "");      // no such worker
  clock_.Advance(std::chrono::seconds(3));      // 11 s since the last genuine beat
  c_->CheckHeartbeats(clock_.Now());
  EXPECT_TRUE(sinks_[w]->closed());
  EXPECT_TRUE(c_->ListWorkers().empty());
}

// A busy worker whose stream ended is kept, detached, until it registers again or its
// timeout passes: UDP alone must not keep it (it would hold its gang forever).
TEST_F(CoordinatorUdpTest, ADetachedWorkerIsNotKeptAliveByUdp) {
  std::string key;
  const std::string w = AddUdpWorker(&key);
  Submit(1);
  ASSERT_EQ(Assignments(w).size(), 1u);
  ASSERT_FALSE(Beat(w, 1, key).empty());
  c_->CloseSession(w, sinks_[w].get(), "test: the stream ended");
  ASSERT_EQ(c_->ListWorkers().size(), 1u);  // detached, not lost
  EXPECT_EQ(Beat(w, 2, key), "");
  clock_.Advance(std::chrono::seconds(11));
  c_->CheckHeartbeats(clock_.Now());
  EXPECT_TRUE(c_->ListWorkers().empty());
}

TEST_F(CoordinatorUdpTest, NoPortNoKey) {
  v1::RegisterWorkerRequest req;
  req.set_host("test");
  req.set_device_kind(v1::DEVICE_KIND_CPU);
  absl::StatusOr<v1::RegisterWorkerResponse> r = c_->RegisterWorker(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->liveness_port(), 0);
  EXPECT_TRUE(r->liveness_key().empty());
}

// The liveness load is bounded: past max_heartbeats_per_second workers, their interval
// grows (workers / rate), told at registration and with every ack, up to a quarter of the
// heartbeat timeout; it shrinks again as workers leave.
TEST(CoordinatorHeartbeatTest, TheIntervalGrowsWithTheWorkersUpToAQuarterOfTheTimeout) {
  testing::FakeClock clock;
  CoordinatorOptions options;
  options.clock = &clock;
  options.heartbeat_interval = std::chrono::milliseconds(1000);
  options.heartbeat_timeout = std::chrono::milliseconds(10000);
  options.max_heartbeats_per_second = 2;
  auto c = Coordinator::Create(options);
  ASSERT_TRUE(c.ok()) << c.status();
  std::map<std::string, std::shared_ptr<FakeSessionSink>> sinks;
  std::vector<int32_t> registered_ms, acked_ms;
  for (int i = 0; i < 8; ++i) {
    auto r = (*c)->RegisterWorker({});
    ASSERT_TRUE(r.ok()) << r.status();
    registered_ms.push_back(r->heartbeat_interval_ms());
    sinks[r->worker_id()] = std::make_shared<FakeSessionSink>();
    ASSERT_TRUE((*c)->OpenSession(r->worker_id(), sinks[r->worker_id()]).ok());
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_unix_ms(clock.UnixMs());
    (*c)->OnWorkerMessage(r->worker_id(), m);
    ASSERT_TRUE(sinks[r->worker_id()]->sent().back().has_heartbeat_ack());
    acked_ms.push_back(
        sinks[r->worker_id()]->sent().back().heartbeat_ack().heartbeat_interval_ms());
  }
  // Registered as the 1st..8th worker (counted before it), acked after it counted: N / 2 s,
  // at least 1 s, at most 2.5 s.
  EXPECT_EQ(registered_ms, (std::vector<int32_t>{1000, 1000, 1000, 1500, 2000, 2500, 2500, 2500}));
  EXPECT_EQ(acked_ms, (std::vector<int32_t>{1000, 1000, 1500, 2000, 2500, 2500, 2500, 2500}));
  // Workers lost: the survivors' next acks give a shorter interval. (The survivor's heartbeat
  // comes inside the timeout: the coordinator's own thread checks heartbeats too.)
  clock.Advance(std::chrono::seconds(9));
  const std::string survivor = sinks.begin()->first;
  v1::WorkerMessage m;
  m.mutable_heartbeat()->set_unix_ms(clock.UnixMs());
  (*c)->OnWorkerMessage(survivor, m);
  clock.Advance(std::chrono::seconds(2));
  (*c)->CheckHeartbeats(clock.Now());
  ASSERT_EQ((*c)->ListWorkers().size(), 1u);
  (*c)->OnWorkerMessage(survivor, m);
  EXPECT_EQ(sinks[survivor]->sent().back().heartbeat_ack().heartbeat_interval_ms(), 1000);
}

TEST(CoordinatorHeartbeatTest, ANegativeHeartbeatRateIsRefused) {
  CoordinatorOptions options;
  options.max_heartbeats_per_second = -1;
  auto c = Coordinator::Create(options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("heartbeats per second"), std::string::npos);
}

TEST(CoordinatorStopTest, AWorkerThatNeverStopsIsDeclaredLost) {
  CoordinatorOptions options;
  options.heartbeat_timeout = std::chrono::hours(1);  // only the stop deadline can fire
  options.stop_timeout = std::chrono::seconds(20);
  auto c = Coordinator::Create(options);
  ASSERT_TRUE(c.ok());
  std::map<std::string, std::shared_ptr<FakeSessionSink>> sinks;
  for (int i = 0; i < 2; ++i) {
    std::string id = (*c)->RegisterWorker({})->worker_id();
    sinks[id] = std::make_shared<FakeSessionSink>();
    ASSERT_TRUE((*c)->OpenSession(id, sinks[id]).ok());
  }
  bool existing;
  int64_t job = *(*c)->Submit(Spec(2), "", &existing);
  ASSERT_TRUE((*c)->CancelJob(job).ok());
  // The first worker reports; the second stays busy (hung outside any collective).
  auto it = sinks.begin();
  const std::string reporter = it->first, hung = std::next(it)->first;
  v1::WorkerMessage m;
  m.mutable_result()->set_job_id(job);
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->mutable_result()->set_cancelled(true);
  (*c)->OnWorkerMessage(reporter, m);
  const auto now = std::chrono::steady_clock::now();
  (*c)->CheckHeartbeats(now + std::chrono::seconds(10));
  EXPECT_EQ((*c)->ListWorkers().size(), 2u);  // inside the stop timeout
  (*c)->CheckHeartbeats(now + std::chrono::seconds(25));
  std::vector<v1::WorkerInfo> workers = (*c)->ListWorkers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id(), reporter);
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_IDLE);
  EXPECT_TRUE(sinks[hung]->closed());
}

TEST_F(CoordinatorTest, StaleResultsAndUnknownWorkersAreIgnored) {
  std::string w0 = AddWorker();
  int64_t id = Submit(1);
  v1::Assignment a = Assignments(w0)[0];
  a.set_attempt(99);
  Report(w0, a, true);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  c_->OnWorkerMessage("nobody", v1::WorkerMessage{});
  EXPECT_EQ(c_->OpenSession("nobody", std::make_shared<FakeSessionSink>()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(c_->OpenSession(w0, std::make_shared<FakeSessionSink>()).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(CoordinatorRestartTest, AcknowledgedJobsSurviveAndRunningOnesAreRequeued) {
  auto dir = std::filesystem::temp_directory_path() /
             ("joule_coord_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CoordinatorOptions options;
  options.store = (dir / "jobs.db").string();
  int64_t running_id, pending_id;
  {
    auto c = Coordinator::Create(options);
    ASSERT_TRUE(c.ok());
    v1::RegisterWorkerRequest req;
    std::string w = (*c)->RegisterWorker(req)->worker_id();
    ASSERT_TRUE((*c)->OpenSession(w, std::make_shared<FakeSessionSink>()).ok());
    bool existing;
    running_id = *(*c)->Submit(Spec(1), "r1", &existing);
    pending_id = *(*c)->Submit(Spec(1), "r2", &existing);
    ASSERT_EQ((*c)->GetJob(running_id)->state(), v1::JOB_STATE_RUNNING);
  }
  auto c = Coordinator::Create(options);
  ASSERT_TRUE(c.ok());
  auto running = (*c)->GetJob(running_id);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(running->attempt(), 1);
  EXPECT_EQ((*c)->GetJob(pending_id)->state(), v1::JOB_STATE_PENDING);
  bool existing = false;
  auto again = (*c)->Submit(Spec(1), "r1", &existing);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(existing);
  EXPECT_EQ(*again, running_id);
}

}  // namespace
}  // namespace joule::server
