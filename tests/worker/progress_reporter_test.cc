#include "worker/train/progress_reporter.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/testing/fake_clock.h"

namespace joule::worker {
namespace {

using std::chrono::milliseconds;

struct Fixture {
  testing::FakeClock clock;
  std::vector<v1::RankProgress> seen;
  ProgressReporter::Sink sink() {
    return [this](const v1::RankProgress& p) { seen.push_back(p); };
  }
};

TEST(ProgressReporterTest, ReportsAtMostOncePerPeriodWithTheWindowsMeans) {
  Fixture f;
  const auto start = f.clock.Now();
  f.clock.Advance(milliseconds(500));  // set-up before the loop
  ProgressReporter r(f.sink(), /*period_seconds=*/1.0, /*global_batch=*/64,
                     /*steps_per_epoch=*/10, /*first_step=*/0, /*test_accuracy=*/-1, f.clock,
                     start);
  r.SetEpoch(1);
  r.AddStep(2.0);
  r.MaybeReport(1, 0.25);
  f.clock.Advance(milliseconds(999));
  r.AddStep(4.0);
  r.MaybeReport(2, 0.5);
  EXPECT_TRUE(f.seen.empty()) << "within the period";
  f.clock.Advance(milliseconds(1));
  r.AddStep(6.0);
  r.MaybeReport(3, 0.75);
  ASSERT_EQ(f.seen.size(), 1u);
  const v1::RankProgress& p = f.seen[0];
  EXPECT_EQ(p.epoch(), 1);
  EXPECT_EQ(p.steps_per_epoch(), 10);
  EXPECT_EQ(p.step(), 3);
  EXPECT_EQ(p.samples(), 3 * 64);
  EXPECT_DOUBLE_EQ(p.loss(), 4.0);                      // (2 + 4 + 6) / 3
  EXPECT_DOUBLE_EQ(p.samples_per_second(), 192 / 0.75);  // over training time only
  EXPECT_DOUBLE_EQ(p.elapsed_seconds(), 1.5);            // since the attempt started
  EXPECT_DOUBLE_EQ(p.test_accuracy(), -1);
  // The next window starts afresh.
  f.clock.Advance(milliseconds(1000));
  r.AddStep(1.0);
  r.MaybeReport(4, 1.75);
  ASSERT_EQ(f.seen.size(), 2u);
  EXPECT_DOUBLE_EQ(f.seen[1].loss(), 1.0);
  EXPECT_DOUBLE_EQ(f.seen[1].samples_per_second(), 64 / 1.0);
}

TEST(ProgressReporterTest, ForcedReportsKeepTheLastLossAndRateWhenThereIsNoNewOne) {
  Fixture f;
  ProgressReporter r(f.sink(), 1.0, 10, 5, 0, -1, f.clock, f.clock.Now());
  r.AddStep(3.0);
  r.Report(1, 2.0);  // forced: no time has passed on the clock
  ASSERT_EQ(f.seen.size(), 1u);
  EXPECT_DOUBLE_EQ(f.seen[0].loss(), 3.0);
  EXPECT_DOUBLE_EQ(f.seen[0].samples_per_second(), 5.0);
  // After an evaluation: no step and no training time since the last report.
  r.SetEvaluation(0.75, 0.5);
  r.Report(1, 2.0);
  ASSERT_EQ(f.seen.size(), 2u);
  EXPECT_DOUBLE_EQ(f.seen[1].loss(), 3.0);
  EXPECT_DOUBLE_EQ(f.seen[1].samples_per_second(), 5.0);
  EXPECT_DOUBLE_EQ(f.seen[1].test_accuracy(), 0.75);
  EXPECT_DOUBLE_EQ(f.seen[1].test_loss(), 0.5);
  EXPECT_DOUBLE_EQ(r.progress().test_accuracy(), 0.75);
}

TEST(ProgressReporterTest, AResumedAttemptMeasuresFromWhereItResumed) {
  Fixture f;
  ProgressReporter r(f.sink(), 1.0, 32, 100, /*first_step=*/250, /*test_accuracy=*/0.5,
                     f.clock, f.clock.Now());
  EXPECT_DOUBLE_EQ(r.progress().test_accuracy(), 0.5);
  for (int i = 0; i < 10; ++i) r.AddStep(1.0);
  r.Report(260, 2.0);
  ASSERT_EQ(f.seen.size(), 1u);
  EXPECT_EQ(f.seen[0].samples(), 260 * 32);
  EXPECT_DOUBLE_EQ(f.seen[0].samples_per_second(), 10 * 32 / 2.0);
}

TEST(ProgressReporterTest, WithoutASinkNothingIsReported) {
  testing::FakeClock clock;
  ProgressReporter r(nullptr, 0.0, 64, 10, 0, -1, clock, clock.Now());
  r.AddStep(1.0);
  r.MaybeReport(1, 1.0);
  r.Report(1, 1.0);
  EXPECT_EQ(r.progress().step(), 0);
}

}  // namespace
}  // namespace joule::worker
