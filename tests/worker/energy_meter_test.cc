#include "worker/energy/energy_meter.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_cpu_times.h"
#include "tests/testing/fake_powercap.h"
#include "worker/energy/estimated_source.h"
#include "worker/energy/rapl_source.h"

namespace joule::worker {
namespace {

using testing::FakeClock;
using testing::FakeCpuTimes;
using testing::FakePowercap;

// A source whose next Read returns what the test queued.
class ScriptedSource final : public PowerSource {
 public:
  ScriptedSource(std::string device, bool shared) {
    channels_.push_back({device, "rapl", shared, "", ""});
  }
  const std::vector<EnergyChannel>& channels() const override { return channels_; }
  absl::Status Read(Clock::TimePoint, std::vector<double>* joules) override {
    joules->assign(1, next);
    if (!keep) next = 0;
    return status;
  }
  void AppendNotes(std::vector<std::string>* out) const override {
    out->insert(out->end(), notes.begin(), notes.end());
  }
  std::vector<std::string> notes;
  double next = 0;
  bool keep = false;  // return `next` on every read
  absl::Status status;

 private:
  std::vector<EnergyChannel> channels_;
};

std::map<std::string, double> ByPhase(const JobEnergy& e) {
  std::map<std::string, double> out;
  for (const auto& entry : e.entries) out[entry.phase] += entry.joules;
  return out;
}

class EnergyMeterTest : public ::testing::Test {
 protected:
  EnergyMeterTest() : phases_(&clock_) {}
  FakeClock clock_;
  FakeCpuTimes cpu_;
  PhaseClock phases_;
};

TEST_F(EnergyMeterTest, SplitsAnIntervalOverPhasesByTheirTime) {
  auto source = std::make_unique<ScriptedSource>("gpu-0", /*shared=*/false);
  ScriptedSource* s = source.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(source));
  EnergyMeter meter(std::move(sources), &phases_, &cpu_, &clock_);
  meter.BeginJob("7", "1");
  phases_.Enter(Phase::kForward);
  clock_.Advance(0.3);
  phases_.Enter(Phase::kBackward);
  clock_.Advance(0.1);
  s->next = 8.0;
  meter.Sample();
  JobEnergy e = meter.JobTotals();
  EXPECT_DOUBLE_EQ(e.total_joules, 8.0);
  EXPECT_DOUBLE_EQ(ByPhase(e)["forward"], 6.0);
  EXPECT_DOUBLE_EQ(ByPhase(e)["backward"], 2.0);
  EXPECT_DOUBLE_EQ(e.watts, 20.0);  // 8 J over 0.4 s
  EXPECT_FALSE(e.estimated);
}

TEST_F(EnergyMeterTest, ChargesASharedPackageByCpuTimeShare) {
  auto source = std::make_unique<ScriptedSource>("cpu-package-0", /*shared=*/true);
  ScriptedSource* s = source.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(source));
  EnergyMeter meter(std::move(sources), &phases_, &cpu_, &clock_);
  // This process used 0.5 of the 2.0 busy CPU seconds the machine spent: a quarter.
  cpu_.process += 0.5;
  cpu_.system_busy += 2.0;
  clock_.Advance(1.0);
  s->next = 40.0;
  meter.Sample();
  JobEnergy e = meter.JobTotals();
  EXPECT_DOUBLE_EQ(e.total_joules, 10.0);
  EXPECT_DOUBLE_EQ(ByPhase(e)["idle"], 10.0);  // no phase stamped: idle
}

TEST_F(EnergyMeterTest, JobsAreChargedSeparatelyAndTheListenerSeesLabels) {
  auto source = std::make_unique<ScriptedSource>("gpu-0", false);
  ScriptedSource* s = source.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(source));
  EnergyMeter meter(std::move(sources), &phases_, &cpu_, &clock_);
  std::map<std::string, double> listened;  // job -> joules the listener was given
  meter.SetListener([&](const EnergySample& sample) {
    for (const auto& e : sample.entries) listened[sample.job] += e.joules;
  });
  clock_.Advance(1);
  s->next = 2;  // before any job: charged to no job
  meter.BeginJob("1", "0");
  clock_.Advance(1);
  s->next = 3;
  JobEnergy first = meter.EndJob();
  EXPECT_DOUBLE_EQ(first.total_joules, 3.0);
  meter.BeginJob("2", "0");
  EXPECT_DOUBLE_EQ(meter.JobTotals().total_joules, 0.0);
  clock_.Advance(1);
  s->next = 5;
  meter.Sample();
  EXPECT_DOUBLE_EQ(meter.JobTotals().total_joules, 5.0);
  EXPECT_DOUBLE_EQ(listened[""], 2.0);
  EXPECT_DOUBLE_EQ(listened["1"], 3.0);
  EXPECT_DOUBLE_EQ(listened["2"], 5.0);
}

