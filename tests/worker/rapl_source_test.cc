#include "worker/energy/rapl_source.h"

#include <gtest/gtest.h>

#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_powercap.h"

#include <filesystem>
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

std::vector<std::string> Notes(const RaplSource& s) {
  std::vector<std::string> out;
  s.AppendNotes(&out);
  return out;
}

bool Contains(const absl::Status& st, const std::string& text) {
  return std::string(st.message()).find(text) != std::string::npos;
}

// A RaplSource over a fake tree, read at times the test chooses.
class Meter {
 public:
  explicit Meter(const FakePowercap& pc) {
    auto rapl = RaplSource::Open(pc.root(), clock_.Now());
    EXPECT_TRUE(rapl.ok()) << rapl.status();
    if (rapl.ok()) rapl_ = *std::move(rapl);
  }
  bool ok() const { return rapl_ != nullptr; }
  // Reads `seconds` after the previous read; the figures land in j().
  absl::Status Read(double seconds) {
    clock_.Advance(seconds);
    return rapl_->Read(clock_.Now(), &j_);
  }
  const std::vector<double>& j() const { return j_; }
  const RaplSource& source() const { return *rapl_; }

 private:
  FakeClock clock_;
  std::unique_ptr<RaplSource> rapl_;
  std::vector<double> j_;
};

constexpr uint64_t k100W = 100'000'000;  // constraint_0_max_power_uw of a 100 W package

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

// (A counter that resets reads lower than before. Read as a wrap it would be almost a
// whole range: 262 kJ in 0.1 s. At 100 W max the zone can use 4 x 100 W x 0.2 s = 80 J.)
TEST(RaplSourceTest, ACounterThatResetsDropsTheIntervalAndResumesFromTheNewReading) {
  constexpr uint64_t kLast = 5'000'000'000;  // 5 kJ
  for (uint64_t reset_to : {uint64_t{0}, uint64_t{1}, kLast / 2, kLast - 1'000'000, kLast - 1}) {
    SCOPED_TRACE(reset_to);
    FakePowercap pc("reset");
    pc.AddZone("intel-rapl:0", "package-0", kLast, kRange, k100W);
    Meter m(pc);
    ASSERT_TRUE(m.ok());
    pc.SetEnergy("intel-rapl:0", reset_to);
    absl::Status st = m.Read(0.1);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(st, "cpu-package-0: counter fell from 5000000000 to")) << st;
    EXPECT_TRUE(Contains(st, "interval dropped")) << st;
    ASSERT_EQ(m.j().size(), 1u);
    EXPECT_EQ(m.j()[0], 0.0);
    pc.SetEnergy("intel-rapl:0", reset_to + 2'000'000);
    EXPECT_TRUE(m.Read(0.1).ok());
    EXPECT_DOUBLE_EQ(m.j()[0], 2.0);
  }
}

