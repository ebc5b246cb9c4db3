#include "server/live_attempt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace joule::server {
namespace {

v1::RankProgress Report(double elapsed, double watts, double joules, double step_seconds = 0) {
  v1::RankProgress p;
  p.set_elapsed_seconds(elapsed);
  p.set_power_watts(watts);
  p.set_energy_joules(joules);
  p.set_step_seconds(step_seconds);
  return p;
}

TEST(LiveAttemptTest, RanksEnergyAndPowerAddUpFromTheirLatestReports) {
  LiveAttempt live;
  EXPECT_EQ(live.RanksJoules(), 0);
  EXPECT_EQ(live.Watts(), 0);
  live.Record(0, "a", Report(1, 10, 10));
  live.Record(1, "b", Report(1, 12, 12));
  live.Record(0, "a", Report(2, 11, 21));  // rank 0 again: its newest figures count
  EXPECT_DOUBLE_EQ(live.RanksJoules(), 21 + 12);
  EXPECT_DOUBLE_EQ(live.Watts(), 11 + 12);
  const std::vector<v1::RankPower> power = live.Power();
  ASSERT_EQ(power.size(), 2u);
  EXPECT_EQ(power[0].rank(), 0);
  ASSERT_EQ(power[0].samples_size(), 2);
  EXPECT_DOUBLE_EQ(power[0].samples(1).joules(), 21);
  EXPECT_EQ(power[1].samples_size(), 1);
}

// A worker is not trusted: what is not a number, or goes back in time, is left out.
TEST(LiveAttemptTest, FiguresThatAreNotNumbersOrGoBackInTimeAreLeftOut) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  LiveAttempt live;
  live.Record(0, "a", Report(5, 10, 50));
  for (const v1::RankProgress& bad :
       {Report(6, nan, 60), Report(6, inf, 60), Report(nan, 10, 60), Report(4, 10, 60),
        Report(5, 10, 60)}) {
    live.Record(0, "a", bad);
  }
  ASSERT_EQ(live.Power()[0].samples_size(), 1);  // none of them made a sample
  EXPECT_DOUBLE_EQ(live.Watts(), 10);
  live.Record(0, "a", Report(7, 10, nan));
  live.Record(0, "a", Report(8, 10, -1));
  EXPECT_DOUBLE_EQ(live.RanksJoules(), 60);  // the last finite, non-negative figure
}

TEST(LiveAttemptTest, PowerKeepsTheNewestSamplesAndTimingOnlyWhatRanksMeasured) {
  LiveAttempt live;
  for (size_t i = 1; i <= LiveAttempt::kMaxPowerPoints + 50; ++i) {
    live.Record(0, "a", Report(static_cast<double>(i), 10, static_cast<double>(i)));
  }
  const v1::RankPower series = live.Power()[0];
  ASSERT_EQ(series.samples_size(), static_cast<int>(LiveAttempt::kMaxPowerPoints));
  EXPECT_DOUBLE_EQ(series.samples(0).elapsed_seconds(), 51);
  EXPECT_TRUE(live.timing().empty());  // no step timed yet
  v1::RankProgress timed = Report(1000, 10, 1000, 0.25);
  timed.set_collective_wait_seconds(0.05);
  timed.add_links()->set_peer(1);
  live.Record(0, "host-a", timed);
  ASSERT_EQ(live.timing().size(), 1u);
  const RankTiming& t = live.timing().at(0);
  EXPECT_EQ(t.host, "host-a");
  EXPECT_DOUBLE_EQ(t.step_seconds, 0.25);
  EXPECT_DOUBLE_EQ(t.collective_wait_seconds, 0.05);
  EXPECT_EQ(t.links.size(), 1u);
}

}  // namespace
}  // namespace joule::server
