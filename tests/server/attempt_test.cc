#include "server/attempt.h"

#include <gtest/gtest.h>

namespace joule::server {
namespace {

v1::Job Running(int workers) {
  v1::Job job;
  job.set_id(5);
  job.mutable_spec()->set_workers(workers);
  job.mutable_spec()->set_max_restarts(3);
  std::vector<std::string> ids;
  for (int i = 0; i < workers; ++i) ids.push_back("w" + std::to_string(i));
  StartAttempt(job, ids, 1000, 400);
  return job;
}

v1::RankResult Rank(int rank, double joules, bool ok = true, const std::string& hash = "h") {
  v1::RankResult r;
  r.set_rank(rank);
  r.set_ok(ok);
  r.set_devices(1);
  r.set_steps(10);
  r.set_samples(100);
  r.set_parameter_hash(hash);
  r.set_train_seconds(1 + rank);
  v1::EnergyRecord* e = r.add_energy();
  e->set_source("rapl");
  e->set_phase("forward");
  e->set_joules(joules);
  return r;
}

TEST(AttemptTest, RetryabilityAndRootCauseOrder) {
  EXPECT_FALSE(IsRetryable(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(IsRetryable(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(IsRetryable(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(IsRetryable(absl::StatusCode::kInternal));
  EXPECT_GT(RootCauseWeight(absl::StatusCode::kDataLoss),
            RootCauseWeight(absl::StatusCode::kInternal));
  EXPECT_GT(RootCauseWeight(absl::StatusCode::kInternal),
            RootCauseWeight(absl::StatusCode::kAborted));
  EXPECT_GT(RootCauseWeight(absl::StatusCode::kAborted),
            RootCauseWeight(absl::StatusCode::kCancelled));
}

TEST(AttemptTest, AFailedAttemptIsKeptAndTheNextStartsFresh) {
  v1::Job job = Running(2);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  *job.mutable_result()->add_ranks() = Rank(1, 30, false);
  CloseAttempt(job, v1::ATTEMPT_OUTCOME_REQUEUED, "rank 1: boom", absl::StatusCode::kInternal, 3600,
               400);
  Requeue(job, "rank 1: boom", 2000);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.finished_unix_ms(), 0);
  EXPECT_EQ(job.queued_unix_ms(), 2000);
  EXPECT_EQ(job.reason(), "attempt 1 failed (rank 1: boom); restart 1 of 3 queued");
  EXPECT_EQ(job.result().ranks_size(), 0);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 30);
  // Two devices held for an hour, one rank reported.
  EXPECT_DOUBLE_EQ(job.result().energy().device_hours(), 2);
  StartAttempt(job, {"w0", "w1"}, 3000, 400);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.result().attempts_size(), 1);
  EXPECT_EQ(job.result().failed_attempts_size(), 1);
  EXPECT_DOUBLE_EQ(job.result().energy().earlier_attempts_joules(), 30);
  EXPECT_EQ(job.progress().test_accuracy(), -1);
}

TEST(AttemptTest, CompleteRanksTakesRankZeroAndTheSlowestAndRefusesDivergence) {
  v1::Job job = Running(2);
  *job.mutable_result()->add_ranks() = Rank(1, 5);
  *job.mutable_result()->add_ranks() = Rank(0, 5);
  ASSERT_FALSE(CompleteRanks(job).has_value());
  EXPECT_EQ(job.result().ranks(0).rank(), 0);
  EXPECT_DOUBLE_EQ(job.result().train_seconds(), 2);
  EXPECT_DOUBLE_EQ(job.result().samples_per_second(), 100);
  v1::Job diverged = Running(2);
  *diverged.mutable_result()->add_ranks() = Rank(0, 5, true, "aaaa");
  *diverged.mutable_result()->add_ranks() = Rank(1, 5, true, "bbbb");
  std::optional<std::string> why = CompleteRanks(diverged);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "the ranks ended with different parameters: rank 0 has aaaa, rank 1 has bbbb");
}

TEST(AttemptTest, LateResultsJoinTheirAttemptOnceAndMayNameTheCause) {
  v1::Job job = Running(3);
  *job.mutable_result()->add_ranks() = Rank(0, 10, false);
  CloseAttempt(job, v1::ATTEMPT_OUTCOME_REQUEUED, "rank 0 (worker w0): rank 2 left the group",
               absl::StatusCode::kAborted, 60, 400);
  Requeue(job, "rank 0 (worker w0): rank 2 left the group", 0);
  v1::ResultReport late;
  late.set_job_id(5);
  late.set_attempt(1);
  *late.mutable_result() = Rank(2, 7, false);
  late.mutable_result()->set_error("training failed: out of range");
  late.mutable_result()->set_error_code(static_cast<int>(absl::StatusCode::kInternal));
  ASSERT_TRUE(MergeLateResult(job, 2, "w2", late, 400));
  EXPECT_FALSE(MergeLateResult(job, 2, "w2", late, 400));  // counted once
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 17);
  EXPECT_EQ(job.result().failed_attempts(0),
            "attempt 1: rank 2 (worker w2): training failed: out of range");
  EXPECT_NE(job.reason().find("training failed: out of range"), std::string::npos);
  late.set_attempt(9);  // an attempt the job never had
  EXPECT_FALSE(MergeLateResult(job, 1, "w1", late, 400));
  late.set_attempt(1);  // ranks outside the world of 3
  EXPECT_FALSE(MergeLateResult(job, 3, "w9", late, 400));
  EXPECT_FALSE(MergeLateResult(job, -1, "w9", late, 400));
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 17);
}

// Issue 23: a job stopped before its ranks completed reports the steps, samples, training
// time and last evaluation it reached, as `status` showed them, whether its ranks report
// before the attempt closes or after (late); a running job's result stays empty.
TEST(AttemptTest, AStoppedJobReportsWhatItReached) {
  for (const bool late : {false, true}) {
    for (const v1::JobState state :
         {v1::JOB_STATE_CANCELLED, v1::JOB_STATE_BUDGET_EXCEEDED, v1::JOB_STATE_FAILED}) {
      SCOPED_TRACE(testing::Message() << "state " << state << (late ? ", late ranks" : ""));
      v1::Job job = Running(2);
      job.mutable_spec()->set_epochs(3);  // a late rank's history is kept within the epochs
      std::vector<v1::RankResult> ranks;
      for (int r = 0; r < 2; ++r) {
        v1::RankResult rr = Rank(r, 10);
        rr.set_ok(false);
        rr.set_cancelled(true);
        rr.set_steps(344);  // from step 44 of a checkpoint
        rr.set_resumed_from_step(44);
        rr.set_samples(300 * 64);
        rr.set_train_seconds(4 + r);
        v1::EpochRecord* e = rr.add_history();
        e->set_epoch(1);
        e->set_step(200);
        e->set_test_accuracy(0.7791);
        e->set_test_loss(0.61);
        ranks.push_back(rr);
      }
      if (!late) {
        for (const auto& rr : ranks) *job.mutable_result()->add_ranks() = rr;
      }
      CloseAttempt(job, AttemptOutcomeOf(state), "stopped", absl::StatusCode::kCancelled, 10,
                   400);
      EXPECT_EQ(job.result().steps(), 0) << "a running job's figures are its progress's";
      job.set_state(state);
      RecomputeTotals(job, 400);
      if (late) {
        for (int r = 0; r < 2; ++r) {
          v1::ResultReport report;
          report.set_job_id(5);
          report.set_attempt(1);
          *report.mutable_result() = ranks[r];
          ASSERT_TRUE(MergeLateResult(job, r, "w" + std::to_string(r), report, 400));
        }
      }
      const v1::JobResult& result = job.result();
      EXPECT_EQ(result.steps(), 344);
      EXPECT_EQ(result.resumed_from_step(), 44);
      EXPECT_EQ(result.samples(), 2 * 300 * 64);
      EXPECT_DOUBLE_EQ(result.train_seconds(), 5);
      EXPECT_DOUBLE_EQ(result.samples_per_second(), 2 * 300 * 64 / 5.0);
      EXPECT_DOUBLE_EQ(result.test_accuracy(), 0.7791);
      EXPECT_DOUBLE_EQ(result.test_loss(), 0.61);
      // Updates per device-hour count the same 300 updates the report prints.
      EXPECT_NEAR(result.energy().updates_per_device_hour(), 300 / (10 * 2 / 3600.0), 1e-6);
      EXPECT_EQ(result.attempts(0).outcome(), AttemptOutcomeOf(state));
    }
  }
}

TEST(AttemptTest, AJobThatNeverRanExpectsNoRanks) {
  v1::Job job;
  job.mutable_spec()->set_workers(3);
  job.set_state(v1::JOB_STATE_CANCELLED);
  RecomputeTotals(job, 400);
  EXPECT_EQ(job.result().energy().ranks_expected(), 0);
  EXPECT_EQ(job.result().energy().ranks_reported(), 0);
  EXPECT_EQ(job.result().energy().devices(), 0);
  EXPECT_EQ(job.result().energy().warnings_size(), 0);
}

TEST(AttemptTest, OutcomesNameHowAnAttemptEnded) {
  EXPECT_EQ(AttemptOutcomeOf(v1::JOB_STATE_SUCCEEDED), v1::ATTEMPT_OUTCOME_SUCCEEDED);
  EXPECT_EQ(AttemptOutcomeOf(v1::JOB_STATE_FAILED), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(AttemptOutcomeOf(v1::JOB_STATE_CANCELLED), v1::ATTEMPT_OUTCOME_CANCELLED);
  EXPECT_EQ(AttemptOutcomeOf(v1::JOB_STATE_BUDGET_EXCEEDED),
            v1::ATTEMPT_OUTCOME_BUDGET_EXCEEDED);
  EXPECT_EQ(AttemptOutcomeOf(v1::JOB_STATE_PENDING), v1::ATTEMPT_OUTCOME_UNSPECIFIED);
  // Stored attempts from before the enum keep their meaning: the numbers are JobState's.
  EXPECT_EQ(static_cast<int>(v1::ATTEMPT_OUTCOME_SUCCEEDED),
            static_cast<int>(v1::JOB_STATE_SUCCEEDED));
  EXPECT_EQ(static_cast<int>(v1::ATTEMPT_OUTCOME_BUDGET_EXCEEDED),
            static_cast<int>(v1::JOB_STATE_BUDGET_EXCEEDED));
}

TEST(AttemptTest, AnAssignmentCarriesTheJobsAttemptAndTheRanksPlace) {
  v1::Job job = Running(3);
  job.set_uid("00000000000000ab");
  job.mutable_spec()->set_model("mlp");
  const v1::Assignment a = AssignmentFor(job, 2, 3, "job/5/attempt/1");
  EXPECT_EQ(a.job_id(), 5);
  EXPECT_EQ(a.attempt(), job.attempt());
  EXPECT_EQ(a.rank(), 2);
  EXPECT_EQ(a.world_size(), 3);
  EXPECT_EQ(a.spec().model(), "mlp");
  EXPECT_EQ(a.job_uid(), "00000000000000ab");
  EXPECT_EQ(a.rendezvous_prefix(), "job/5/attempt/1");
}

TEST(AttemptTest, AWaitingReasonSaysWhyTheJobIsBackInTheQueue) {
  v1::Job job;
  job.mutable_spec()->set_max_restarts(3);
  EXPECT_EQ(WaitingReason(job, "waiting for 2 idle cpu workers"),
            "waiting for 2 idle cpu workers");  // never ran
  job.set_attempt(1);  // ran, none failed: a coordinator restart cut it
  EXPECT_EQ(WaitingReason(job, "w"), "re-queued: the coordinator restarted during attempt 1; w");
  job.mutable_result()->add_failed_attempts("rank 1 lost");
  EXPECT_EQ(WaitingReason(job, "w"), "restart 1 of 3 (rank 1 lost): w");
}

}  // namespace
}  // namespace joule::server
