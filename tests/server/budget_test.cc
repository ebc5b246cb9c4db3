#include "server/budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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
