#include "common/job_charts.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace joule {
namespace {

using nlohmann::json;

std::vector<std::string> Ids(const std::vector<Chart>& charts) {
  std::vector<std::string> ids;
  for (const Chart& c : charts) ids.push_back(c.id);
  return ids;
}

v1::RankPower Power(int32_t rank, std::vector<std::pair<double, double>> seconds_watts) {
  v1::RankPower p;
  p.set_rank(rank);
  for (const auto& [s, w] : seconds_watts) {
    v1::PowerSample* sample = p.add_samples();
    sample->set_elapsed_seconds(s);
    sample->set_watts(w);
  }
  return p;
}

// An ended job of two attempts: the first with power, the second without.
v1::Job EndedJob() {
  v1::Job job;
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.set_attempt(2);
  v1::JobResult* r = job.mutable_result();
  v1::AttemptSummary* first = r->add_attempts();
  first->set_attempt(1);
  *first->add_power() = Power(0, {{1, 10}, {2, 12}});
  *first->add_power() = Power(1, {{1.5, 11}});
  r->add_attempts()->set_attempt(2);
  for (const char* phase : {"forward", "backward", "forward"}) {
    v1::EnergyRecord* e = r->mutable_energy()->add_records();
    e->set_phase(phase);
    e->set_joules(5);
  }
  r->mutable_energy()->set_total_joules(15);
  for (int epoch : {1, 2}) {
    v1::EpochRecord* h = r->add_history();
    h->set_epoch(epoch);
    h->set_train_loss(epoch == 1 ? -1 : 0.5);  // -1: no step of epoch 1 ran in the attempt
    h->set_test_loss(0.6);
    h->set_test_accuracy(0.8 + 0.01 * epoch);
  }
  return job;
}

TEST(JobChartsTest, AJobWithNothingRecordedHasNoCharts) {
  v1::Job job;
  job.set_state(v1::JOB_STATE_PENDING);
  EXPECT_TRUE(JobCharts(job).empty());
  const std::vector<v1::RankPower> none;
  EXPECT_TRUE(JobCharts(job, &none).empty());
}

TEST(JobChartsTest, AnEndedJobsChartsComeFromItsResultInOrder) {
  const std::vector<Chart> charts = JobCharts(EndedJob());
  ASSERT_EQ(Ids(charts), (std::vector<std::string>{"power-by-rank", "energy-by-phase",
                                                   "loss-by-epoch", "accuracy-by-epoch"}));
  // Power: the last attempt that has any (the first), a step line per rank starting at 0 s.
  const json& power = charts[0].spec;
  EXPECT_EQ(power["mark"]["interpolate"], "step-before");
  const json& values = power["data"]["values"];
  ASSERT_EQ(values.size(), 5u);  // rank 0: 0, 1, 2 s; rank 1: 0, 1.5 s
  EXPECT_EQ(values[0]["rank"], "rank 0");
  EXPECT_EQ(values[0]["seconds"], 0.0);
  EXPECT_EQ(values[0]["watts"], 10.0);
  EXPECT_EQ(values[3]["rank"], "rank 1");
  EXPECT_EQ(values[3]["seconds"], 0.0);
  EXPECT_NE(charts[0].caption.find("attempt 1"), std::string::npos) << charts[0].caption;
  EXPECT_EQ(charts[0].caption.find("estimated"), std::string::npos) << charts[0].caption;
  // Phases summed: forward 10 J, backward 5 J.
  const json& phases = charts[1].spec["data"]["values"];
  ASSERT_EQ(phases.size(), 2u);
  double forward = 0;
  for (const json& p : phases) {
    if (p["phase"] == "forward") forward = p["joules"];
  }
  EXPECT_EQ(forward, 10.0);
  // Loss: epoch 1 has no training loss (-1), so 3 points; accuracy one per epoch.
  EXPECT_EQ(charts[2].spec["data"]["values"].size(), 3u);
  EXPECT_EQ(charts[3].spec["data"]["values"].size(), 2u);
  for (const Chart& c : charts) {
    EXPECT_EQ(c.spec["$schema"], "https://vega.github.io/schema/vega-lite/v6.json") << c.id;
    EXPECT_FALSE(c.title.empty()) << c.id;
    EXPECT_FALSE(c.caption.empty()) << c.id;
  }
}

TEST(JobChartsTest, ARunningAttemptsPowerIsTheLiveOneAndItsPhasesAreLeftOut) {
  v1::Job job = EndedJob();
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempt(3);
  job.mutable_progress()->set_energy_estimated(true);
  const std::vector<v1::RankPower> live = {Power(0, {{4, 40}})};
  const std::vector<Chart> charts = JobCharts(job, &live);
  ASSERT_EQ(Ids(charts),
            (std::vector<std::string>{"power-by-rank", "loss-by-epoch", "accuracy-by-epoch"}));
  const json& values = charts[0].spec["data"]["values"];
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[1]["watts"], 40.0);
  EXPECT_NE(charts[0].caption.find("attempt 3"), std::string::npos) << charts[0].caption;
  EXPECT_NE(charts[0].caption.find("estimated"), std::string::npos) << charts[0].caption;
}

