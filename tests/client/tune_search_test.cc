#include "common/tune_search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/sweep_charts.h"

namespace joule::client {
namespace {

// A synthetic cell: its test accuracy after e epochs, and what an epoch costs.
struct Curve {
  std::function<double(int)> accuracy;
  double seconds_per_epoch = 1;
  double joules_per_epoch = 1;
};

// The cell's history after `epochs` epochs (a start-up epoch costs 1.5 epochs' worth).
TuneCell RunCell(const std::string& key, const Curve& c, int epochs) {
  TuneCell cell;
  cell.key = key;
  for (int e = 1; e <= epochs; ++e) {
    cell.epochs.push_back(
        {e, c.accuracy(e), (e + 0.5) * c.seconds_per_epoch, (e + 0.5) * c.joules_per_epoch});
  }
  return cell;
}

// The truth the search must find: each cell's measured cost to the target when run to
// max_epochs, and the cheapest cell.
std::string BestByGrid(const std::map<std::string, Curve>& grid, const TuneOptions& o) {
  std::string best;
  double cost = std::numeric_limits<double>::infinity();
  for (const auto& [key, c] : grid) {
    const TuneProjection p = ProjectToTarget(RunCell(key, c, o.max_epochs), o);
    if (p.reached && TuneScore(p, o) < cost) {
      cost = TuneScore(p, o);
      best = key;
    }
  }
  return best;
}

// Successive halving over `grid` as `joule tune` runs it: every cell to the first rung,
// then the promoted ones on, a rung at a time. Returns the outcome; *epochs_run: the
// epochs trained in all (a promoted cell resumes: its earlier epochs are not run again).
TuneOutcome Search(const std::map<std::string, Curve>& grid, const TuneOptions& o, int* epochs_run,
                   std::map<std::string, std::string>* stopped = nullptr) {
  const std::vector<int> rungs = RungEpochs(o);
  std::map<std::string, int> at;  // key -> epochs run
  std::vector<std::string> active;
  for (const auto& [key, c] : grid) active.push_back(key);
  std::vector<TuneCell> done;
  *epochs_run = 0;
  for (int r : rungs) {
    std::vector<TuneCell> ran;
    for (const std::string& key : active) {
      *epochs_run += r - at[key];
      at[key] = r;
      ran.push_back(RunCell(key, grid.at(key), r));
    }
    const TuneRungDecision d = DecideRung(ran, o, done);
    for (const TuneCell& c : ran) {
      if (std::find(d.finished.begin(), d.finished.end(), c.key) != d.finished.end()) {
        done.push_back(c);
      }
    }
    if (stopped) stopped->insert(d.stopped.begin(), d.stopped.end());
    active = d.promoted;
    if (active.empty()) break;
  }
  std::vector<TuneCell> all;
  for (const auto& [key, c] : grid) all.push_back(RunCell(key, c, at[key]));
  return ChooseTuneCell(all, o);
}

TuneOptions Options(int max_epochs) {
  TuneOptions o;
  o.target_accuracy = 0.85;
  o.min_epochs = 2;
  o.max_epochs = max_epochs;
  o.eta = 2;
  return o;
}

// Error falling as a power law: accuracy = 1 - a / e^b.
Curve PowerLaw(double a, double b, double seconds, double joules) {
  return {[a, b](int e) { return 1 - a / std::pow(e, b); }, seconds, joules};
}

TEST(TuneSearchTest, RungsDoubleFromTheFirstAndEndAtTheLastEpoch) {
  TuneOptions o = Options(10);
  EXPECT_EQ(RungEpochs(o), (std::vector<int>{2, 4, 8, 10}));
  o.max_epochs = 8;
  EXPECT_EQ(RungEpochs(o), (std::vector<int>{2, 4, 8}));
  o.max_epochs = 1;
  EXPECT_EQ(RungEpochs(o), (std::vector<int>{1}));
  o.max_epochs = 0;
  EXPECT_TRUE(RungEpochs(o).empty());
  o.max_epochs = 30;
  o.eta = 3;
  EXPECT_EQ(RungEpochs(o), (std::vector<int>{2, 6, 18, 30}));
}

// An exact power law is projected where it meets the target: err 0.5 / e^0.5 is 0.15 at
// e = (0.5 / 0.15)^2 = 11.1, and the cost of the epochs to go is the recent rate's.
TEST(TuneSearchTest, APowerLawIsProjectedToWhereItMeetsTheTarget) {
  const TuneOptions o = Options(20);
  const TuneProjection p = ProjectToTarget(RunCell("c", PowerLaw(0.5, 0.5, 2, 10), 4), o);
  ASSERT_TRUE(p.feasible) << p.why;
  EXPECT_FALSE(p.reached);
  EXPECT_NEAR(p.epoch, std::pow(0.5 / 0.15, 2), 1e-6);
  EXPECT_NEAR(p.joules, 4.5 * 10 + (p.epoch - 4) * 10, 1e-6);
  EXPECT_NEAR(p.seconds, 4.5 * 2 + (p.epoch - 4) * 2, 1e-6);
  EXPECT_NEAR(p.total_joules, 20.5 * 10, 1e-6);
  // Reached: measured at the first epoch past the target, not projected.
  const TuneProjection m = ProjectToTarget(RunCell("c", PowerLaw(0.5, 0.5, 2, 10), 14), o);
  EXPECT_TRUE(m.reached);
  EXPECT_EQ(m.epoch, 12);
  EXPECT_DOUBLE_EQ(m.joules, 12.5 * 10);
  // Past the last epoch: not feasible, and it says where it would arrive.
  const TuneProjection far =
      ProjectToTarget(RunCell("c", PowerLaw(0.5, 0.5, 2, 10), 4), Options(8));
  EXPECT_FALSE(far.feasible);
  EXPECT_NE(far.why.find("11.1 epochs"), std::string::npos) << far.why;
  // One epoch: no curve; a flat curve: never.
  EXPECT_FALSE(ProjectToTarget(RunCell("c", PowerLaw(0.5, 0.5, 2, 10), 1), o).feasible);
  const TuneProjection flat = ProjectToTarget(RunCell("c", {[](int) { return 0.7; }, 1, 1}, 4), o);
  EXPECT_FALSE(flat.feasible);
  EXPECT_NE(flat.why.find("stopped rising"), std::string::npos) << flat.why;
  EXPECT_FALSE(ProjectToTarget(TuneCell{}, o).feasible);
}

// A grid of 16 cells whose answer is known: the search finds the grid's best for energy
// and for time (they differ), training fewer epochs than the grid.
TEST(TuneSearchTest, FindsTheGridsBestForEnergyAndForTimeForLessThanTheGrid) {
  std::map<std::string, Curve> grid;
  for (int workers : {1, 2}) {
    for (int batch : {64, 128, 256, 512}) {
      for (int threads : {1, 2}) {
        // Larger batches learn slower per epoch; more workers and threads are faster per
        // epoch but each costs power.
        const double b = 0.9 - 0.12 * std::log2(batch / 64.0);
        const double seconds = 40.0 / (workers * (threads == 2 ? 1.6 : 1)) * (64.0 / batch + 0.6);
        const double watts = 10 + 8 * workers * threads;
        grid["w" + std::to_string(workers) + ",b" + std::to_string(batch) + ",t" +
             std::to_string(threads)] = PowerLaw(0.45, b, seconds, seconds * watts);
      }
    }
  }
  for (TuneObjective objective :
       {TuneObjective::kEnergyToAccuracy, TuneObjective::kTimeToAccuracy}) {
    TuneOptions o = Options(16);
    o.objective = objective;
    const std::string truth = BestByGrid(grid, o);
    ASSERT_FALSE(truth.empty());
    int epochs = 0;
    const TuneOutcome out = Search(grid, o, &epochs);
    EXPECT_EQ(out.chosen, truth) << static_cast<int>(objective);
    EXPECT_LT(epochs, 16 * 16 / 2) << "the search trained half the grid's epochs or more";
    ASSERT_FALSE(out.front.empty());
    EXPECT_NE(std::find(out.front.begin(), out.front.end(), out.chosen), out.front.end());
  }
  // The two objectives choose differently here (the test would not tell them apart else).
  TuneOptions energy = Options(16), time = Options(16);
  time.objective = TuneObjective::kTimeToAccuracy;
  EXPECT_NE(BestByGrid(grid, energy), BestByGrid(grid, time));
}

// The case successive halving is known to lose (Li et al. 2018, section 3): a cell that
// starts slowly and wins later. Ranked by today's accuracy it would go at the first rung;
// ranked by its projection to the target it survives, and the fast starter whose curve
// flattens below the target is stopped.
TEST(TuneSearchTest, ALateBloomerSurvivesAndAPlateauIsStopped) {
  std::map<std::string, Curve> grid;
  grid["plateau"] = {[](int e) { return 0.84 - 0.2 * std::exp(-1.2 * e); }, 1, 5};
  grid["late"] = PowerLaw(0.9, 0.75, 1, 5);       // 0.46 after 2 epochs, 0.85 after ~11
  grid["slow-cheap"] = PowerLaw(0.9, 0.3, 1, 1);  // never within 16 epochs
  ASSERT_GT(grid["plateau"].accuracy(2), grid["late"].accuracy(2));
  const TuneOptions o = Options(16);
  std::map<std::string, std::string> stopped;
  int epochs = 0;
  const TuneOutcome out = Search(grid, o, &epochs, &stopped);
  EXPECT_EQ(out.chosen, "late");
  EXPECT_EQ(BestByGrid(grid, o), "late");
  ASSERT_TRUE(stopped.count("plateau"));
  // Stopped for its curve (flat, or arriving far past the last epoch), not for its rank.
  EXPECT_TRUE(stopped["plateau"].find("stopped rising") != std::string::npos ||
              stopped["plateau"].find("past the last rung") != std::string::npos)
      << stopped["plateau"];
  ASSERT_TRUE(stopped.count("slow-cheap"));
  EXPECT_NE(stopped["slow-cheap"].find("past the last rung"), std::string::npos)
      << stopped["slow-cheap"];
}

// Constraints stop cells: one projected past max_wall_time, one slower than
// max_slowdown x the fastest; a failed cell is never promoted or chosen.
TEST(TuneSearchTest, ConstraintsAndFailuresStopCells) {
  TuneOptions o = Options(16);
  o.eta = 2;
  std::vector<TuneCell> ran = {RunCell("fast", PowerLaw(0.5, 0.5, 1, 10), 2),
                               RunCell("slow", PowerLaw(0.5, 0.5, 5, 1), 2),
                               RunCell("broken", PowerLaw(0.5, 0.5, 1, 1), 2)};
  ran[2].failed = true;
  o.max_wall_time_seconds = 30;  // fast: ~11.6 s; slow: ~58 s
  TuneRungDecision d = DecideRung(ran, o);
  EXPECT_EQ(d.promoted, (std::vector<std::string>{"fast"}));
  EXPECT_NE(d.stopped["slow"].find("max_wall_time"), std::string::npos) << d.stopped["slow"];
  EXPECT_NE(d.stopped["broken"].find("did not succeed"), std::string::npos);
  o.max_wall_time_seconds = 0;
  o.max_slowdown = 2;
  d = DecideRung(ran, o);
  EXPECT_NE(d.stopped["slow"].find("max_slowdown"), std::string::npos) << d.stopped["slow"];
  // Without constraints "slow" is cheaper in joules: it ranks first (and two go on).
  o.max_slowdown = 0;
  d = DecideRung(ran, o);
  EXPECT_EQ(d.promoted, (std::vector<std::string>{"slow", "fast"}));
  // Of four feasible cells, eta 2 keeps two; eta 4 keeps two as well (never fewer).
  std::vector<TuneCell> four;
  for (int i = 0; i < 4; ++i) {
    four.push_back(RunCell("c" + std::to_string(i), PowerLaw(0.5, 0.5, 1, 1 + i), 2));
  }
  d = DecideRung(four, o);
  EXPECT_EQ(d.promoted, (std::vector<std::string>{"c0", "c1"}));
  EXPECT_NE(d.stopped["c3"].find("ranked 4 of 4"), std::string::npos) << d.stopped["c3"];
  o.eta = 4;
  EXPECT_EQ(DecideRung(four, o).promoted.size(), 2u);
  o.eta = 2;
  // A cell measured earlier bounds the ranking: nothing projected dearer goes on.
  const TuneCell measured = RunCell("measured", PowerLaw(0.5, 0.5, 0.1, 0.1), 14);
  d = DecideRung(ran, o, {measured});
  EXPECT_TRUE(d.promoted.empty());
  EXPECT_NE(d.stopped["slow"].find("no better than"), std::string::npos) << d.stopped["slow"];
  TuneOutcome out = ChooseTuneCell(ran, o);
  EXPECT_EQ(out.chosen, "");  // none reached the target
}

// The front: no cell on it is both slower and dearer than another that reached the
// target.
TEST(TuneSearchTest, TheFrontHoldsTheCellsNoOtherBeatsOnBothTimeAndEnergy) {
  const TuneOptions o = Options(16);
  std::vector<TuneCell> cells = {RunCell("quick-dear", PowerLaw(0.5, 0.5, 1, 10), 13),
                                 RunCell("slow-cheap", PowerLaw(0.5, 0.5, 3, 2), 13),
                                 RunCell("dominated", PowerLaw(0.5, 0.5, 3, 12), 13),
                                 RunCell("short", PowerLaw(0.5, 0.5, 1, 1), 3)};
  const TuneOutcome out = ChooseTuneCell(cells, o);
  EXPECT_EQ(out.front, (std::vector<std::string>{"quick-dear", "slow-cheap"}));
  EXPECT_EQ(out.chosen, "slow-cheap");
  EXPECT_FALSE(out.projections.at("short").reached);
}

// A rung job of cell `cell`: its epochs (accuracy, seconds and joules from its own start).
v1::Job RungJob(const std::string& cell, int rung, v1::JobState state,
                std::vector<std::tuple<int, double, double, double>> epochs, double wall,
                double joules) {
  v1::Job j;
  j.set_state(state);
  (*j.mutable_spec()->mutable_labels())["cell"] = cell;
  (*j.mutable_spec()->mutable_labels())["rung"] = std::to_string(rung);
  for (const auto& [epoch, accuracy, seconds, spent] : epochs) {
    v1::EpochRecord* h = j.mutable_result()->add_history();
    h->set_epoch(epoch);
    h->set_test_accuracy(accuracy);
    h->set_elapsed_seconds(seconds);
    h->set_joules(spent);
  }
  j.mutable_result()->set_wall_seconds(wall);
  j.mutable_result()->mutable_energy()->set_total_joules(joules);
  return j;
}

// A tune's jobs become its cells: the rungs' epochs in order, each later rung's seconds
// and joules after the earlier rungs' totals; a failed rung fails the cell; a rung not
// ended yet ends its history; jobs without the labels are left out.
TEST(TuneSearchTest, TheCellsComeFromTheRungJobsCumulatively) {
  std::vector<v1::Job> jobs = {
      RungJob("a", 1, v1::JOB_STATE_SUCCEEDED, {{3, 0.8, 2, 20}, {4, 0.86, 4, 40}}, 5, 45),
      RungJob("a", 0, v1::JOB_STATE_SUCCEEDED, {{1, 0.6, 3, 30}, {2, 0.7, 6, 60}}, 7, 70),
      RungJob("b", 0, v1::JOB_STATE_FAILED, {{1, 0.5, 3, 30}}, 4, 35),
      RungJob("c", 0, v1::JOB_STATE_SUCCEEDED, {{1, 0.65, 2, 10}, {2, 0.75, 4, 20}}, 5, 25),
      RungJob("c", 1, v1::JOB_STATE_RUNNING, {{3, 0.8, 2, 10}}, 0, 0)};
  jobs.push_back(v1::Job());  // no labels
  std::map<std::string, int> rungs;
  const std::map<std::string, TuneCell> cells = TuneCellsFromJobs(jobs, &rungs);
  ASSERT_EQ(cells.size(), 3u);
  const TuneCell& a = cells.at("a");
  ASSERT_EQ(a.epochs.size(), 4u);
  EXPECT_EQ(a.epochs[2].epoch, 3);
  EXPECT_DOUBLE_EQ(a.epochs[2].seconds, 7 + 2);
  EXPECT_DOUBLE_EQ(a.epochs[3].joules, 70 + 40);
  EXPECT_FALSE(a.failed);
  EXPECT_EQ(rungs["a"], 2);
  EXPECT_TRUE(cells.at("b").failed);
  EXPECT_EQ(cells.at("c").epochs.size(), 2u);  // its rung 1 runs
  EXPECT_EQ(rungs["c"], 1);
  // And its charts: a path a cell with the target's rule; the front of those that
  // reached the target, the chosen one marked.
  TuneOptions o = Options(4);
  o.target_accuracy = 0.85;
  std::vector<TuneCell> list;
  for (const auto& [key, cell] : cells) list.push_back(cell);
  const std::vector<Chart> charts = TuneCharts(list, o);
  ASSERT_EQ(charts.size(), 2u);
  EXPECT_EQ(charts[0].id, "tune-paths");
  EXPECT_EQ(charts[0].spec["data"]["values"].size(), 4u + 2u);  // b failed: no epochs
  EXPECT_EQ(charts[0].spec["layer"][1]["data"]["values"][0]["accuracy"], 0.85);
  EXPECT_EQ(charts[1].id, "tune-front");
  ASSERT_EQ(charts[1].spec["data"]["values"].size(), 1u);
  EXPECT_EQ(charts[1].spec["data"]["values"][0]["role"], "chosen");
  EXPECT_EQ(charts[1].spec["data"]["values"][0]["cell"], "a");
  // Nothing yet: no charts.
  EXPECT_TRUE(TuneCharts({}, o).empty());
}

}  // namespace
}  // namespace joule::client