TEST(RaplSourceTest, ADeltaIsBoundedByWhatTheZoneCanUseInTheInterval) {
  // 100 W max, 0.1 s: up to 4 x 100 W x (0.1 + 0.1) s = 80 J is energy, beyond is not.
  struct Case {
    uint64_t delta_uj;
    bool counted;
  };
  for (const Case& c : {Case{79'000'000, true}, Case{81'000'000, false},
                        Case{200'000'000'000, false}}) {
    SCOPED_TRACE(c.delta_uj);
    FakePowercap pc("bound");
    pc.AddZone("intel-rapl:0", "package-0", 1'000'000, kRange, k100W);
    Meter m(pc);
    ASSERT_TRUE(m.ok());
    pc.SetEnergy("intel-rapl:0", 1'000'000 + c.delta_uj);
    absl::Status st = m.Read(0.1);
    EXPECT_EQ(st.ok(), c.counted) << st;
    EXPECT_DOUBLE_EQ(m.j()[0], c.counted ? c.delta_uj / 1e6 : 0.0);
    if (!c.counted) {
      EXPECT_TRUE(Contains(st, "counter rose from 1000000 to")) << st;
    }
  }
}

TEST(RaplSourceTest, AWrapThatFitsTheIntervalIsStillAWrap) {
  // 50 J below the top, then 20 J after it: 70 J in 0.1 s at 100 W (bound 80 J).
  FakePowercap pc("plausiblewrap");
  pc.AddZone("intel-rapl:0", "package-0", kRange - 50'000'000, kRange, k100W);
  Meter m(pc);
  ASSERT_TRUE(m.ok());
  pc.SetEnergy("intel-rapl:0", 20'000'000);
  EXPECT_TRUE(m.Read(0.1).ok());
  EXPECT_DOUBLE_EQ(m.j()[0], 70.0);
}

TEST(RaplSourceTest, TheBoundComesFromWhicheverLimitReadsElseTheDefault) {
  // What one zone's bound is in 0.1 s (x 0.2 s x 4): a 30 J, a 300 J and a 900 J delta.
  struct Case {
    std::string file, text;
    double bound_j;
  };
  const std::string kDir = "intel-rapl:0/";
  const double kDefaultBound = 4 * RaplSource::kDefaultMaxZoneWatts * 0.2;  // 800 J
  for (const Case& c : {
           Case{"constraint_0_max_power_uw", "100000000", 80},
           Case{"constraint_0_power_limit_uw", "50000000", 40},  // PL1 only
           Case{"constraint_1_max_power_uw", "1000000000", 800},
           Case{"", "", kDefaultBound},  // no constraint file at all
           Case{"constraint_0_max_power_uw", "unreadable", kDefaultBound},
           Case{"constraint_0_max_power_uw", "garbage", kDefaultBound},
           Case{"constraint_0_max_power_uw", "-100000000", kDefaultBound},
           Case{"constraint_0_max_power_uw", "0", kDefaultBound},
           Case{"constraint_0_max_power_uw", "18446744073709551615", kDefaultBound},
           Case{"constraint_0_max_power_uw", "99999999999999999999999", kDefaultBound},
       }) {
    SCOPED_TRACE(c.file + "=" + c.text);
    for (double delta_j : {30.0, 300.0, 900.0}) {
      FakePowercap pc("limits");
      pc.AddZone("intel-rapl:0", "package-0", 0, kRange);
      if (!c.file.empty()) {
        pc.SetFile(kDir + c.file, c.text);
        if (c.text == "unreadable") pc.MakeUnreadable(kDir + c.file);
      }
      Meter m(pc);
      ASSERT_TRUE(m.ok());
      pc.SetEnergy("intel-rapl:0", static_cast<uint64_t>(delta_j * 1e6));
      absl::Status st = m.Read(0.1);
      const bool counted = delta_j <= c.bound_j;
      EXPECT_EQ(st.ok(), counted) << delta_j << " J: " << st;
      EXPECT_DOUBLE_EQ(m.j()[0], counted ? delta_j : 0.0) << delta_j << " J";
    }
  }
}

TEST(RaplSourceTest, AReadingAboveTheRangeIsIgnoredAndItsEnergyCountedNextTime) {
  for (const std::string& bad : std::vector<std::string>{
           std::to_string(kRange + 1), std::to_string(2 * kRange), "18446744073709551615"}) {
    SCOPED_TRACE(bad);
    FakePowercap pc("aboverange");
    pc.AddZone("intel-rapl:0", "package-0", 5'000'000, kRange, k100W);
    Meter m(pc);
    ASSERT_TRUE(m.ok());
    pc.SetFile("intel-rapl:0/energy_uj", bad);
    absl::Status st = m.Read(0.1);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(st, "above max_energy_range_uj")) << st;
    ASSERT_EQ(m.j().size(), 1u);
    EXPECT_EQ(m.j()[0], 0.0);
    // Back to sane: the two intervals together, never range - bad + cur underflowing into
    // 1.8e13 J.
    pc.SetEnergy("intel-rapl:0", 8'000'000);
    EXPECT_TRUE(m.Read(0.1).ok());
    EXPECT_DOUBLE_EQ(m.j()[0], 3.0);
    // And a sane reading below the last good one is a reset, not an underflow either.
    pc.SetFile("intel-rapl:0/energy_uj", bad);
    EXPECT_FALSE(m.Read(0.1).ok());
    pc.SetEnergy("intel-rapl:0", 1'000'000);
    EXPECT_FALSE(m.Read(0.1).ok());
    EXPECT_EQ(m.j()[0], 0.0);
  }
}

TEST(RaplSourceTest, ReadingsThatAreNotNumbersFailTheReadAndLoseNothing) {
  for (const char* bad : {"", "garbage", "-5", "1.5", "0x10", "12 34",
                                 "99999999999999999999999", "18446744073709551616"}) {
    SCOPED_TRACE(bad);
    FakePowercap pc("garbage");
    pc.AddZone("intel-rapl:0", "package-0", 1'000'000, kRange, k100W);
    Meter m(pc);
    ASSERT_TRUE(m.ok());
    pc.SetFile("intel-rapl:0/energy_uj", bad);
    absl::Status st = m.Read(0.1);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(st, "intel-rapl:0/energy_uj")) << st;
    EXPECT_TRUE(m.j().empty());
    pc.SetEnergy("intel-rapl:0", 4'000'000);
    EXPECT_TRUE(m.Read(0.1).ok());
    EXPECT_DOUBLE_EQ(m.j()[0], 3.0);
  }
}

