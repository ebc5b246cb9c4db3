#ifndef JOULE_WORKER_ENERGY_STUCK_COUNTER_GUARD_H_
#define JOULE_WORKER_ENERGY_STUCK_COUNTER_GUARD_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "worker/energy/cpu_times.h"
#include "worker/energy/power_source.h"

namespace joule::worker {

// A counter source (sysfs RAPL, perf_rapl, NVML's energy counter) watched for counters
// that exist and never move, or stop: a VM's perf power PMU reads 0 J for ever, and a
// driver or firmware fault can freeze one mid-run. Zero energy from a counter while this
// process works is a metering failure, not a host that draws nothing.
//
// Rules (intervals are the meter's sampling intervals):
//  - The counter source is stuck when none of its channels advanced over kStuckIntervals
//    consecutive intervals in which this process used CPU time, kMinCpuSeconds of it in
//    all, or over kStuckSeconds of wall time (a powered host's RAPL counters advance every
//    millisecond, its GPUs draw tens of watts idle: a counter still for seconds is not
//    metering). Shorter idle intervals neither prove nor disprove: they extend the run;
//    ProbeAtStart may prove it at once. From the
//    first of those intervals on, the energy is the fallback's (the next source in the
//    order: `estimated` after RAPL, `nvml_power` after NVML's counter), so no interval is
//    charged to nobody; the report's warnings and the source states say so, with the
//    reason.
//  - A stuck counter that advances is taken back after kConfirmIntervals consecutive
//    advancing intervals; until then the fallback is still charged and the counter's
//    deltas are dropped (the first one after a freeze may hold the frozen time's energy,
//    which the fallback already charged: never counted twice).
//  - While counting, the fallback is read every interval (so it is current when needed)
//    and charged nothing.
//  - A failed read of the counters is a still interval (their source carries its energy
//    into its next good read): reads that keep failing end stuck, not as energy lost.
// The counters are watched together: a source is stuck when none of its channels moves
// (one frozen GPU among several moving ones is not detected). Known limit: the fallback
// energy held over a still run that spans a job's end is charged, once the run proves
// stuck, to the job then current.
// Channels: the counter source's, then the fallback's. Not thread-safe (the meter's
// sampling thread calls it).
class StuckCounterGuard final : public PowerSource {
 public:
  static constexpr int kStuckIntervals = 5;
  static constexpr double kMinCpuSeconds = 0.05;
  static constexpr int kConfirmIntervals = 2;
  static constexpr double kStuckSeconds = 5.0;

  // `cpu` must outlive the guard.
  StuckCounterGuard(std::unique_ptr<PowerSource> counters, std::unique_ptr<PowerSource> fallback,
                    CpuTimes* cpu);

  const std::vector<EnergyChannel>& channels() const override { return channels_; }
  absl::Status Read(Clock::TimePoint now, std::vector<double>* joules) override;
  void AppendNotes(std::vector<std::string>* out) const override;
  void AppendStatus(std::vector<DeviceStatus>* out) override;
  void AppendSourceStates(std::vector<SourceState>* out) const override;
  // While counting, with both sources read: the counter's joules, then the fallback's.
  bool LastReadAll(std::vector<double>* joules) const override;

  bool stuck() const { return state_ != State::kCounting; }

  // Reads the counters now and again after `wait` (sleeping: a worker's start); stuck
  // from now on when none advanced (RAPL's zones advance every ms on a powered host; not
  // for counters that update more slowly, e.g. NVML's). What the counters count until
  // the second read is charged to nobody (a worker's start, before any job).
  void ProbeAtStart(std::chrono::milliseconds wait, const Clock& clock);

 private:
  enum class State { kCounting, kStuck, kConfirming };
  std::unique_ptr<PowerSource> counters_, fallback_;
  CpuTimes* cpu_;
  std::vector<EnergyChannel> channels_;
  std::string counter_name_, fallback_name_;  // their channels' source
  State state_ = State::kCounting;
  double last_cpu_ = -1;
  int still_intervals_ = 0;       // consecutive intervals without an advance
  Clock::TimePoint still_since_;  // the start of the first of them
  int busy_still_intervals_ = 0;  // of them, with CPU time used
  double still_cpu_ = 0;          // CPU seconds over them
  std::vector<double> pending_;   // the fallback's joules over them
  int advancing_ = 0;             // consecutive advancing intervals while stuck
  std::string reason_;            // why it is stuck, while it is
  std::vector<double> last_all_;  // LastReadAll's; empty when there is no pair
  std::string reason_code_;       // the same as a label: no_advance, unreadable, still_at_start
  int failed_reads_ = 0;          // of the still intervals, those whose read failed
  Clock::TimePoint last_read_;    // of the counters
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_STUCK_COUNTER_GUARD_H_
