#include "client/tune_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace joule::client {
namespace {

TuneCellForecast Known(const std::string& key, double epoch_s, double epoch_ci, double rung_s,
                       double rung_j, double rung_ci) {
  TuneCellForecast f;
  f.key = key;
  f.known = true;
  f.first_epoch_seconds = epoch_s;
  f.first_epoch_seconds_ci95 = epoch_ci;
  f.first_rung_seconds = rung_s;
  f.first_rung_joules = rung_j;
  f.first_rung_joules_ci95 = rung_ci;
  return f;
}

TuneCellForecast Unknown(const std::string& key) {
  TuneCellForecast f;
  f.key = key;
  f.unknown_why = "no history";
  return f;
}

TuneOptions Options(TuneObjective objective) {
  TuneOptions o;
  o.objective = objective;
  o.target_accuracy = 0.85;
  o.max_epochs = 8;
  return o;
}

TEST(TunePlanTest, OrdersTheEstimatedCellsCheapestFirstByTheObjectiveAndTheUnknownLast) {
  const std::vector<TuneCellForecast> cells = {Unknown("u1"), Known("a", 10, 1, 20, 300, 10),
                                               Known("b", 5, 1, 10, 500, 10), Unknown("u2"),
                                               Known("c", 20, 1, 40, 100, 10)};
  TuneFirstRungPlan by_energy =
      PlanFirstTuneRung(cells, Options(TuneObjective::kEnergyToAccuracy), 0);
  EXPECT_EQ(by_energy.order, (std::vector<std::string>{"c", "a", "b", "u1", "u2"}));
  EXPECT_TRUE(by_energy.skipped.empty());
  EXPECT_EQ(PlanFirstTuneRung(cells, Options(TuneObjective::kEnergy), 0).order, by_energy.order);
  EXPECT_EQ(PlanFirstTuneRung(cells, Options(TuneObjective::kTimeToAccuracy), 0).order,
            (std::vector<std::string>{"b", "a", "c", "u1", "u2"}));
}

// Over max_wall_time with confidence: the interval wholly above, or the estimate over
// twice the limit. Inside the interval, or without one and under twice: kept.
TEST(TunePlanTest, SkipsOnlyCellsWhoseFirstEpochIsConfidentlyOverMaxWallTime) {
  TuneOptions o = Options(TuneObjective::kEnergyToAccuracy);
  o.max_wall_time_seconds = 100;
  const std::vector<TuneCellForecast> cells = {
      Known("interval-above", 130, 20, 260, 10, 1),   // 110 .. 150: above
      Known("interval-across", 130, 40, 260, 10, 1),  // 90 .. 170: may meet it
      Known("no-interval-under-twice", 190, 0, 380, 10, 1),
      Known("no-interval-over-twice", 210, 0, 420, 10, 1),
      Known("under", 60, 5, 120, 10, 1),
      Unknown("unknown")};
  const TuneFirstRungPlan plan = PlanFirstTuneRung(cells, o, 0);
  EXPECT_EQ(plan.skipped.size(), 2u);
  ASSERT_EQ(plan.skipped.count("interval-above"), 1u);
  EXPECT_NE(plan.skipped.at("interval-above").find("max_wall_time 100 s"), std::string::npos)
      << plan.skipped.at("interval-above");
  EXPECT_EQ(plan.skipped.count("no-interval-over-twice"), 1u);
  EXPECT_EQ(plan.order, (std::vector<std::string>{"interval-across", "no-interval-under-twice",
                                                  "under", "unknown"}));
  // Without the constraint nothing is skipped.
  o.max_wall_time_seconds = 0;
  EXPECT_TRUE(PlanFirstTuneRung(cells, o, 0).skipped.empty());
}

TEST(TunePlanTest, SkipsCellsWhoseFirstRungAloneIsConfidentlyOverTheSearchBudget) {
  const TuneOptions o = Options(TuneObjective::kEnergyToAccuracy);
  const std::vector<TuneCellForecast> cells = {Known("big", 1, 0, 2, 5000, 500),
                                               Known("close", 1, 0, 2, 1100, 300),
                                               Known("small", 1, 0, 2, 200, 50)};
  const TuneFirstRungPlan plan = PlanFirstTuneRung(cells, o, 1000);
  ASSERT_EQ(plan.skipped.size(), 1u);
  EXPECT_NE(plan.skipped.at("big").find("search budget of 1000 J"), std::string::npos)
      << plan.skipped.at("big");
  EXPECT_EQ(plan.order, (std::vector<std::string>{"small", "close"}));
}

}  // namespace
}  // namespace joule::client