TEST(RaplSourceTest, OpenRefusesAZoneWhoseCounterOrRangeIsImpossible) {
  FakeClock clock;
  {
    FakePowercap pc("openabove");
    pc.AddZone("intel-rapl:0", "package-0", kRange + 1, kRange);
    auto rapl = RaplSource::Open(pc.root(), clock.Now());
    EXPECT_EQ(rapl.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(rapl.status(), "above max_energy_range_uj")) << rapl.status();
  }
  for (const char* bad : {"0", "garbage", "-1", "99999999999999999999999"}) {
    SCOPED_TRACE(bad);
    FakePowercap pc("openrange");
    pc.AddZone("intel-rapl:0", "package-0", 1, kRange);
    pc.SetFile("intel-rapl:0/max_energy_range_uj", bad);
    auto rapl = RaplSource::Open(pc.root(), clock.Now());
    EXPECT_EQ(rapl.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(rapl.status(), "max_energy_range_uj")) << rapl.status();
  }
}

// Two package zones showing one socket counter (AMD): identical, advancing readings.
TEST(RaplSourceTest, PackagesShowingOneCounterReadAfterReadAreCountedOnce) {
  FakePowercap pc("mirrorpkgs");
  pc.AddZone("intel-rapl:0", "package-0", 7'000'000, kRange, k100W);
  pc.AddZone("intel-rapl:1", "package-1", 7'000'000, kRange, k100W);
  Meter m(pc);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(Devices(m.source()), (std::vector<std::string>{"cpu-package-0", "cpu-package-1"}));
  double total = 0;
  for (int read = 1; read <= RaplSource::kMirrorReads + 2; ++read) {
    SCOPED_TRACE(read);
    const uint64_t e = 7'000'000 + read * 10'000'000;  // +10 J a read on both
    pc.SetEnergy("intel-rapl:0", e);
    pc.SetEnergy("intel-rapl:1", e);
    ASSERT_TRUE(m.Read(0.1).ok());
    EXPECT_DOUBLE_EQ(m.j()[0], 10.0);
    EXPECT_EQ(m.j()[1], 0.0);  // held back, then never counted
    total += m.j()[0] + m.j()[1];
    EXPECT_EQ(Notes(m.source()).size(), read >= RaplSource::kMirrorReads ? 1u : 0u);
  }
  EXPECT_DOUBLE_EQ(total, 10.0 * (RaplSource::kMirrorReads + 2));
  ASSERT_EQ(Notes(m.source()).size(), 1u);
  EXPECT_NE(Notes(m.source())[0].find("cpu-package-1 showed the same counter as cpu-package-0"),
            std::string::npos)
      << Notes(m.source())[0];
  // Merged for good: the mirror is no longer read, so its file may go away.
  std::filesystem::remove(pc.root() + "/intel-rapl:1/energy_uj");
  pc.SetEnergy("intel-rapl:0", 100'000'000);
  EXPECT_TRUE(m.Read(0.1).ok());
  EXPECT_EQ(m.j()[1], 0.0);
}

