#include "common/energy_report.h"

#include <gtest/gtest.h>

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
