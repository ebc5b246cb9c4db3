#include "common/energy_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"

namespace joule {
namespace {

v1::RankResult Rank(int rank, std::vector<std::tuple<std::string, std::string, std::string, double>> e) {
  v1::RankResult r;
  r.set_rank(rank);
  r.set_devices(1);
  for (const auto& [device, source, phase, joules] : e) {
    v1::EnergyRecord* rec = r.add_energy();
    rec->set_device(device);
    rec->set_source(source);
    rec->set_phase(phase);
    rec->set_joules(joules);
  }
  return r;
}

TEST(EnergyReportTest, DerivedQuantities) {
  v1::JobResult result;
  result.set_wall_seconds(1800);  // half an hour on 2 devices: 1 device-hour
  result.set_samples(720000);
  result.set_steps(5625);
  *result.add_ranks() = Rank(0, {{"gpu-0", "nvml", "forward", 1.8e6}, {"cpu-package-0", "rapl", "idle", 0.9e6}});
  *result.add_ranks() = Rank(1, {{"gpu-1", "nvml", "communication", 0.9e6}});
  v1::EnergyReport r = BuildEnergyReport(result, 400, 2);
  EXPECT_DOUBLE_EQ(r.total_joules(), 3.6e6);
  EXPECT_DOUBLE_EQ(r.kwh(), 1.0);
  EXPECT_EQ(r.devices(), 2);
  EXPECT_DOUBLE_EQ(r.device_hours(), 1.0);
  EXPECT_DOUBLE_EQ(r.average_watts(), 2000.0);
  EXPECT_DOUBLE_EQ(r.joules_per_device_hour(), 3.6e6);
  EXPECT_DOUBLE_EQ(r.samples_per_joule(), 0.2);
  EXPECT_DOUBLE_EQ(r.updates_per_device_hour(), 5625.0);
  EXPECT_DOUBLE_EQ(r.co2_grams(), 400.0);
  EXPECT_FALSE(r.estimated());
  EXPECT_EQ(r.ranks_reported(), 2);
  EXPECT_EQ(r.ranks_expected(), 2);
  ASSERT_EQ(r.records_size(), 3);
  EXPECT_EQ(r.records(2).rank(), 1);
  auto by_source = EnergyBy(r, "source");
  EXPECT_DOUBLE_EQ(by_source["nvml"], 2.7e6);
  EXPECT_DOUBLE_EQ(by_source["rapl"], 0.9e6);
  EXPECT_DOUBLE_EQ(EnergyBy(r, "rank")["1"], 0.9e6);
  EXPECT_DOUBLE_EQ(EnergyBy(r, "device")["0/gpu-0"], 1.8e6);
}

// Node (BMC) energy sits beside the components: summed over ranks and attempts, never in
// total_joules; a rank's figure no meter can give is left out.
TEST(EnergyReportTest, NodeEnergyBesideTheComponentsNotInTheTotal) {
  v1::JobResult result;
  result.set_wall_seconds(100);
  for (int rank = 0; rank < 3; ++rank) {
    v1::RankResult r = Rank(rank, {{"cpu-package-0", "rapl", "forward", 100}});
    r.set_node_joules(rank == 2 ? -5 : 160);  // rank 2's report is broken
    r.set_node_component_joules(100);
    r.set_node_source("redfish https://bmc/redfish/v1/Chassis/1/Power");
    r.set_node_split(rank == 0 ? "component energy" : "cpu time");
    *result.add_ranks() = r;
  }
  v1::EnergyReport e = BuildEnergyReport(result, 400, 3);
  EXPECT_EQ(e.node_split(), "component energy and cpu time");  // each named once
  EXPECT_DOUBLE_EQ(e.total_joules(), 300.0);
  EXPECT_DOUBLE_EQ(e.node_joules(), 320.0);
  EXPECT_DOUBLE_EQ(e.node_component_joules(), 200.0);
  EXPECT_EQ(e.node_ranks(), 2);
  EXPECT_EQ(e.node_source(), "redfish https://bmc/redfish/v1/Chassis/1/Power");
  for (double hostile : {std::nan(""), HUGE_VAL, 1e300}) {
    v1::JobResult bad;
    v1::RankResult r = Rank(0, {{"cpu", "estimated", "forward", 1}});
    r.set_node_joules(hostile);
    *bad.add_ranks() = r;
    EXPECT_EQ(BuildEnergyReport(bad, 400, 1).node_joules(), 0.0) << hostile;
  }
  // A hostile split: many long names, one invalid UTF-8: at most 4 names of 64 bytes.
  v1::JobResult hostile;
  v1::RankResult r = Rank(0, {{"cpu", "rapl", "forward", 1}});
  r.set_node_joules(1);
  std::string split;
  for (int i = 0; i < 10; ++i)
    split += std::string(i == 0 ? "" : " and ") + std::string(100, 'a' + i);
  split += " and \xff\xfe";
  r.set_node_split(split);
  *hostile.add_ranks() = r;
  const std::string merged = BuildEnergyReport(hostile, 400, 1).node_split();
  EXPECT_LE(merged.size(), 4 * 64 + 3 * 5u) << merged;
  EXPECT_EQ(std::count(merged.begin(), merged.end(), ' '), 6) << merged;  // 4 names, 3 " and "
}

// Cross-checks add up per pair of sources over ranks; hostile figures are left out.
TEST(EnergyReportTest, CrossChecksAddUpPerPairOfSources) {
  v1::JobResult result;
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankResult r = Rank(rank, {{"gpu-0", "nvml", "forward", 100}});
    v1::EnergyCrossCheck* c = r.add_cross_checks();
    c->set_source("nvml");
    c->set_joules(100);
    c->set_reference_source("nvml_power");
    c->set_reference_joules(rank == 0 ? 101 : std::nan(""));
    *result.add_ranks() = r;
  }
  v1::EnergyReport e = BuildEnergyReport(result, 400, 2);
  ASSERT_EQ(e.cross_checks_size(), 1);
  EXPECT_EQ(e.cross_checks(0).source(), "nvml");
  EXPECT_DOUBLE_EQ(e.cross_checks(0).joules(), 100.0);
  EXPECT_DOUBLE_EQ(e.cross_checks(0).reference_joules(), 101.0);
}

TEST(EnergyReportTest, EstimatedAndEmpty) {
  v1::JobResult result;
  *result.add_ranks() = Rank(0, {{"cpu", "estimated", "forward", 5}});
  result.mutable_ranks(0)->add_energy_warnings("cpu times unreadable");
  v1::EnergyReport r = BuildEnergyReport(result, kDefaultGridGco2PerKwh, 4);
  EXPECT_TRUE(r.estimated());
  EXPECT_EQ(r.average_watts(), 0);  // no wall time: no division by zero
  ASSERT_EQ(r.warnings_size(), 1);
  EXPECT_EQ(r.warnings(0), "rank 0: cpu times unreadable");
  EXPECT_EQ(r.ranks_reported(), 1);
  EXPECT_EQ(r.ranks_expected(), 4);
  v1::EnergyReport empty = BuildEnergyReport(v1::JobResult{}, 460, 1);
  EXPECT_EQ(empty.total_joules(), 0);
  EXPECT_EQ(empty.samples_per_joule(), 0);
}

}  // namespace
}  // namespace joule

