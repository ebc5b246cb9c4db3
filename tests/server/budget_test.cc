#include "server/budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "common/job_spec.h"

namespace joule::server {
namespace {

BudgetInput In(double budget, double spent, bool warned = false, double watts = 0,
               double sps = 0, int64_t gbs = 64) {
  BudgetInput in;
  in.budget_joules = budget;
  in.joules_so_far = spent;
  in.warned = warned;
  in.watts = watts;
  in.samples_per_second = sps;
  in.global_batch = gbs;
  return in;
}

TEST(BudgetTest, NoBudgetAsksForNothing) {
  for (double budget : {0.0, -5.0, std::numeric_limits<double>::quiet_NaN()}) {
    const BudgetDecision d = DecideBudget(In(budget, 1e9, false, 100, 1000));
    EXPECT_FALSE(d.stop);
    EXPECT_FALSE(d.warning);
    EXPECT_FALSE(d.warn_now);
  }
}

// Warned once at 90%, and the warning kept after (even if the share were to drop).
TEST(BudgetTest, NinetyPercentWarnsOnceAndStaysWarned) {
  EXPECT_FALSE(DecideBudget(In(100, 89.9)).warning);
  const BudgetDecision at = DecideBudget(In(100, 90));
  EXPECT_TRUE(at.warning);
  EXPECT_TRUE(at.warn_now);
  EXPECT_DOUBLE_EQ(at.used, 0.9);
  const BudgetDecision after = DecideBudget(In(100, 95, /*warned=*/true));
  EXPECT_TRUE(after.warning);
  EXPECT_FALSE(after.warn_now);
  EXPECT_TRUE(DecideBudget(In(100, 10, /*warned=*/true)).warning);
}

// The stop comes when the spend plus what stopping costs reaches the budget: 10 W for
// kStopCheckInterval steps of 64 / 640 = 0.1 s and one progress period.
TEST(BudgetTest, TheStopIsForecastFromPowerAndThroughput) {
  const double stop_seconds = kStopCheckInterval * 0.1 + kProgressPeriodSeconds;
  const double to_come = 10 * stop_seconds;
  const BudgetDecision before = DecideBudget(In(100, 100 - to_come - 0.01, false, 10, 640));
  EXPECT_FALSE(before.stop);
  EXPECT_NEAR(before.stop_seconds, stop_seconds, 1e-12);
  const BudgetDecision at = DecideBudget(In(100, 100 - to_come, false, 10, 640));
  EXPECT_TRUE(at.stop);
  EXPECT_TRUE(at.warning);
  EXPECT_NEAR(at.joules_to_come, to_come, 1e-9);
  EXPECT_NE(at.reason.find("energy budget reached"), std::string::npos) << at.reason;
  EXPECT_NE(at.reason.find("of 100 J"), std::string::npos) << at.reason;
  // Spent already: a stop without any forecast.
  EXPECT_TRUE(DecideBudget(In(100, 100)).stop);
  EXPECT_FALSE(DecideBudget(In(100, 99.9)).stop);
}

// Ranks not heard from yet spend like the mean of those heard: one rank of four heard at
// 10 J and 5 W forecasts 30 J more so far and 20 W more while they stop.
TEST(BudgetTest, RanksNotHeardFromYetAreForecastAsTheMeanOfThoseHeard) {
  BudgetInput in = In(100, 10, false, 5, 0);
  in.world_size = 4;
  in.ranks_heard = 1;
  in.ranks_heard_joules = 10;
  const BudgetDecision d = DecideBudget(in);
  EXPECT_NEAR(d.silent_ranks_joules, 30, 1e-9);
  EXPECT_NEAR(d.joules_to_come, 30 + 20 * kProgressPeriodSeconds, 1e-9);
  EXPECT_DOUBLE_EQ(d.used, 0.1) << "the share shown is what was measured";
  EXPECT_FALSE(d.stop);
  in.joules_so_far = in.ranks_heard_joules = 50;  // 50 + 150 silent: over
  const BudgetDecision over = DecideBudget(in);
  EXPECT_TRUE(over.stop);
  EXPECT_NE(over.reason.find("3 of 4 ranks not heard from yet"), std::string::npos) << over.reason;
  // The same spend with every rank heard is under the budget.
  in.ranks_heard = 4;
  EXPECT_FALSE(DecideBudget(in).stop);
  EXPECT_DOUBLE_EQ(DecideBudget(in).silent_ranks_joules, 0);
  // Nobody heard, an unknown world, more heard than the world, bad figures: no forecast.
  for (auto [world, heard, joules] :
       {std::tuple{4, 0, 50.0}, std::tuple{0, 1, 50.0}, std::tuple{2, 3, 50.0},
        std::tuple{4, 1, std::numeric_limits<double>::quiet_NaN()}, std::tuple{4, 1, -5.0}}) {
    in.world_size = world;
    in.ranks_heard = heard;
    in.ranks_heard_joules = joules;
    const BudgetDecision d2 = DecideBudget(in);
    EXPECT_DOUBLE_EQ(d2.silent_ranks_joules, 0) << world << " " << heard << " " << joules;
    EXPECT_TRUE(std::isfinite(d2.joules_to_come));
  }
}

// Power and throughput that are not numbers, or negative, count as nothing to come.
TEST(BudgetTest, BadPowerOrThroughputCountsAsNothingToCome) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double watts : {nan, inf, -50.0}) {
    const BudgetDecision d = DecideBudget(In(100, 99, false, watts, 640));
    EXPECT_FALSE(d.stop) << watts;
    EXPECT_DOUBLE_EQ(d.joules_to_come, 0) << watts;
  }
  for (double sps : {nan, inf, -1.0, 0.0}) {
    const BudgetDecision d = DecideBudget(In(100, 50, false, 10, sps));
    EXPECT_DOUBLE_EQ(d.stop_seconds, kProgressPeriodSeconds) << sps;
    EXPECT_TRUE(std::isfinite(d.joules_to_come)) << sps;
  }
}

}  // namespace
}  // namespace joule::server
