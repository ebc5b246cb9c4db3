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

TEST(LiveAttemptTest, TheStragglerComesFromResultsWhereRanksReportedAndProgressElsewhere) {
  LiveAttempt live;
  // Progress: both ranks step in 1 s and wait alike: nobody stands out.
  for (int rank : {0, 1}) {
    v1::RankProgress p = Report(10, 10, 10, 1.0);
    p.set_collective_wait_seconds(0.3);
    live.Record(rank, "progress-host", p);
  }
  EXPECT_FALSE(live.Straggler().has_value());
  // Rank 1's result: over the whole attempt it waited almost nothing, rank 0 waited 0.3 s
  // of each 1 s step on it, and its compute is the others': it arrives late.
  google::protobuf::RepeatedPtrField<v1::RankResult> results;
  v1::RankResult* r1 = results.Add();
  r1->set_rank(1);
  r1->set_step_seconds(1.0);
  r1->set_collective_wait_seconds(0.0);
  v1::RankResult* unreported = results.Add();  // no timing in it: progress stands
  unreported->set_rank(0);
  const std::optional<v1::Straggler> s =
      live.Straggler(results, [](int32_t rank) { return "host-" + std::to_string(rank); });
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank(), 1);
  EXPECT_EQ(s->host(), "host-1");  // the result's rank is named where it runs
}

TEST(LiveAttemptTest, UnreportedJoulesAreThoseOfRanksWithoutAResult) {
  LiveAttempt live;
  live.Record(0, "a", Report(1, 10, 10));
  live.Record(1, "b", Report(1, 12, 12));
  live.Record(2, "c", Report(1, 14, 14));
  google::protobuf::RepeatedField<int32_t> reported;
  reported.Add(1);
  EXPECT_EQ(live.UnreportedJoules(reported), (std::map<int32_t, double>{{0, 10}, {2, 14}}));
  reported.Add(0);
  reported.Add(2);
  EXPECT_TRUE(live.UnreportedJoules(reported).empty());
}

}  // namespace
}  // namespace joule::server