namespace joule {
namespace {

v1::EpochRecord Epoch(int epoch, double seconds, double joules, double accuracy) {
  v1::EpochRecord e;
  e.set_epoch(epoch);
  e.set_elapsed_seconds(seconds);
  e.set_joules(joules);
  e.set_test_accuracy(accuracy);
  e.set_train_loss(1.0 / epoch);
  return e;
}

TEST(JobHistoryTest, RanksAddTheirJoulesTheSlowestSetsTheTimeRankZeroTheAccuracy) {
  google::protobuf::RepeatedPtrField<v1::RankResult> ranks;
  v1::RankResult r1 = Rank(1, {{"cpu", "estimated", "forward", 30}});
  *r1.add_history() = Epoch(1, 12, 10, 0.1);  // a peer's accuracy is not the job's
  *r1.add_history() = Epoch(2, 21, 20, 0.1);
  v1::RankResult r0 = Rank(0, {{"cpu", "estimated", "forward", 30}});
  *r0.add_history() = Epoch(2, 20, 25, 0.8);  // out of order, and a bad epoch 0
  *r0.add_history() = Epoch(1, 10, 15, 0.7);
  *r0.add_history() = Epoch(0, 1, 1, 0.99);
  *ranks.Add() = r1;
  *ranks.Add() = r0;
  const v1::AttemptSummary s =
      SummariseAttempt(1, v1::ATTEMPT_OUTCOME_SUCCEEDED, "", 25, 2, ranks);
  ASSERT_EQ(s.history_size(), 2);
  EXPECT_EQ(s.history(0).epoch(), 1);
  EXPECT_DOUBLE_EQ(s.history(0).joules(), 25);
  EXPECT_DOUBLE_EQ(s.history(0).elapsed_seconds(), 12);
  EXPECT_DOUBLE_EQ(s.history(0).test_accuracy(), 0.7);
  EXPECT_DOUBLE_EQ(s.history(1).joules(), 45);
  EXPECT_DOUBLE_EQ(s.history(1).elapsed_seconds(), 21);
  EXPECT_DOUBLE_EQ(s.history(1).test_accuracy(), 0.8);
  EXPECT_EQ(s.history(1).attempt(), 1);
}

TEST(JobHistoryTest, AResumedAttemptReplacesTheEpochsItRedoesAndAddsWhatCameBefore) {
  v1::JobResult result;
  v1::AttemptSummary* a1 = result.add_attempts();
  a1->set_attempt(1);
  a1->set_wall_seconds(30);  // failed after epoch 2, during epoch 3
  a1->add_energy()->set_joules(300);
  *a1->add_history() = Epoch(1, 10, 100, 0.6);
  *a1->add_history() = Epoch(2, 20, 200, 0.7);
  v1::AttemptSummary* a2 = result.add_attempts();
  a2->set_attempt(2);
  a2->set_wall_seconds(25);
  a2->add_energy()->set_joules(250);
  // Resumed from the checkpoint after epoch 1: epoch 2 again, then 3.
  *a2->add_history() = Epoch(2, 12, 120, 0.72);
  *a2->add_history() = Epoch(3, 24, 240, 0.86);
  const auto h = BuildJobHistory(result);
  ASSERT_EQ(h.size(), 3);
  EXPECT_EQ(h[0].attempt(), 1);
  EXPECT_DOUBLE_EQ(h[1].elapsed_seconds(), 30 + 12);
  EXPECT_DOUBLE_EQ(h[1].joules(), 300 + 120);
  EXPECT_DOUBLE_EQ(h[1].test_accuracy(), 0.72);
  EXPECT_EQ(h[2].attempt(), 2);
  EXPECT_DOUBLE_EQ(h[2].joules(), 540);

  const v1::AccuracyTarget t = ToAccuracy(h, 0.85);
  EXPECT_TRUE(t.reached());
  EXPECT_EQ(t.epoch(), 3);
  EXPECT_DOUBLE_EQ(t.seconds(), 54);
  EXPECT_DOUBLE_EQ(t.joules(), 540);
  EXPECT_FALSE(ToAccuracy(h, 0.9).reached());
  EXPECT_EQ(ToAccuracy(h, 0.6).epoch(), 1);  // the first epoch at or above it
  EXPECT_FALSE(ToAccuracy({}, 0.1).reached());
}

std::vector<double> TargetValues(double target_accuracy) {
  v1::JobSpec spec;
  spec.set_target_accuracy(target_accuracy);
  std::vector<double> values;
  for (const v1::AccuracyTarget& t : TargetsOf(spec)) {
    EXPECT_EQ(t.metric(), "test_accuracy");
    EXPECT_FALSE(t.lower_is_better());
    values.push_back(t.target());
  }
  return values;
}

TEST(JobHistoryTest, TheLadderHoldsTheSpecTargetOnceInOrder) {
  EXPECT_EQ(TargetValues(0), (std::vector<double>{0.5, 0.6, 0.7, 0.8, 0.85, 0.9}));
  EXPECT_EQ(TargetValues(0.875), (std::vector<double>{0.5, 0.6, 0.7, 0.8, 0.85, 0.875, 0.9}));
  EXPECT_EQ(TargetValues(0.8).size(), 6u);
  EXPECT_EQ(TargetValues(0.95).back(), 0.95);
  EXPECT_EQ(TargetValues(1.5).size(), 6u);  // out of range: ignored
}

// Every metric a spec may name is read from its own EpochRecord field (each set to a
// distinct value below), accuracies upward with the ladder, losses downward alone.
TEST(JobHistoryTest, EachTargetMetricReadsItsOwnFigureInItsDirection) {
  v1::EpochRecord e;
  e.set_epoch(1);
  e.set_test_accuracy(0.11);
  e.set_test_top_k_accuracy(0.12);
  e.set_train_accuracy(0.13);
  e.set_train_top_k_accuracy(0.14);
  e.set_test_loss(0.15);
  e.set_test_rmse(0.16);
  e.set_train_eval_loss(0.17);
  const std::vector<std::pair<std::string, double>> expected = {
      {"test_accuracy", 0.11},        {"test_top_k_accuracy", 0.12}, {"train_accuracy", 0.13},
      {"train_top_k_accuracy", 0.14}, {"test_loss", 0.15},           {"test_rmse", 0.16},
      {"train_eval_loss", 0.17}};
  for (const auto& [name, value] : expected) {
    const TargetMetric* m = FindTargetMetric(name);
    ASSERT_NE(m, nullptr) << name;
    EXPECT_EQ(m->read(e), value) << name;
    EXPECT_EQ(m->lower_is_better, absl::StrContains(name, "loss") || name == "test_rmse") << name;
    EXPECT_TRUE(absl::StrContains(TargetMetricNames(), name));
  }
  EXPECT_EQ(FindTargetMetric(""), FindTargetMetric("test_accuracy"));
  EXPECT_EQ(FindTargetMetric("top5"), nullptr);

  v1::JobSpec spec;
  spec.set_target_metric("test_top_k_accuracy");
  spec.set_target_accuracy(0.95);
  std::vector<v1::AccuracyTarget> ladder = TargetsOf(spec);
  ASSERT_EQ(ladder.size(), 7u);
  EXPECT_EQ(ladder.back().metric(), "test_top_k_accuracy");
  spec.Clear();
  spec.set_target_metric("test_rmse");
  EXPECT_TRUE(TargetsOf(spec).empty()) << "a loss has no ladder";
  spec.set_target_loss(0.5);
  ASSERT_EQ(TargetsOf(spec).size(), 1u);
  EXPECT_TRUE(TargetsOf(spec)[0].lower_is_better());
  EXPECT_EQ(TargetsOf(spec)[0].target(), 0.5);
}

// A falling RMSE reaches a loss target at the first epoch at or under it; epochs that did
// not measure the metric (-1) never count as reaching it, whichever the direction.
TEST(JobHistoryTest, ALossTargetIsReachedAtTheFirstEpochAtOrUnderIt) {
  google::protobuf::RepeatedPtrField<v1::EpochRecord> h;
  const double rmse[] = {-1, 0.9, 0.5, 0.3, 0.4};
  for (int i = 0; i < 5; ++i) {
    v1::EpochRecord* e = h.Add();
    e->set_epoch(i + 1);
    e->set_test_rmse(rmse[i]);
    e->set_train_top_k_accuracy(-1);
    e->set_elapsed_seconds(10 * (i + 1));
    e->set_joules(100 * (i + 1));
  }
  v1::AccuracyTarget t;
  t.set_metric("test_rmse");
  t.set_lower_is_better(true);
  t.set_target(0.5);
  const v1::AccuracyTarget reached = ToTarget(h, t);
  EXPECT_TRUE(reached.reached());
  EXPECT_EQ(reached.epoch(), 3);
  EXPECT_DOUBLE_EQ(reached.seconds(), 30);
  EXPECT_DOUBLE_EQ(reached.joules(), 300);
  t.set_target(0.2);
  EXPECT_FALSE(ToTarget(h, t).reached());
  t.set_target(0.0);  // -1 (not measured) is not <= 0 here
  EXPECT_FALSE(ToTarget(h, t).reached());
  t.set_metric("train_top_k_accuracy");
  t.set_target(0);  // every figure is -1: even a 0 target is not reached
  EXPECT_FALSE(ToTarget(h, t).reached());
  t.set_metric("no_such_metric");
  EXPECT_FALSE(ToTarget(h, t).reached());
}

TEST(JobHistoryTest, AHostileRankCannotGrowTheReportWithoutBound) {
  v1::RankResult r = Rank(0, {{"cpu", "estimated", "forward", 1}});
  for (int e = 1; e <= kMaxHistory + 50; ++e) *r.add_history() = Epoch(e, e, e, 0.5);
  v1::PowerSample p;
  for (int i = 0; i < kMaxPowerSamples + 50; ++i) *r.add_power() = p;
  google::protobuf::RepeatedPtrField<v1::RankResult> ranks;
  *ranks.Add() = r;
  const v1::AttemptSummary s = SummariseAttempt(1, v1::ATTEMPT_OUTCOME_SUCCEEDED, "", 1, 1, ranks);
  EXPECT_EQ(s.history_size(), kMaxHistory);
  ASSERT_EQ(s.power_size(), 1);
  EXPECT_EQ(s.power(0).samples_size(), kMaxPowerSamples);
}

}  // namespace
}  // namespace joule
