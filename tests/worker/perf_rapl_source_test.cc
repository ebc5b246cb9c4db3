#include "worker/energy/perf_rapl_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_cpu_times.h"
#include "tests/testing/scratch_dir.h"
#include "worker/energy/estimated_source.h"
#include "worker/energy/stuck_counter_guard.h"

namespace joule::worker {
namespace {

using testing::FakeClock;
using testing::ScratchDir;

constexpr double kScale = 2.3283064365386962890625e-10;  // 2^-32 J, what Intel and AMD give
constexpr uint64_t kCountsPerJoule = uint64_t{1} << 32;

// The PMU's sysfs description in a scratch directory, laid out as the kernel's
// (/sys/bus/event_source/devices/power).
class FakePmu {
 public:
  explicit FakePmu(const std::filesystem::path& dir) : dir_(dir) {
    std::filesystem::create_directories(dir_ / "events");
    Write("type", "9");
    Write("cpumask", "0");
  }
  void AddEvent(const std::string& name, const std::string& event,
                const std::string& scale = "2.3283064365386962890625e-10",
                const std::string& unit = "Joules") {
    Write("events/" + name, event);
    Write("events/" + name + ".scale", scale);
    Write("events/" + name + ".unit", unit);
  }
  void Write(const std::string& file, const std::string& text) {
    std::ofstream(dir_ / file, std::ios::trunc) << text << "\n";
  }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

// Counters the test sets, by (config, cpu): the seam the source reads the kernel through.
class FakeReader final : public PerfCounterReader {
 public:
  absl::StatusOr<int> Open(uint32_t type, uint64_t config, int cpu) override {
    if (!open_error.ok()) return open_error;
    EXPECT_EQ(type, 9u);
    opened.push_back({config, cpu});
    return static_cast<int>(opened.size() - 1);
  }
  absl::StatusOr<uint64_t> Read(int handle) override {
    if (!read_error.ok()) return read_error;
    return counts[opened.at(handle)];
  }
  // Sets counter (config, cpu).
  void Set(uint64_t config, int cpu, uint64_t count) { counts[{config, cpu}] = count; }
  std::vector<std::pair<uint64_t, int>> opened;
  std::map<std::pair<uint64_t, int>, uint64_t> counts;
  absl::Status open_error, read_error;
};

std::vector<std::string> PerfDevices(const RaplSource& s) {
  std::vector<std::string> out;
  for (const auto& ch : s.channels()) out.push_back(ch.device);
  return out;
}

class PerfRaplTest : public ::testing::Test {
 protected:
  ScratchDir scratch_{"perf_rapl"};
  FakePmu pmu_{scratch_ / "power"};
  std::shared_ptr<FakeReader> reader_ = std::make_shared<FakeReader>();
  FakeClock clock_;
};

TEST_F(PerfRaplTest, ReadsThePmuAsTheKernelDescribesIt) {
  pmu_.Write("cpumask", "0,28");
  pmu_.AddEvent("energy-pkg", "event=0x02");
  pmu_.AddEvent("energy-ram", "event=0x03");
  absl::StatusOr<PerfPowerPmu> pmu = ReadPerfPowerPmu(pmu_.dir());
  ASSERT_TRUE(pmu.ok()) << pmu.status();
  EXPECT_EQ(pmu->type, 9u);
  EXPECT_EQ(pmu->cpus, (std::vector<int>{0, 28}));
  ASSERT_EQ(pmu->events.size(), 2u);
  EXPECT_EQ(pmu->events[0].name, "energy-pkg");
  EXPECT_EQ(pmu->events[0].config, 2u);
  EXPECT_DOUBLE_EQ(pmu->events[0].scale, kScale);
  EXPECT_EQ(pmu->events[1].config, 3u);
  pmu_.Write("cpumask", "0-1,4");
  EXPECT_EQ(ReadPerfPowerPmu(pmu_.dir())->cpus, (std::vector<int>{0, 1, 4}));
}

// Every malformed file is a one-line error naming it; nothing is opened.
TEST_F(PerfRaplTest, AMalformedDescriptionIsAOneLineErrorNamingTheFile) {
  struct Case {
    std::string file, text, expect;
  };
  for (const Case& c :
       {Case{"type", "nine", "type"}, Case{"type", "", "type"}, Case{"cpumask", "", "cpumask"},
        Case{"cpumask", "0-", "cpumask"}, Case{"cpumask", "3-1", "cpumask"},
        Case{"cpumask", "x", "cpumask"}, Case{"events/energy-pkg", "config=0x02", "energy-pkg"},
        Case{"events/energy-pkg", "event=0xzz", "energy-pkg"},
        Case{"events/energy-pkg", "event=2", "energy-pkg"},
        Case{"events/energy-pkg.scale", "-1e-10", "energy-pkg.scale"},
        Case{"events/energy-pkg.scale", "0", "energy-pkg.scale"},
        Case{"events/energy-pkg.scale", "nan", "energy-pkg.scale"},
        Case{"events/energy-pkg.scale", "inf", "energy-pkg.scale"},
        Case{"events/energy-pkg.scale", "J", "energy-pkg.scale"},
        Case{"events/energy-pkg.unit", "Watts", "energy-pkg.unit"},
        Case{"events/energy-pkg.scale", "\xff\xfe", "energy-pkg.scale"},
        Case{"events/energy-pkg", "event=0x02\nevent=0x03", "energy-pkg"},
        Case{"cpumask", "0-2147483647", "cpumask"},
        Case{"events/energy-pkg", std::string(5000, 'x'), "energy-pkg"}}) {
    ScratchDir scratch("perf_rapl_bad");
    FakePmu pmu(scratch / "power");
    pmu.AddEvent("energy-pkg", "event=0x02");
    pmu.Write(c.file, c.text);
    auto reader = std::make_shared<FakeReader>();
    absl::StatusOr<std::unique_ptr<RaplSource>> s =
        OpenPerfRaplSource(pmu.dir(), reader, clock_.Now());
    ASSERT_FALSE(s.ok()) << c.file << " = " << c.text;
    const std::string message(s.status().message());
    EXPECT_NE(message.find(c.expect), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_TRUE(reader->opened.empty());
  }
  EXPECT_EQ(ReadPerfPowerPmu((scratch_ / "absent").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(PerfRaplTest, CountsPackageAndRamPerPackageButNotCoresOrGpu) {
  pmu_.Write("cpumask", "0,28");
  pmu_.AddEvent("energy-cores", "event=0x01");
  pmu_.AddEvent("energy-pkg", "event=0x02");
  pmu_.AddEvent("energy-ram", "event=0x03");
  pmu_.AddEvent("energy-gpu", "event=0x04");
  pmu_.AddEvent("energy-psys", "event=0x05");  // never beside a package
  auto s = OpenPerfRaplSource(pmu_.dir(), reader_, clock_.Now());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(PerfDevices(**s),
            (std::vector<std::string>{"cpu-package-0", "dram-0", "cpu-package-1", "dram-1"}));
  EXPECT_EQ((*s)->channels()[0].source, "perf_rapl");
  EXPECT_TRUE((*s)->channels()[0].shared);
  EXPECT_EQ(reader_->opened,
            (std::vector<std::pair<uint64_t, int>>{{2, 0}, {3, 0}, {2, 28}, {3, 28}}));

  // 12.5 J on package 0, 30 J on package 1, 1 J and 8 J of DRAM, in 0.5 s; the cores'
  // counter moves too and is not added. (Counters of one kind closer than 5 ms at the
  // default 1 kW may be one counter: their energy would be held back until they part.)
  reader_->Set(2, 0, 25 * kCountsPerJoule / 2);
  reader_->Set(2, 28, 30 * kCountsPerJoule);
  reader_->Set(3, 0, kCountsPerJoule);
  reader_->Set(3, 28, 8 * kCountsPerJoule);
  reader_->Set(1, 0, 10 * kCountsPerJoule);
  clock_.Advance(0.5);
  std::vector<double> j;
  ASSERT_TRUE((*s)->Read(clock_.Now(), &j).ok());
  ASSERT_EQ(j.size(), 4u);
  EXPECT_NEAR(j[0], 12.5, 1e-5);
  EXPECT_NEAR(j[1], 1.0, 1e-5);
  EXPECT_NEAR(j[2], 30.0, 1e-5);
  EXPECT_NEAR(j[3], 8.0, 1e-5);
}

TEST_F(PerfRaplTest, PsysIsCountedWhereThereIsNoPackage) {
  pmu_.AddEvent("energy-psys", "event=0x05");  // what the VMs here show
  auto s = OpenPerfRaplSource(pmu_.dir(), reader_, clock_.Now());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(PerfDevices(**s), (std::vector<std::string>{"psys"}));
  reader_->Set(5, 0, 7 * kCountsPerJoule);
  clock_.Advance(1.0);
  std::vector<double> j;
  ASSERT_TRUE((*s)->Read(clock_.Now(), &j).ok());
  EXPECT_NEAR(j.at(0), 7.0, 1e-5);
}

TEST_F(PerfRaplTest, NoCountedEventIsNotFound) {
  pmu_.AddEvent("energy-cores", "event=0x01");
  auto s = OpenPerfRaplSource(pmu_.dir(), reader_, clock_.Now());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
}

// The kernel's count is 64 bits from the open; it wraps at 2^64 counts (4.3e9 J at 2^-32),
// and a wrap between two reads is counted as the energy it is.
TEST_F(PerfRaplTest, ACountThatWrapsAt64BitsIsCountedAcrossTheWrap) {
  pmu_.AddEvent("energy-pkg", "event=0x02");
  const uint64_t near_end = ~uint64_t{0} - 3 * kCountsPerJoule;  // 3 J before the wrap
  reader_->Set(2, 0, near_end);
  auto s = OpenPerfRaplSource(pmu_.dir(), reader_, clock_.Now());
  ASSERT_TRUE(s.ok()) << s.status();
  reader_->Set(2, 0, 5 * kCountsPerJoule);  // 3 J to the end, then 5 J
  clock_.Advance(0.1);
  std::vector<double> j;
  ASSERT_TRUE((*s)->Read(clock_.Now(), &j).ok());
  EXPECT_NEAR(j.at(0), 8.0, 1e-3);
}

TEST_F(PerfRaplTest, AResetIsDroppedWithAWarningNotCountedAsAWrap) {
  pmu_.AddEvent("energy-pkg", "event=0x02");
  reader_->Set(2, 0, 1000 * kCountsPerJoule);
  auto s = OpenPerfRaplSource(pmu_.dir(), reader_, clock_.Now());
  ASSERT_TRUE(s.ok()) << s.status();
  reader_->Set(2, 0, 10 * kCountsPerJoule);
  clock_.Advance(0.1);
  std::vector<double> j;
  absl::Status st = (*s)->Read(clock_.Now(), &j);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(st.message()).find("perf_rapl cpu-package-0"), std::string::npos) << st;
  EXPECT_DOUBLE_EQ(j.at(0), 0.0);
  reader_->Set(2, 0, 12 * kCountsPerJoule);  // counting resumes from the new reading
  clock_.Advance(0.1);
  ASSERT_TRUE((*s)->Read(clock_.Now(), &j).ok());
  EXPECT_NEAR(j.at(0), 2.0, 1e-5);
}

// Each package's event is opened on its own CPU: distinct counters by construction. They
// all start at 0 (perf counts from the open), so they look alike at first, and each is
// counted from its first read all the same (not held back as a possible mirror).
TEST_F(PerfRaplTest, PackagesThatReadAlikeAreEachCountedFromTheFirstRead) {
  pmu_.Write("cpumask", "0,1");
  pmu_.AddEvent("energy-pkg", "event=0x02");
  auto s = OpenPerfRaplSource(pmu_.dir(), reader_, clock_.Now());
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<double> j;
  for (int i = 1; i <= 5; ++i) {
    reader_->Set(2, 0, i * 10 * kCountsPerJoule);
    reader_->Set(2, 1, i * 10 * kCountsPerJoule);
    clock_.Advance(0.1);
    ASSERT_TRUE((*s)->Read(clock_.Now(), &j).ok());
    EXPECT_NEAR(j[0], 10.0, 1e-4);
    EXPECT_NEAR(j[1], 10.0, 1e-4);
  }
  std::vector<std::string> notes;
  (*s)->AppendNotes(&notes);
  EXPECT_TRUE(notes.empty());
}

TEST_F(PerfRaplTest, APermissionErrorNamesWhatToGrant) {
  pmu_.AddEvent("energy-pkg", "event=0x02");
  reader_->open_error =
      absl::PermissionDeniedError("perf_event_open on cpu 0: permission denied (... CAP_PERFMON)");
  auto s = OpenPerfRaplSource(pmu_.dir(), reader_, clock_.Now());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(std::string(s.status().message()).find("power/energy-pkg/"), std::string::npos)
      << s.status();
}

// The kernel's own PMU where this machine has one: opened through perf_event_open (root,
// or perf_event_paranoid <= 0, or CAP_PERFMON), read while this process works. A counter
// that advanced is counted; one that never moved (the VMs here: a psys counter that reads
// 0 J) is declared stuck by the guard and `estimated` charged for it: never 0 J for work.
TEST(PerfRaplRealTest, TheKernelsPmuIsReadAndACounterThatNeverMovesIsStuck) {
  const std::string dir = "/sys/bus/event_source/devices/power";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no perf power PMU on this machine";
  FakeClock clock;
  auto perf = OpenPerfRaplSource(dir, SystemPerfCounterReader(), clock.Now());
  // Not permitted (non-root, perf_event_paranoid > 0), or a kernel or sandbox that has the
  // PMU's files but cannot open it (EINVAL, ENOENT, EOPNOTSUPP: UNAVAILABLE).
  if (perf.status().code() == absl::StatusCode::kPermissionDenied ||
      perf.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << perf.status();
  }
  ASSERT_TRUE(perf.ok()) << perf.status();
  ProcCpuTimes cpu;
  StuckCounterGuard guard(*std::move(perf),
                          std::make_unique<EstimatedSource>(&cpu, EstimateOptions{}, clock.Now()),
                          &cpu);
  const size_t counters = guard.channels().size() - 1;
  double counted = 0, estimated = 0;
  std::vector<double> j;
  for (int i = 0; i < 2 * StuckCounterGuard::kStuckIntervals; ++i) {
    // About 50 ms of CPU per interval.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    volatile double x = 1;
    while (std::chrono::steady_clock::now() < until) x = std::sqrt(x + 1.0);
    clock.Advance(0.05);
    ASSERT_TRUE(guard.Read(clock.Now(), &j).ok() || j.size() == guard.channels().size());
    for (size_t c = 0; c < counters; ++c) counted += j[c];
    estimated += j.back();
  }
  if (counted > 0) {
    EXPECT_FALSE(guard.stuck()) << "a counter that advanced";
    EXPECT_DOUBLE_EQ(estimated, 0.0);
  } else {
    EXPECT_TRUE(guard.stuck()) << "a counter that never moved while this process worked";
    EXPECT_GT(estimated, 0.0);
    std::vector<std::string> notes;
    guard.AppendNotes(&notes);
    ASSERT_FALSE(notes.empty());
    EXPECT_NE(notes.back().find("perf_rapl: no counter advanced"), std::string::npos)
        << notes.back();
  }
}

}  // namespace
}  // namespace joule::worker