TEST_F(EnergyMeterTest, JobTotalsEqualWhatTheListenerSawWhileTheThreadSamples) {
  // The sampling thread runs (real time) while jobs begin and end (fake time moves on
  // each switch): every joule the listener attributes to a job is in that job's totals.
  auto source = std::make_unique<ScriptedSource>("gpu-0", false);
  source->next = 0.5;
  source->keep = true;
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(source));
  std::mutex mu;
  std::map<std::string, double> listened;
  EnergyMeter meter(std::move(sources), &phases_, &cpu_, &clock_);
  meter.SetListener([&](const EnergySample& sample) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& e : sample.entries) listened[sample.job] += e.joules;
  });
  meter.Start(std::chrono::milliseconds(1));
  std::map<std::string, double> totals;
  for (int j = 0; j < 50; ++j) {
    const std::string job = std::to_string(j);
    meter.BeginJob(job, "0");
    clock_.Advance(0.01);
    totals[job] = meter.EndJob().total_joules;
  }
  meter.Stop();
  std::lock_guard<std::mutex> lock(mu);
  double all = 0;
  for (const auto& [job, joules] : totals) {
    EXPECT_DOUBLE_EQ(joules, listened[job]) << job;
    all += joules;
  }
  EXPECT_GE(all, 50 * 0.5);  // at least the sample that ends each job
}

TEST_F(EnergyMeterTest, AnIntervalWithNoBusyTicksKeepsTheLastShare) {
  auto source = std::make_unique<ScriptedSource>("cpu-package-0", /*shared=*/true);
  ScriptedSource* s = source.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(source));
  EnergyMeter meter(std::move(sources), &phases_, &cpu_, &clock_);
  cpu_.process += 1.0;
  cpu_.system_busy += 2.0;
  clock_.Advance(1.0);
  s->next = 10.0;
  meter.Sample();  // share 0.5
  clock_.Advance(1.0);
  s->next = 10.0;
  meter.Sample();  // no ticks at all in the window's new interval: still 0.5, not 0
  EXPECT_DOUBLE_EQ(meter.JobTotals().total_joules, 10.0);
}

TEST_F(EnergyMeterTest, SourceWarningsReachTheJob) {
  auto source = std::make_unique<ScriptedSource>("cpu-package-0", false);
  ScriptedSource* s = source.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(source));
  EnergyMeter meter(std::move(sources), &phases_, &cpu_, &clock_);
  s->status = absl::DataLossError("rapl cpu-package-0: may have wrapped more than once");
  s->next = 1;
  clock_.Advance(1);
  meter.Sample();
  meter.Sample();  // the same warning is kept once
  JobEnergy e = meter.JobTotals();
  ASSERT_EQ(e.warnings.size(), 1u);
  EXPECT_NE(e.warnings[0].find("wrapped"), std::string::npos);
  EXPECT_DOUBLE_EQ(e.total_joules, 1.0);  // the lower bound is still counted
}

TEST_F(EnergyMeterTest, SourceNotesReachEveryJob) {
  auto source = std::make_unique<ScriptedSource>("cpu-package-0", false);
  ScriptedSource* s = source.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(source));
  EnergyMeter meter(std::move(sources), &phases_, &cpu_, &clock_);
  s->notes = {"rapl: cpu-package-1 showed the same counter as cpu-package-0"};
  meter.BeginJob("1", "0");
  clock_.Advance(1);
  meter.Sample();
  meter.Sample();
  EXPECT_EQ(meter.EndJob().warnings, s->notes);
  meter.BeginJob("2", "0");  // a standing note: the next job's report has it too
  clock_.Advance(1);
  EXPECT_EQ(meter.EndJob().warnings, s->notes);
}