TEST(RaplSourceTest, ZonesThatMerelyCoincideAreNotMergedAndLoseNothing) {
  // Equal at Open and for `same` reads after it, then apart: two packages, every joule
  // of both counted, no note.
  for (int same = 0; same < RaplSource::kMirrorReads; ++same) {
    SCOPED_TRACE(same);
    FakePowercap pc("coincide");
    pc.AddZone("intel-rapl:0", "package-0", 7'000'000, kRange, k100W);
    pc.AddZone("intel-rapl:1", "package-1", 7'000'000, kRange, k100W);
    Meter m(pc);
    ASSERT_TRUE(m.ok());
    double j0 = 0, j1 = 0;
    uint64_t e0 = 7'000'000, e1 = 7'000'000;
    for (int read = 1; read <= same + 3; ++read) {
      e0 += 10'000'000;
      e1 += read <= same ? 10'000'000 : 20'000'000;
      pc.SetEnergy("intel-rapl:0", e0);
      pc.SetEnergy("intel-rapl:1", e1);
      ASSERT_TRUE(m.Read(0.1).ok());
      j0 += m.j()[0];
      j1 += m.j()[1];
    }
    EXPECT_DOUBLE_EQ(j0, (e0 - 7'000'000) / 1e6);
    EXPECT_DOUBLE_EQ(j1, (e1 - 7'000'000) / 1e6);
    EXPECT_TRUE(Notes(m.source()).empty());
  }
}

TEST(RaplSourceTest, AReadStraddlingACounterUpdateDoesNotHideAMirror) {
  // The two files are read microseconds apart; now and then the counter moves between
  // them. One read 1 mJ apart neither proves nor disproves.
  FakePowercap pc("straddle");
  pc.AddZone("intel-rapl:0", "package-0", 7'000'000, kRange, k100W);
  pc.AddZone("intel-rapl:1", "package-1", 7'000'000, kRange, k100W);
  Meter m(pc);
  ASSERT_TRUE(m.ok());
  double total = 0;
  for (int read = 1; read <= RaplSource::kMirrorReads + 1; ++read) {
    const uint64_t e = 7'000'000 + read * 10'000'000;
    pc.SetEnergy("intel-rapl:0", e);
    pc.SetEnergy("intel-rapl:1", read == 2 ? e + 1'000 : e);
    ASSERT_TRUE(m.Read(0.1).ok());
    total += m.j()[0] + m.j()[1];
  }
  EXPECT_EQ(Notes(m.source()).size(), 1u);
  EXPECT_DOUBLE_EQ(total, 10.0 * (RaplSource::kMirrorReads + 1));
}

TEST(RaplSourceTest, LookAlikesNeverProvedAreCountedInFull) {
  // Always within the skew allowance, never identical: after kMirrorMaxReads reads the
  // held-back energy is released and both zones count from then on.
  FakePowercap pc("lookalike");
  pc.AddZone("intel-rapl:0", "package-0", 7'000'000, kRange, k100W);
  pc.AddZone("intel-rapl:1", "package-1", 7'000'001, kRange, k100W);
  Meter m(pc);
  ASSERT_TRUE(m.ok());
  double j1 = 0;
  const int reads = RaplSource::kMirrorMaxReads + 2;
  for (int read = 1; read <= reads; ++read) {
    pc.SetEnergy("intel-rapl:0", 7'000'000 + read * 10'000'000);
    pc.SetEnergy("intel-rapl:1", 7'000'001 + read * 10'000'000);
    ASSERT_TRUE(m.Read(0.1).ok());
    if (read < RaplSource::kMirrorMaxReads) {
      EXPECT_EQ(m.j()[1], 0.0) << read;
    } else if (read > RaplSource::kMirrorMaxReads) {
      EXPECT_DOUBLE_EQ(m.j()[1], 10.0) << read;
    }
    j1 += m.j()[1];
  }
  EXPECT_DOUBLE_EQ(j1, 10.0 * reads);
  EXPECT_TRUE(Notes(m.source()).empty());
}

TEST(RaplSourceTest, APackageAndADramThatAgreeAreNotOneCounter) {
  FakePowercap pc("kinds");
  pc.AddZone("intel-rapl:0", "package-0", 7'000'000, kRange, k100W);
  pc.AddZone("intel-rapl:0/intel-rapl:0:0", "dram", 7'000'000, kRange, k100W);
  Meter m(pc);
  ASSERT_TRUE(m.ok());
  for (int read = 1; read <= RaplSource::kMirrorReads + 1; ++read) {
    pc.SetEnergy("intel-rapl:0", 7'000'000 + read * 10'000'000);
    pc.SetEnergy("intel-rapl:0/intel-rapl:0:0", 7'000'000 + read * 10'000'000);
    ASSERT_TRUE(m.Read(0.1).ok());
    EXPECT_DOUBLE_EQ(m.j()[1], 10.0);
  }
  EXPECT_TRUE(Notes(m.source()).empty());
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
