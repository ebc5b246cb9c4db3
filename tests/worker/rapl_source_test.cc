#include "worker/energy/rapl_source.h"

#include <gtest/gtest.h>

#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_powercap.h"

#include <fstream>

namespace joule::worker {
namespace {

using testing::FakeClock;
using testing::FakePowercap;

constexpr uint64_t kRange = 262143328850;  // a real package's max_energy_range_uj

std::vector<std::string> Devices(const RaplSource& s) {
  std::vector<std::string> out;
  for (const auto& ch : s.channels()) out.push_back(ch.device);
  return out;
}

TEST(RaplSourceTest, CountsPackageAndDramButNotCoreOrUncore) {
  FakePowercap pc("normal");
  pc.AddZone("intel-rapl:0", "package-0", 1'000'000, kRange);
  pc.AddZone("intel-rapl:0/intel-rapl:0:0", "core", 500'000, kRange);
  pc.AddZone("intel-rapl:0/intel-rapl:0:1", "uncore", 100'000, kRange);
  pc.AddZone("intel-rapl:0/intel-rapl:0:2", "dram", 2'000'000, kRange);
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok()) << rapl.status();
  EXPECT_EQ(Devices(**rapl), (std::vector<std::string>{"cpu-package-0", "dram-0"}));
  EXPECT_TRUE((*rapl)->channels()[0].shared);
  EXPECT_EQ((*rapl)->channels()[0].source, "rapl");

  pc.SetEnergy("intel-rapl:0", 13'500'000);                  // +12.5 J
  pc.SetEnergy("intel-rapl:0/intel-rapl:0:2", 2'250'000);    // +0.25 J
  pc.SetEnergy("intel-rapl:0/intel-rapl:0:0", 9'000'000);    // core: must not count
  clock.Advance(0.1);
  std::vector<double> j;
  ASSERT_TRUE((*rapl)->Read(clock.Now(), &j).ok());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_DOUBLE_EQ(j[0], 12.5);
  EXPECT_DOUBLE_EQ(j[1], 0.25);
}

TEST(RaplSourceTest, CorrectsOneWrapAgainstTheRange) {
  FakePowercap pc("wrap");
  pc.AddZone("intel-rapl:0", "package-0", kRange - 1'000'000, kRange);
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok());
  pc.SetEnergy("intel-rapl:0", 3'000'000);  // wrapped: 1 J before the top, 3 J after
  clock.Advance(0.1);
  std::vector<double> j;
  ASSERT_TRUE((*rapl)->Read(clock.Now(), &j).ok());
  EXPECT_DOUBLE_EQ(j[0], 4.0);
}

TEST(RaplSourceTest, SaysSoWhenAGapMayHideMoreThanOneWrap) {
  // A 10 J counter at 100 W max (PL2 above a 50 W PL1) wraps at most every 0.1 s: a 0.5 s
  // gap may hide wraps.
  FakePowercap pc("multiwrap");
  pc.AddZone("intel-rapl:0", "package-0", 2'000'000, 10'000'000, 50'000'000);
  std::ofstream(pc.root() + "/intel-rapl:0/constraint_1_max_power_uw") << "100000000\n";
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok());
  pc.SetEnergy("intel-rapl:0", 1'000'000);
  clock.Advance(0.5);
  std::vector<double> j;
  absl::Status st = (*rapl)->Read(clock.Now(), &j);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(st.message()).find("may have wrapped more than once"), std::string::npos)
      << st;
  ASSERT_EQ(j.size(), 1u);
  EXPECT_DOUBLE_EQ(j[0], 9.0);  // the one wrap it can see: a lower bound, and labelled so
  // A read within the wrap period is clean again.
  pc.SetEnergy("intel-rapl:0", 2'000'000);
  clock.Advance(0.05);
  EXPECT_TRUE((*rapl)->Read(clock.Now(), &j).ok());
  EXPECT_DOUBLE_EQ(j[0], 1.0);
}

TEST(RaplSourceTest, UnreadableMaxFileRefusesToOpen) {
  FakePowercap pc("nomax");
  pc.AddZone("intel-rapl:0", "package-0", 1, kRange);
  pc.MakeUnreadable("intel-rapl:0/max_energy_range_uj");
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_FALSE(rapl.ok());
  EXPECT_NE(std::string(rapl.status().message()).find("max_energy_range_uj"), std::string::npos)
      << rapl.status();
}

TEST(RaplSourceTest, UnreadableEnergyFileRefusesToOpen) {
  FakePowercap pc("noenergy");
  pc.AddZone("intel-rapl:0", "package-0", 1, kRange);
  pc.MakeUnreadable("intel-rapl:0/energy_uj");
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_FALSE(rapl.ok());
  EXPECT_NE(std::string(rapl.status().message()).find("energy_uj"), std::string::npos);
}

