#include "worker/energy/nvml_source.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/testing/fake_clock.h"

namespace joule::worker {
namespace {

using testing::FakeClock;

// Built by tests/CMakeLists.txt from tests/testing/fake_nvml.cc.
const std::string kFakeNvml = JOULE_FAKE_NVML;

class NvmlSourceTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("FAKE_NVML_DEVICES");
    unsetenv("FAKE_NVML_INIT");
  }
};

TEST_F(NvmlSourceTest, UsesTheEnergyCounterWhereSupported) {
  setenv("FAKE_NVML_DEVICES", "counter", 1);
  FakeClock clock;
  auto nvml = NvmlSource::Open(kFakeNvml, nullptr, clock.Now());
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  ASSERT_EQ((*nvml)->channels().size(), 1u);
  const EnergyChannel& ch = (*nvml)->channels()[0];
  EXPECT_EQ(ch.source, "nvml");
  EXPECT_EQ(ch.device, "gpu-0");
  EXPECT_EQ(ch.uuid, "GPU-fake-0");
  EXPECT_EQ(ch.name, "Fake H200");
  EXPECT_FALSE(ch.shared);  // the worker owns its GPU
  clock.Advance(0.1);
  std::vector<double> j;
  ASSERT_TRUE((*nvml)->Read(clock.Now(), &j).ok());
  EXPECT_DOUBLE_EQ(j[0], 1.0);  // the fake counter gains 1000 mJ per read
  std::vector<DeviceStatus> status;
  (*nvml)->AppendStatus(&status);
  ASSERT_EQ(status.size(), 1u);
  EXPECT_DOUBLE_EQ(status[0].power_limit_watts, 700.0);
  EXPECT_DOUBLE_EQ(status[0].utilization, 0.5);
}

TEST_F(NvmlSourceTest, IntegratesPowerWhereTheCounterIsNotSupported) {
  setenv("FAKE_NVML_DEVICES", "power", 1);
  FakeClock clock;
  auto nvml = NvmlSource::Open(kFakeNvml, nullptr, clock.Now());
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_EQ((*nvml)->channels()[0].source, "nvml_power");
  // Open read 100 W; the next read is 200 W: the trapezoid over 0.5 s gives 75 J
  // (a rectangle on either sample would give 50 or 100).
  clock.Advance(0.5);
  std::vector<double> j;
  ASSERT_TRUE((*nvml)->Read(clock.Now(), &j).ok());
  EXPECT_DOUBLE_EQ(j[0], 75.0);
  clock.Advance(1.0);
  ASSERT_TRUE((*nvml)->Read(clock.Now(), &j).ok());
  EXPECT_DOUBLE_EQ(j[0], 250.0);  // (200 + 300) / 2 x 1 s
}

// The fallback on a GPU that has the counter (joule-bench-nvml measures one against the
// other): power integrated, the counter left alone.
TEST_F(NvmlSourceTest, PowerOnlyIntegratesPowerEvenWhereACounterExists) {
  setenv("FAKE_NVML_DEVICES", "counter,counter", 1);
  FakeClock clock;
  auto nvml = NvmlSource::Open(kFakeNvml, nullptr, clock.Now(), NvmlReading::kPowerOnly);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  ASSERT_EQ((*nvml)->channels().size(), 2u);
  EXPECT_EQ((*nvml)->channels()[0].source, "nvml_power");
  EXPECT_EQ((*nvml)->channels()[1].source, "nvml_power");
  clock.Advance(0.5);
  std::vector<double> j;
  ASSERT_TRUE((*nvml)->Read(clock.Now(), &j).ok());
  EXPECT_DOUBLE_EQ(j[0], 75.0);  // (100 + 200) / 2 W x 0.5 s, not the counter's 1 J a read
}

