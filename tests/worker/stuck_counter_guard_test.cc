#include "worker/energy/stuck_counter_guard.h"

#include <gtest/gtest.h>

#include <numeric>

#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_cpu_times.h"
#include "worker/energy/energy_meter.h"

namespace joule::worker {
namespace {

using testing::FakeClock;
using testing::FakeCpuTimes;

// A source whose Read returns what the test set (`next`, per channel) or fails.
class SetSource final : public PowerSource {
 public:
  SetSource(const std::string& source, std::vector<std::string> devices) {
    for (const auto& d : devices) channels_.push_back({d, source, true, "", ""});
    next.assign(channels_.size(), 0.0);
  }
  const std::vector<EnergyChannel>& channels() const override { return channels_; }
  absl::Status Read(Clock::TimePoint, std::vector<double>* joules) override {
    ++reads;
    if (fail) {
      joules->clear();
      return absl::UnavailableError("read failed");
    }
    *joules = next;
    return absl::OkStatus();
  }
  std::vector<double> next;
  bool fail = false;
  int reads = 0;

 private:
  std::vector<EnergyChannel> channels_;
};

class StuckCounterGuardTest : public ::testing::Test {
 protected:
  StuckCounterGuardTest() {
    auto counter = std::make_unique<SetSource>("perf_rapl",
                                               std::vector<std::string>{"cpu-package-0", "dram-0"});
    auto fallback = std::make_unique<SetSource>("estimated", std::vector<std::string>{"cpu"});
    counter_ = counter.get();
    fallback_ = fallback.get();
    guard_ = std::make_unique<StuckCounterGuard>(std::move(counter), std::move(fallback), &cpu_);
  }
  // One interval: the counter gives `package` J (dram half of it), the fallback `estimate`
  // J, this process uses `cpu_seconds`; returns what the guard charged: (counter, fallback).
  std::pair<double, double> Interval(double package, double estimate, double cpu_seconds = 0.1) {
    counter_->next = {package, package / 2};
    fallback_->next = {estimate};
    cpu_.process += cpu_seconds;
    clock_.Advance(0.1);
    std::vector<double> j;
    (void)guard_->Read(clock_.Now(), &j);
    EXPECT_EQ(j.size(), 3u);
    if (j.size() != 3) return {0, 0};
    return {j[0] + j[1], j[2]};
  }
  std::string State(const std::string& source) const {
    std::vector<SourceState> states;
    guard_->AppendSourceStates(&states);
    for (const auto& s : states) {
      if (s.source == source) return s.state;
    }
    return "absent";
  }

  FakeClock clock_;
  FakeCpuTimes cpu_;
  SetSource* counter_;
  SetSource* fallback_;
  std::unique_ptr<StuckCounterGuard> guard_;
};

TEST_F(StuckCounterGuardTest, AnAdvancingCounterIsChargedAndTheFallbackStandsBy) {
  EXPECT_EQ(guard_->channels().size(), 3u);
  EXPECT_EQ(guard_->channels()[2].source, "estimated");
  for (int i = 0; i < 20; ++i) {
    const auto [counted, fallback] = Interval(2.0, 0.6);
    EXPECT_DOUBLE_EQ(counted, 3.0);
    EXPECT_DOUBLE_EQ(fallback, 0.0);
  }
  EXPECT_FALSE(guard_->stuck());
  EXPECT_EQ(State("perf_rapl"), "counting");
  EXPECT_EQ(State("estimated"), "standby");
  EXPECT_EQ(fallback_->reads, 20);  // read every interval, so current when needed
}

// A counter that reads 0 from the start (the VMs' perf psys counter): stuck after
// kStuckIntervals busy intervals, and the fallback charged from the first of them.
TEST_F(StuckCounterGuardTest, ACounterThatNeverMovesIsStuckAndEveryIntervalIsCharged) {
  double fallback_total = 0;
  for (int i = 0; i < StuckCounterGuard::kStuckIntervals - 1; ++i) {
    const auto [counted, fallback] = Interval(0.0, 0.6);
    EXPECT_DOUBLE_EQ(counted + fallback, 0.0);  // not yet proved: held
    EXPECT_FALSE(guard_->stuck());
  }
  const auto [counted, fallback] = Interval(0.0, 0.6);
  EXPECT_TRUE(guard_->stuck());
  fallback_total += fallback;
  EXPECT_DOUBLE_EQ(counted, 0.0);
  EXPECT_NEAR(fallback_total, StuckCounterGuard::kStuckIntervals * 0.6, 1e-9);
  fallback_total += Interval(0.0, 0.6).second;
  EXPECT_NEAR(fallback_total, (StuckCounterGuard::kStuckIntervals + 1) * 0.6, 1e-9);
  EXPECT_EQ(State("perf_rapl"), "stuck");
  EXPECT_EQ(State("estimated"), "standing_in");
  std::vector<SourceState> states;
  guard_->AppendSourceStates(&states);
  EXPECT_EQ(states[0].reason, "no_advance");  // a fixed code: a label
  std::vector<std::string> notes;
  guard_->AppendNotes(&notes);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("perf_rapl: no counter advanced in 5 intervals"), std::string::npos)
      << notes[0];
  EXPECT_NE(notes[0].find("charged to estimated"), std::string::npos) << notes[0];
}

// Idle intervals (no CPU time used) shorter than kStuckSeconds in all neither prove nor
// disprove; a counter still for kStuckSeconds is stuck though the process idles (a
// powered host's RAPL counters advance every millisecond).
TEST_F(StuckCounterGuardTest, IdleIntervalsProveACounterStuckOnlyAfterSeconds) {
  const int below = static_cast<int>(StuckCounterGuard::kStuckSeconds / 0.1) - 2;
  for (int i = 0; i < below; ++i) Interval(0.0, 0.0, /*cpu_seconds=*/0);
  EXPECT_FALSE(guard_->stuck());
  // Busy intervals with less CPU than kMinCpuSeconds in all: not proof either.
  Interval(0.0, 0.001, 0.001);
  EXPECT_FALSE(guard_->stuck());
  Interval(0.0, 0.001, 0.0);
  Interval(0.0, 0.001, 0.0);
  EXPECT_TRUE(guard_->stuck());
  std::vector<std::string> notes;
  guard_->AppendNotes(&notes);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("(5.0 s)"), std::string::npos) << notes[0];
}