// A pending job's page keeps its four charts, each saying it has no data yet; the HTML
// report (no with_empty) still gets none.
TEST(JobChartsTest, WithEmptyEveryChartIsThereAndTheEmptyOnesSaySo) {
  v1::Job job;
  job.set_state(v1::JOB_STATE_PENDING);
  const std::vector<Chart> charts = JobCharts(job, nullptr, /*with_empty=*/true);
  ASSERT_EQ(Ids(charts), (std::vector<std::string>{"power-by-rank", "energy-by-phase",
                                                   "loss-by-epoch", "accuracy-by-epoch"}));
  for (const Chart& c : charts) {
    EXPECT_TRUE(c.empty) << c.id;
    EXPECT_NE(c.caption.find("No data yet"), std::string::npos) << c.caption;
    EXPECT_TRUE(c.spec["data"]["values"].empty()) << c.id;
  }
  // A running attempt: its power and epochs drawn, its phases a placeholder.
  v1::Job running = EndedJob();
  running.set_state(v1::JOB_STATE_RUNNING);
  const std::vector<v1::RankPower> live = {Power(0, {{4, 40}})};
  const std::vector<Chart> some = JobCharts(running, &live, true);
  ASSERT_EQ(some.size(), 4u);
  EXPECT_FALSE(some[0].empty);
  EXPECT_TRUE(some[1].empty);
  EXPECT_EQ(some[1].id, "energy-by-phase");
  EXPECT_FALSE(some[2].empty);
  EXPECT_FALSE(some[3].empty);
}

// The rule of a chart's target layer: its y value and label; null when there is none.
json TargetRule(const Chart& c) {
  if (!c.spec.contains("layer")) return nullptr;
  return c.spec["layer"][1]["data"]["values"][0];
}

// The target is drawn on the chart that shows its metric, on that chart's y field, and
// on no other; top-k and the training split are series of their own.
TEST(JobChartsTest, TheTargetIsADashedRuleOnTheChartOfItsMetric) {
  v1::Job job = EndedJob();
  job.mutable_spec()->set_target_accuracy(0.85);
  std::vector<Chart> charts = JobCharts(job);
  ASSERT_EQ(charts.size(), 4u);
  EXPECT_TRUE(TargetRule(charts[2]).is_null());
  json rule = TargetRule(charts[3]);
  ASSERT_FALSE(rule.is_null()) << charts[3].spec.dump();
  EXPECT_EQ(rule["accuracy"], 0.85);
  EXPECT_NE(rule["label"].get<std::string>().find("test_accuracy"), std::string::npos);
  EXPECT_EQ(charts[3].spec["layer"][1]["layer"][0]["mark"]["type"], "rule");
  // The marks keep their data: the spec's own, not the rule's.
  EXPECT_EQ(charts[3].spec["data"]["values"].size(), 2u);

  job.mutable_spec()->set_target_metric("test_loss");
  job.mutable_spec()->set_target_loss(0.4);
  charts = JobCharts(job);
  EXPECT_TRUE(TargetRule(charts[3]).is_null());
  rule = TargetRule(charts[2]);
  ASSERT_FALSE(rule.is_null());
  EXPECT_EQ(rule["loss"], 0.4);

  job.mutable_spec()->set_target_metric("test_top_k_accuracy");
  job.mutable_spec()->set_top_k(5);
  job.mutable_spec()->set_evaluate_train(true);
  for (v1::EpochRecord& h : *job.mutable_result()->mutable_history()) {
    h.set_test_top_k_accuracy(0.97);
    h.set_train_accuracy(0.9);
    h.set_train_top_k_accuracy(0.99);
    h.set_train_eval_loss(0.3);
  }
  charts = JobCharts(job);
  std::set<std::string> series;
  for (const json& v : charts[3].spec["data"]["values"]) series.insert(v["series"]);
  EXPECT_EQ(series,
            (std::set<std::string>{"test accuracy", "test top-5 accuracy",
                                   "training split accuracy", "training split top-5 accuracy"}));
  EXPECT_EQ(TargetRule(charts[3])["accuracy"], 0.85);
  series.clear();
  for (const json& v : charts[2].spec["data"]["values"]) series.insert(v["series"]);
  EXPECT_EQ(series.count("training split loss (evaluated)"), 1u);
  // No target set: no rule anywhere.
  job.mutable_spec()->set_target_accuracy(0);
  for (const Chart& c : JobCharts(job)) EXPECT_TRUE(TargetRule(c).is_null()) << c.id;
}

}  // namespace
}  // namespace joule
