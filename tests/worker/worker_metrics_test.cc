// WorkerMetrics' per-job series: created for the bound job, removed two jobs later.
#include "worker/metrics/worker_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <memory>
#include <string>

namespace joule::worker {
namespace {

std::string Text(prometheus::Registry& r) {
  return prometheus::TextSerializer().Serialize(r.Collect());
}

// joule_energy_source_info: one series per source, labelled with its state now; a
// counter that sticks says so with its reason and its "counting" series goes.
TEST(WorkerMetricsTest, EnergySourceInfoFollowsEachSourcesState) {
  auto registry = std::make_shared<prometheus::Registry>();
  WorkerMetrics m(registry);
  EnergySample sample;
  sample.sources = {{"perf_rapl", "counting", ""}, {"estimated", "standby", "read in case"}};
  m.OnEnergy(sample);
  std::string text = Text(*registry);
  EXPECT_NE(text.find("joule_energy_source_info{reason=\"\",source=\"perf_rapl\",state="
                      "\"counting\"} 1"),
            std::string::npos)
      << text;
  sample.sources = {{"perf_rapl", "stuck", "no counter advanced"},
                    {"estimated", "standing_in", "charged while perf_rapl is stuck"}};
  m.OnEnergy(sample);
  text = Text(*registry);
  EXPECT_NE(
      text.find("joule_energy_source_info{reason=\"no counter advanced\",source=\"perf_rapl\","
                "state=\"stuck\"} 1"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("state=\"counting\""), std::string::npos) << text;
  EXPECT_EQ(text.find("state=\"standby\""), std::string::npos) << text;
}

// joule_energy_cross_check_joules_total: both sides of each pair add up over intervals
// (and jobs: no job labels); a figure no meter gives is left out.
TEST(WorkerMetricsTest, CrossChecksAddUpPerPairAndSide) {
  auto registry = std::make_shared<prometheus::Registry>();
  WorkerMetrics m(registry);
  EnergySample sample;
  sample.job = "3";
  sample.cross_checks = {{"nvml", "nvml_power", 100, 99}};
  m.OnEnergy(sample);
  sample.job = "4";
  sample.cross_checks = {{"nvml", "nvml_power", 50, 52}, {"rapl", "estimated", 1, 2}};
  m.OnEnergy(sample);
  sample.cross_checks = {{"nvml", "nvml_power", std::nan(""), 1e9}};
  m.OnEnergy(sample);
  const std::string text = Text(*registry);
  for (const char* want :
       {"joule_energy_cross_check_joules_total{reference=\"nvml_power\",side=\"source\","
        "source=\"nvml\"} 150",
        "joule_energy_cross_check_joules_total{reference=\"nvml_power\",side=\"reference\","
        "source=\"nvml\"} 151",
        "joule_energy_cross_check_joules_total{reference=\"estimated\",side=\"reference\","
        "source=\"rapl\"} 2"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

TEST(WorkerMetricsTest, ProgressSeriesFollowTheBoundJobAndAreRemovedWithIt) {
  auto registry = std::make_shared<prometheus::Registry>();
  WorkerMetrics m(registry);
  m.OnProgress(1, 0.5);  // before any job: nothing to charge it to
  EXPECT_EQ(Text(*registry).find("joule_epoch{"), std::string::npos);

  m.BindJob("1", "0");
  m.OnProgress(1, -1);  // the first epoch, not evaluated yet: no accuracy series
  std::string text = Text(*registry);
  EXPECT_NE(text.find("joule_epoch{joule_job=\"1\",joule_rank=\"0\"} 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("joule_test_accuracy_ratio{"), std::string::npos) << text;
  m.OnProgress(2, 0.8125);
  text = Text(*registry);
  EXPECT_NE(text.find("joule_epoch{joule_job=\"1\",joule_rank=\"0\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("joule_test_accuracy_ratio{joule_job=\"1\",joule_rank=\"0\"} 0.8125"),
            std::string::npos)
      << text;

  m.BindJob("2", "1");  // the finished job's series stay for a last scrape
  EXPECT_NE(Text(*registry).find("joule_test_accuracy_ratio{joule_job=\"1\""), std::string::npos);
  m.BindJob("3", "1");  // then go, every family's
  text = Text(*registry);
  EXPECT_EQ(text.find("joule_job=\"1\""), std::string::npos) << text;
}

// Issue 23: a job's loss and epoch gauges go when its attempt ends (a gauge left behind
// reads as a job still training); its counters and last accuracy stay for a final scrape;
// nothing recorded after the end lands on the ended job.
TEST(WorkerMetricsTest, TrainingGaugesEndWithTheJobAndCountersStay) {
  auto registry = std::make_shared<prometheus::Registry>();
  WorkerMetrics m(registry);
  m.BindJob("7", "0");
  m.OnStep(64, 0.01, 0.75);
  m.OnCollective("allreduce", 1024, 0.001);
  m.OnProgress(2, 0.81);
  std::string text = Text(*registry);
  ASSERT_NE(text.find("joule_loss{joule_job=\"7\",joule_rank=\"0\"} 0.75"), std::string::npos) << text;
  ASSERT_NE(text.find("joule_epoch{joule_job=\"7\""), std::string::npos) << text;
  m.EndJob();
  text = Text(*registry);
  EXPECT_EQ(text.find("joule_loss{joule_job=\"7\""), std::string::npos) << text;
  EXPECT_EQ(text.find("joule_epoch{joule_job=\"7\""), std::string::npos) << text;
  EXPECT_NE(text.find("joule_samples_total{joule_job=\"7\",joule_rank=\"0\"} 64"),
            std::string::npos) << text;
  EXPECT_NE(text.find("joule_test_accuracy_ratio{joule_job=\"7\",joule_rank=\"0\"} 0.81"),
            std::string::npos) << text;
  m.OnStep(64, 0.01, 0.5);  // after the end: not the ended job's
  m.OnProgress(3, 0.9);
  m.OnCollective("broadcast", 10, 0.001);
  text = Text(*registry);
  EXPECT_NE(text.find("joule_samples_total{joule_job=\"7\",joule_rank=\"0\"} 64"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("joule_loss{"), std::string::npos) << text;
  EXPECT_EQ(text.find("joule_epoch{"), std::string::npos) << text;
  EXPECT_EQ(text.find("op=\"broadcast\""), std::string::npos) << text;
  m.BindJob("8", "1");  // the next job's gauges come back
  m.OnStep(32, 0.01, 0.25);
  text = Text(*registry);
  EXPECT_NE(text.find("joule_loss{joule_job=\"8\",joule_rank=\"1\"} 0.25"), std::string::npos) << text;
}

}  // namespace
}  // namespace joule::worker

namespace joule::worker {
namespace {

TEST(WorkerMetricsTest, TheBlasIsOneInfoSeriesWithItsFallbackFlag) {
  auto registry = std::make_shared<prometheus::Registry>();
  WorkerMetrics m(registry);
  v1::BlasInfo blas;
  blas.set_library("OpenBLAS");
  blas.set_core("Prescott");
  blas.set_fallback(true);
  m.SetBlas(blas);
  const std::string text = Text(*registry);
  EXPECT_NE(
      text.find("joule_blas_info{core=\"Prescott\",fallback=\"true\",library=\"OpenBLAS\"} 1"),
      std::string::npos)
      << text;
}

}  // namespace
}  // namespace joule::worker