// A counter that updates less often than the meter samples (NVML's: every 10-100 ms)
// reads 0 for a few intervals and then all of it: never stuck, nothing counted twice.
TEST_F(StuckCounterGuardTest, ASlowCounterIsNotStuckAndIsNotCountedTwice) {
  double counted = 0, fallback = 0;
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < StuckCounterGuard::kStuckIntervals - 2; ++i) {
      const auto [c, f] = Interval(0.0, 0.5);
      counted += c;
      fallback += f;
    }
    const auto [c, f] = Interval(4.0, 0.5);
    counted += c;
    fallback += f;
  }
  EXPECT_FALSE(guard_->stuck());
  EXPECT_DOUBLE_EQ(counted, 10 * 6.0);
  EXPECT_DOUBLE_EQ(fallback, 0.0);
}

// Counting, then stopped halfway (a frozen firmware counter), then resumed: each interval
// is charged once, to the counter or to the fallback, and the counter is taken back only
// after kConfirmIntervals advancing intervals (its first delta after the freeze is dropped).
TEST_F(StuckCounterGuardTest, ACounterThatStopsHalfwayAndResumesIsChargedOnceThroughout) {
  double counted = 0, fallback = 0;
  const auto add = [&](std::pair<double, double> r) {
    counted += r.first;
    fallback += r.second;
  };
  for (int i = 0; i < 10; ++i) add(Interval(2.0, 0.6));  // 10 x 3 J counted
  EXPECT_DOUBLE_EQ(counted, 30.0);
  for (int i = 0; i < 10; ++i) add(Interval(0.0, 0.6));  // stops: 10 x 0.6 J estimated
  EXPECT_TRUE(guard_->stuck());
  EXPECT_DOUBLE_EQ(counted, 30.0);
  EXPECT_NEAR(fallback, 6.0, 1e-9);
  // Resumes with a jump (the frozen time's energy): dropped, the fallback still charged.
  add(Interval(50.0, 0.6));
  EXPECT_TRUE(guard_->stuck());
  EXPECT_EQ(State("perf_rapl"), "stuck");
  add(Interval(2.0, 0.6));  // the second advance: counting again from the next interval
  EXPECT_FALSE(guard_->stuck());
  EXPECT_DOUBLE_EQ(counted, 30.0);
  EXPECT_NEAR(fallback, 6.0 + 2 * 0.6, 1e-9);
  for (int i = 0; i < 5; ++i) add(Interval(2.0, 0.6));
  EXPECT_DOUBLE_EQ(counted, 45.0);
  EXPECT_NEAR(fallback, 7.2, 1e-9);
  EXPECT_EQ(State("perf_rapl"), "counting");
  std::vector<std::string> notes;
  guard_->AppendNotes(&notes);
  EXPECT_TRUE(notes.empty());
}

// One advance among still intervals does not take a stuck counter back.
TEST_F(StuckCounterGuardTest, OneAdvanceIsNotAConfirmedResume) {
  for (int i = 0; i < StuckCounterGuard::kStuckIntervals; ++i) Interval(0.0, 0.6);
  ASSERT_TRUE(guard_->stuck());
  for (int i = 0; i < 5; ++i) {
    Interval(3.0, 0.6);
    Interval(0.0, 0.6);
  }
  EXPECT_TRUE(guard_->stuck());
}