TEST_F(NvmlSourceTest, LeavesOutADeviceThatErrorsAndKeepsTheOthers) {
  setenv("FAKE_NVML_DEVICES", "error,counter", 1);
  FakeClock clock;
  auto nvml = NvmlSource::Open(kFakeNvml, nullptr, clock.Now());
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  ASSERT_EQ((*nvml)->channels().size(), 1u);
  EXPECT_EQ((*nvml)->channels()[0].device, "gpu-1");
  ASSERT_EQ((*nvml)->skipped().size(), 1u);
  EXPECT_NE((*nvml)->skipped()[0].find("gpu-0"), std::string::npos);

  setenv("FAKE_NVML_DEVICES", "error", 1);
  EXPECT_EQ(NvmlSource::Open(kFakeNvml, nullptr, clock.Now()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(NvmlSourceTest, RespectsCudaVisibleDevices) {
  setenv("FAKE_NVML_DEVICES", "counter,power,counter", 1);
  FakeClock clock;
  auto by_index = NvmlSource::Open(kFakeNvml, "2", clock.Now());
  ASSERT_TRUE(by_index.ok());
  ASSERT_EQ((*by_index)->channels().size(), 1u);
  EXPECT_EQ((*by_index)->channels()[0].uuid, "GPU-fake-2");
  auto by_uuid = NvmlSource::Open(kFakeNvml, "GPU-fake-1,0", clock.Now());
  ASSERT_TRUE(by_uuid.ok());
  ASSERT_EQ((*by_uuid)->channels().size(), 2u);
  EXPECT_EQ((*by_uuid)->channels()[0].device, "gpu-1");
  EXPECT_EQ((*by_uuid)->channels()[1].device, "gpu-0");
  EXPECT_FALSE(NvmlSource::Open(kFakeNvml, "", clock.Now()).ok());  // none visible
}

// A GPU worker meters the one GPU it trains on, found by its PCI bus id in whichever form
// CUDA (4-digit domain, lower or upper case) or NVML (8-digit domain) writes it: never by
// NVML index, which need not be the CUDA device's.
TEST_F(NvmlSourceTest, MetersOnlyTheGpuAtTheGivenPciBusId) {
  setenv("FAKE_NVML_DEVICES", "counter,power,counter", 1);
  FakeClock clock;
  for (const char* bus_id : {"0000:1b:00.0", "0000:1B:00.0", "00000000:1B:00.0"}) {
    auto nvml = NvmlSource::OpenByPciBusId(kFakeNvml, bus_id, "gpu-0", clock.Now());
    ASSERT_TRUE(nvml.ok()) << bus_id << ": " << nvml.status();
    ASSERT_EQ((*nvml)->channels().size(), 1u) << bus_id;
    const EnergyChannel& ch = (*nvml)->channels()[0];
    EXPECT_EQ(ch.device, "gpu-0");      // named after the CUDA device
    EXPECT_EQ(ch.uuid, "GPU-fake-1");   // NVML's GPU 1, the one at bus 0x1B
    EXPECT_EQ(ch.source, "nvml_power");  // GPU 1 is scripted without the counter
    clock.Advance(0.5);
    std::vector<double> j;
    ASSERT_TRUE((*nvml)->Read(clock.Now(), &j).ok());
    ASSERT_EQ(j.size(), 1u);  // the other two GPUs are not metered
    EXPECT_DOUBLE_EQ(j[0], 75.0);
    std::vector<DeviceStatus> status;
    (*nvml)->AppendStatus(&status);
    ASSERT_EQ(status.size(), 1u);
    EXPECT_EQ(status[0].device, "gpu-0");
  }
  auto last = NvmlSource::OpenByPciBusId(kFakeNvml, "0000:1C:00.0", "gpu-3", clock.Now());
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ((*last)->channels()[0].uuid, "GPU-fake-2");
  EXPECT_EQ((*last)->channels()[0].source, "nvml");
}

TEST_F(NvmlSourceTest, ABusIdNoGpuHasIsNotFound) {
  setenv("FAKE_NVML_DEVICES", "counter,counter", 1);
  FakeClock clock;
  for (const char* bus_id : {"0000:1C:00.0", "0000:19:00.0", "0001:1A:00.0", "", "gpu-0",
                             "0000:1A:00.0 trailing"}) {
    auto nvml = NvmlSource::OpenByPciBusId(kFakeNvml, bus_id, "gpu-0", clock.Now());
    EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound) << bus_id;
    EXPECT_NE(std::string(nvml.status().message()).find("PCI bus id"), std::string::npos)
        << nvml.status();
  }
}

TEST_F(NvmlSourceTest, AGpuInMigModeIsRefusedWithTheReason) {
  setenv("FAKE_NVML_DEVICES", "counter,counter:mig", 1);
  FakeClock clock;
  auto mig = NvmlSource::OpenByPciBusId(kFakeNvml, "0000:1B:00.0", "gpu-0", clock.Now());
  EXPECT_EQ(mig.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(mig.status().message()).find("MIG"), std::string::npos)
      << mig.status();
  // The GPU beside it, not in MIG mode, is metered.
  EXPECT_TRUE(NvmlSource::OpenByPciBusId(kFakeNvml, "0000:1A:00.0", "gpu-0", clock.Now()).ok());
}

TEST_F(NvmlSourceTest, AGpuAtTheBusIdThatCannotBeReadIsNotFound) {
  setenv("FAKE_NVML_DEVICES", "error", 1);
  FakeClock clock;
  auto nvml = NvmlSource::OpenByPciBusId(kFakeNvml, "0000:1A:00.0", "gpu-0", clock.Now());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(nvml.status().message()).find("gpu-0"), std::string::npos)
      << nvml.status();
}

TEST_F(NvmlSourceTest, NoLibraryOrNoDriverIsAClearError) {
  FakeClock clock;
  auto missing = NvmlSource::Open("/nonexistent/libnvidia-ml.so.1", nullptr, clock.Now());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(missing.status().message()).find("cannot load"), std::string::npos);
  setenv("FAKE_NVML_INIT", "fail", 1);
  auto no_driver = NvmlSource::Open(kFakeNvml, nullptr, clock.Now());
  EXPECT_EQ(no_driver.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(no_driver.status().message()).find("Driver Not Loaded"),
            std::string::npos)
      << no_driver.status();
}

}  // namespace
}  // namespace joule::worker