TEST_F(EnergyMeterTest, ARaplCounterResetIsAWarningNotEnergy) {
  FakePowercap pc("meterreset");
  pc.AddZone("intel-rapl:0", "package-0", 5'000'000'000, 262143328850, 100'000'000);
  auto rapl = RaplSource::Open(pc.root(), clock_.Now());
  ASSERT_TRUE(rapl.ok()) << rapl.status();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(*std::move(rapl));
  EnergyMeter meter(std::move(sources), &phases_, &cpu_, &clock_);
  meter.BeginJob("1", "0");
  cpu_.process += 1.0;
  cpu_.system_busy += 1.0;  // share 1
  pc.SetEnergy("intel-rapl:0", 5'010'000'000);  // +10 J
  clock_.Advance(0.1);
  meter.Sample();
  pc.SetEnergy("intel-rapl:0", 1'000);  // reset: 262 kJ if read as a wrap
  clock_.Advance(0.1);
  meter.Sample();
  pc.SetEnergy("intel-rapl:0", 5'001'000);  // +5 J
  clock_.Advance(0.1);
  meter.Sample();
  JobEnergy e = meter.EndJob();
  EXPECT_DOUBLE_EQ(e.total_joules, 15.0);
  ASSERT_EQ(e.warnings.size(), 1u);
  EXPECT_NE(e.warnings[0].find("interval dropped"), std::string::npos) << e.warnings[0];
}

TEST(EstimatedSourceTest, CpuSecondsTimesWattsPlusIdle) {
  FakeClock clock;
  FakeCpuTimes cpu;
  cpu.process = 10;
  EstimateOptions options;
  options.watts_per_busy_core = 6.0;
  options.idle_watts = 2.0;
  EstimatedSource source(&cpu, options, clock.Now());
  EXPECT_EQ(source.channels()[0].source, "estimated");
  EXPECT_FALSE(source.channels()[0].shared);
  cpu.process = 11.5;  // 1.5 busy core-seconds
  clock.Advance(3.0);
  std::vector<double> j;
  ASSERT_TRUE(source.Read(clock.Now(), &j).ok());
  EXPECT_DOUBLE_EQ(j[0], 1.5 * 6.0 + 3.0 * 2.0);
}

TEST(EstimatedSourceTest, MeterMarksTheJobEstimated) {
  FakeClock clock;
  FakeCpuTimes cpu;
  PhaseClock phases(&clock);
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::make_unique<EstimatedSource>(&cpu, EstimateOptions{}, clock.Now()));
  EnergyMeter meter(std::move(sources), &phases, &cpu, &clock);
  phases.Enter(Phase::kCommunication);
  cpu.process += 2.0;
  cpu.system_busy += 2.0;
  clock.Advance(1.0);
  meter.Sample();
  JobEnergy e = meter.JobTotals();
  EXPECT_TRUE(e.estimated);
  EXPECT_DOUBLE_EQ(e.total_joules, 12.0);  // 2 CPU s x 6 W default
  EXPECT_DOUBLE_EQ(ByPhase(e)["communication"], 12.0);
}

TEST(PhaseClockTest, TakeIntervalSplitsTheCurrentPhase) {
  FakeClock clock;
  PhaseClock phases(&clock);
  phases.Enter(Phase::kData);
  clock.Advance(0.25);
  PhaseSeconds first = phases.TakeInterval();
  EXPECT_DOUBLE_EQ(first[static_cast<int>(Phase::kData)], 0.25);
  clock.Advance(0.5);
  {
    ScopedPhase eval(&phases, Phase::kEvaluation);
    clock.Advance(1.0);
  }
  EXPECT_EQ(phases.current(), Phase::kData);
  PhaseSeconds second = phases.TakeInterval();
  EXPECT_DOUBLE_EQ(second[static_cast<int>(Phase::kData)], 0.5);
  EXPECT_DOUBLE_EQ(second[static_cast<int>(Phase::kEvaluation)], 1.0);
}

TEST(OpenPowerSourcesTest, FallsBackToTheEstimateWithoutPowercapOrPerf) {
  FakeClock clock;
  FakeCpuTimes cpu;
  EnergyOptions options;
  options.powercap_root = "/nonexistent/powercap";
  options.perf_power_pmu = "/nonexistent/power";
  auto sources = OpenPowerSources(options, &cpu, &clock);
  ASSERT_EQ(sources.size(), 1u);
  EXPECT_EQ(sources[0]->channels()[0].source, "estimated");
}

// Perf counters the test sets (all of them to `count`).
class FixedPerfReader final : public PerfCounterReader {
 public:
  absl::StatusOr<int> Open(uint32_t, uint64_t, int) override { return 0; }
  absl::StatusOr<uint64_t> Read(int) override { return count; }
  uint64_t count = 0;
};

// The order per zone: powercap files, else the perf PMU, else the estimate; a counter
// source is watched for sticking, with the estimate standing by.
TEST(OpenPowerSourcesTest, TakesPowercapThenThePerfPmuThenTheEstimate) {
  FakeClock clock;
  FakeCpuTimes cpu;
  FakePowercap pc("order");
  pc.AddZone("intel-rapl:0", "package-0", 1'000'000, 262143328850);
  const std::filesystem::path pmu =
      std::filesystem::temp_directory_path() / ("joule_pmu_order_" + std::to_string(getpid()));
  std::filesystem::create_directories(pmu / "events");
  std::ofstream(pmu / "type") << "9\n";
  std::ofstream(pmu / "cpumask") << "0\n";
  std::ofstream(pmu / "events/energy-pkg") << "event=0x02\n";
  std::ofstream(pmu / "events/energy-pkg.scale") << "2.3283064365386962890625e-10\n";
  EnergyOptions options;
  options.powercap_root = pc.root();
  options.perf_power_pmu = pmu.string();
  auto reader = std::make_shared<FixedPerfReader>();
  options.perf_reader = reader;
  const auto sources_of = [&] {
    std::vector<std::string> out;
    for (const auto& s : OpenPowerSources(options, &cpu, &clock)) {
      for (const auto& ch : s->channels()) out.push_back(ch.source);
    }
    return out;
  };
  EXPECT_EQ(sources_of(), (std::vector<std::string>{"rapl", "estimated"}));
  pc.MakeUnreadable("intel-rapl:0/energy_uj");  // non-root since Linux 5.10
  EXPECT_EQ(sources_of(), (std::vector<std::string>{"perf_rapl", "estimated"}));
  options.perf_power_pmu = "/nonexistent/power";
  EXPECT_EQ(sources_of(), (std::vector<std::string>{"estimated"}));
  std::filesystem::remove_all(pmu);
}

// A meter whose counter never moves charges the estimate for the work, names the stuck
// source in the job's warnings, and gives the sources' states to the listener.
TEST(OpenPowerSourcesTest, AStuckCounterIsChargedToTheEstimateAndTheJobSaysSo) {
  FakeClock clock;
  FakeCpuTimes cpu;
  PhaseClock phases(&clock);
  FakePowercap pc("stuck");
  pc.AddZone("intel-rapl:0", "package-0", 1'000'000, 262143328850);
  EnergyOptions options;
  options.powercap_root = pc.root();
  options.estimate.watts_per_busy_core = 10;
  options.stuck_probe = std::chrono::milliseconds(0);  // proved by the intervals below
  options.perf_power_pmu = "";                         // this machine's PMU is not a fallback here
  EnergyMeter meter(OpenPowerSources(options, &cpu, &clock), &phases, &cpu, &clock);
  std::vector<SourceState> last_states;
  meter.SetListener([&](const EnergySample& s) { last_states = s.sources; });
  meter.BeginJob("3", "0");
  EXPECT_EQ(meter.source_names(), (std::vector<std::string>{"rapl"}));
  for (int i = 0; i < 10; ++i) {
    cpu.process += 0.1;  // a whole core busy, the counter frozen
    cpu.system_busy += 0.1;
    clock.Advance(0.1);
    meter.Sample();
  }
  JobEnergy e = meter.EndJob();
  EXPECT_NEAR(e.total_joules, 10 * 0.1 * 10, 1e-6);  // every interval, at 10 W a core
  EXPECT_TRUE(e.estimated);
  bool named = false;
  for (const auto& w : e.warnings)
    named |= w.find("rapl: no counter advanced") != std::string::npos;
  EXPECT_TRUE(named) << ::testing::PrintToString(e.warnings);
  EXPECT_EQ(meter.source_names(), (std::vector<std::string>{"estimated"}));
  ASSERT_EQ(last_states.size(), 2u);
  EXPECT_EQ(last_states[0].source, "rapl");
  EXPECT_EQ(last_states[0].state, "stuck");
  EXPECT_EQ(last_states[1].state, "standing_in");
}

// At a worker's start a RAPL counter that does not move in stuck_probe is stuck at once,
// so the worker registers the source it will charge; one that moves is counted.
TEST(OpenPowerSourcesTest, ACounterStillAtStartIsStuckBeforeAnyJob) {
  FakeClock clock;
  FakeCpuTimes cpu;
  PhaseClock phases(&clock);
  FakePowercap pc("probe");
  pc.AddZone("intel-rapl:0", "package-0", 1'000'000, 262143328850);
  EnergyOptions options;
  options.powercap_root = pc.root();
  options.stuck_probe = std::chrono::milliseconds(20);
  options.perf_power_pmu = "";
  EnergyMeter still(OpenPowerSources(options, &cpu, &clock), &phases, &cpu, &clock);
  EXPECT_EQ(still.source_names(), (std::vector<std::string>{"estimated"}));
  std::vector<SourceState> states = still.source_states();
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states[0].state, "stuck");
  EXPECT_EQ(states[0].reason, "still_at_start");
  still.BeginJob("1", "0");
  bool said = false;
  for (const auto& w : still.EndJob().warnings) {
    said |= w.find("no counter advanced in 20 ms at start") != std::string::npos;
  }
  EXPECT_TRUE(said);

  // A counter that moves during the probe (a thread advancing it, as the kernel would).
  std::atomic<bool> done{false};
  std::thread ticker([&] {
    for (uint64_t uj = 2'000'000; !done; uj += 1000) {
      pc.SetEnergy("intel-rapl:0", uj);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  EnergyMeter moving(OpenPowerSources(options, &cpu, &clock), &phases, &cpu, &clock);
  done = true;
  ticker.join();
  EXPECT_EQ(moving.source_names(), (std::vector<std::string>{"rapl"}));
}

}  // namespace
}  // namespace joule::worker