TEST(RaplSourceTest, AFailedReadLosesTheIntervalButNotTheCounters) {
  FakePowercap pc("readfail");
  pc.AddZone("intel-rapl:0", "package-0", 1'000'000, kRange);
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok());
  pc.MakeUnreadable("intel-rapl:0/energy_uj");
  std::vector<double> j;
  clock.Advance(0.1);
  EXPECT_FALSE((*rapl)->Read(clock.Now(), &j).ok());
  EXPECT_TRUE(j.empty());
  // Readable again: the next read covers both intervals, nothing was lost.
  std::filesystem::remove_all(pc.root() + "/intel-rapl:0/energy_uj");
  pc.SetEnergy("intel-rapl:0", 4'000'000);
  clock.Advance(0.1);
  ASSERT_TRUE((*rapl)->Read(clock.Now(), &j).ok());
  EXPECT_DOUBLE_EQ(j[0], 3.0);
}

TEST(RaplSourceTest, DiesMirroringTheSocketCounterAreCountedOnce) {
  // Zen 1/2: every die zone of a package shows the same socket counter.
  FakePowercap pc("mirrordies");
  pc.AddZone("intel-rapl:0", "package-0-die-0", 7'000'000, kRange);
  pc.AddZone("intel-rapl:0/intel-rapl:0:0", "dram", 100, kRange);
  pc.AddZone("intel-rapl:1", "package-0-die-1", 7'000'000, kRange);
  pc.AddZone("intel-rapl:1/intel-rapl:1:0", "dram", 100, kRange);
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok()) << rapl.status();
  EXPECT_EQ(Devices(**rapl), (std::vector<std::string>{"cpu-package-0-die-0", "dram-0-die-0"}));
}

TEST(RaplSourceTest, DistinctDiesAndTheirDramAreAllCounted) {
  FakePowercap pc("dies");
  pc.AddZone("intel-rapl:0", "package-0-die-0", 7'000'000, kRange);
  pc.AddZone("intel-rapl:0/intel-rapl:0:0", "dram", 100, kRange);
  pc.AddZone("intel-rapl:1", "package-0-die-1", 9'000'000, kRange);
  pc.AddZone("intel-rapl:1/intel-rapl:1:0", "dram", 200, kRange);
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok()) << rapl.status();
  EXPECT_EQ(Devices(**rapl),
            (std::vector<std::string>{"cpu-package-0-die-0", "dram-0-die-0",
                                      "cpu-package-0-die-1", "dram-0-die-1"}));
}

TEST(RaplSourceTest, TwoSocketsEachWithDram) {
  FakePowercap pc("sockets");
  pc.AddZone("intel-rapl:0", "package-0", 1, kRange);
  pc.AddZone("intel-rapl:0/intel-rapl:0:0", "dram", 1, kRange);
  pc.AddZone("intel-rapl:1", "package-1", 1, kRange);
  pc.AddZone("intel-rapl:1/intel-rapl:1:0", "dram", 1, kRange);
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok()) << rapl.status();
  EXPECT_EQ(Devices(**rapl), (std::vector<std::string>{"cpu-package-0", "dram-0",
                                                       "cpu-package-1", "dram-1"}));
}

TEST(RaplSourceTest, MirroredZonesAreCountedOnce) {
  FakePowercap pc("mirror");
  pc.AddZone("intel-rapl:0", "package-0", 0, kRange);
  pc.AddZone("intel-rapl-mmio:0", "package-0", 0, kRange);
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok());
  EXPECT_EQ(Devices(**rapl), (std::vector<std::string>{"cpu-package-0"}));
}

TEST(RaplSourceTest, PsysIsNeverAddedToPackages) {
  FakePowercap pc("psys");
  pc.AddZone("intel-rapl:0", "package-0", 0, kRange);
  pc.AddZone("intel-rapl:1", "psys", 0, kRange);
  FakeClock clock;
  auto rapl = RaplSource::Open(pc.root(), clock.Now());
  ASSERT_TRUE(rapl.ok());
  EXPECT_EQ(Devices(**rapl), (std::vector<std::string>{"cpu-package-0"}));

  FakePowercap only("psysonly");
  only.AddZone("intel-rapl:1", "psys", 0, kRange);
  auto psys = RaplSource::Open(only.root(), clock.Now());
  ASSERT_TRUE(psys.ok());
  EXPECT_EQ(Devices(**psys), (std::vector<std::string>{"psys"}));
}

TEST(RaplSourceTest, NoPowercapAtAll) {
  FakeClock clock;
  auto missing = RaplSource::Open("/nonexistent/powercap", clock.Now());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  FakePowercap empty("empty");
  EXPECT_EQ(RaplSource::Open(empty.root(), clock.Now()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace joule::worker