// While counting, a failed read is a warning and a still interval (its source carries
// the energy into its next read); reads that keep failing end stuck with the fallback
// charged for every one of them; while stuck, a failed read still charges the fallback.
TEST_F(StuckCounterGuardTest, FailedCounterReadsAreStillIntervalsAndEndStuck) {
  counter_->fail = true;
  std::vector<double> j;
  double fallback = 0;
  for (int i = 0; i < StuckCounterGuard::kStuckIntervals; ++i) {
    fallback_->next = {0.6};
    cpu_.process += 0.1;
    clock_.Advance(0.1);
    const absl::Status st = guard_->Read(clock_.Now(), &j);
    if (!guard_->stuck()) {
      EXPECT_FALSE(st.ok()) << "a failed read is a warning";
    }
    ASSERT_EQ(j.size(), 3u);
    EXPECT_DOUBLE_EQ(j[0] + j[1], 0.0);
    fallback += j[2];
  }
  EXPECT_TRUE(guard_->stuck());
  EXPECT_NEAR(fallback, StuckCounterGuard::kStuckIntervals * 0.6, 1e-9);
  EXPECT_EQ(State("perf_rapl"), "stuck");
  std::vector<SourceState> states;
  guard_->AppendSourceStates(&states);
  EXPECT_EQ(states[0].reason, "unreadable");
  // Readable again and advancing: counted again after the confirmation.
  counter_->fail = false;
  Interval(2.0, 0.6);
  Interval(2.0, 0.6);
  EXPECT_FALSE(guard_->stuck());
}

// One failed read among advancing ones loses nothing: the fallback is not charged.
TEST_F(StuckCounterGuardTest, OneFailedReadWhileCountingChargesNoFallback) {
  Interval(2.0, 0.6);
  counter_->fail = true;
  std::vector<double> j;
  cpu_.process += 0.1;
  clock_.Advance(0.1);
  EXPECT_FALSE(guard_->Read(clock_.Now(), &j).ok());
  counter_->fail = false;
  const auto [counted, fallback] = Interval(4.0, 0.6);  // the carried interval's energy
  EXPECT_DOUBLE_EQ(counted, 6.0);
  EXPECT_DOUBLE_EQ(fallback, 0.0);
  EXPECT_FALSE(guard_->stuck());
}

// While stuck, a counter that cannot even be read does not lose the fallback's interval.
TEST_F(StuckCounterGuardTest, AFailedCounterReadWhileStuckStillChargesTheFallback) {
  std::vector<double> j;
  for (int i = 0; i < StuckCounterGuard::kStuckIntervals; ++i) Interval(0.0, 0.6);
  ASSERT_TRUE(guard_->stuck());
  counter_->fail = true;
  fallback_->next = {0.7};
  cpu_.process += 0.1;
  clock_.Advance(0.1);
  (void)guard_->Read(clock_.Now(), &j);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_DOUBLE_EQ(j[2], 0.7);
  EXPECT_DOUBLE_EQ(j[0] + j[1], 0.0);
}

// The counter and its standby are read over the same intervals: the job gets both as a
// cross-check (NVML's counter against its power integral), each as charged to it; none
// while the counter is stuck (then only one is a measurement).
TEST(StuckCounterCrossCheckTest, AJobGetsTheCounterAgainstItsStandby) {
  FakeClock clock;
  FakeCpuTimes cpu;
  PhaseClock phases(&clock);
  auto counter = std::make_unique<SetSource>("nvml", std::vector<std::string>{"gpu-0"});
  auto power = std::make_unique<SetSource>("nvml_power", std::vector<std::string>{"gpu-0"});
  SetSource* c = counter.get();
  SetSource* p = power.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(
      std::make_unique<StuckCounterGuard>(std::move(counter), std::move(power), &cpu));
  EnergyMeter meter(std::move(sources), &phases, &cpu, &clock);
  meter.BeginJob("4", "0");
  for (int i = 0; i < 10; ++i) {
    c->next = {50.0};
    p->next = {50.5};
    cpu.process += 0.1;
    cpu.system_busy += 0.1;  // this process: the whole machine's CPU (share 1)
    clock.Advance(0.1);
    meter.Sample();
  }
  c->next = {0.0};
  p->next = {0.0};
  JobEnergy e = meter.EndJob();
  EXPECT_NEAR(e.total_joules, 500.0, 1e-9);
  ASSERT_EQ(e.cross_checks.size(), 1u);
  const auto& [pair, joules] = *e.cross_checks.begin();
  EXPECT_EQ(pair.first, "nvml");
  EXPECT_EQ(pair.second, "nvml_power");
  EXPECT_NEAR(joules.first, 500.0, 1e-9);
  EXPECT_NEAR(joules.second, 505.0, 1e-9);
}

}  // namespace
}  // namespace joule::worker
