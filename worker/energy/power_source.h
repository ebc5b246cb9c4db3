#ifndef JOULE_WORKER_ENERGY_POWER_SOURCE_H_
#define JOULE_WORKER_ENERGY_POWER_SOURCE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/energy/clock.h"

namespace joule::worker {

// One energy counter a source reads.
struct EnergyChannel {
  std::string device;  // "cpu-package-0", "dram-0", "psys", "gpu-0", "cpu"
  std::string source;  // "rapl", "nvml", "nvml_power", "estimated"
  // True for a device shared with other processes (a CPU package or its DRAM): the meter
  // charges this worker its share of CPU time. False for a device the worker owns (its
  // GPU) or a reading that is already per-process (estimated).
  bool shared = false;
  std::string uuid;  // where the device has one (GPUs)
  std::string name;  // model name where known
};

// What a device says of itself besides energy (GPUs through NVML).
struct DeviceStatus {
  std::string device;
  double power_limit_watts = 0;
  double utilization = 0;  // 0..1
};

// How a source stands (joule_energy_source_info, the job report's warnings).
struct SourceState {
  std::string source;  // "rapl", "perf_rapl", "nvml", "estimated", ...
  // "counting"; "stuck" (a counter that stopped: another source stands in);
  // "standing_in" (charged for a stuck one); "standby" (read, charged nothing).
  std::string state = "counting";
  // A fixed code where the state is not "counting" (a label: no figures in it), e.g.
  // "no_advance", "unreadable", "still_at_start", "fallback", "rapl_stuck".
  std::string reason;
};

// A reader of energy counters (RAPL, NVML, an estimate). Owned by the EnergyMeter, which
// calls it from its sampling thread only: implementations need not be thread-safe.
class PowerSource {
 public:
  virtual ~PowerSource() = default;
  virtual const std::vector<EnergyChannel>& channels() const = 0;
  // Fills `joules[i]` with the energy channel i used since the previous Read, in joules
  // (the first Read reports what passed since Open). A non-OK status with filled `joules`
  // means the figures are a lower bound (e.g. a counter may have wrapped more than once,
  // or an impossible interval was dropped) and the message is a warning for the job's
  // report; with `joules` left empty the read failed, and a counter-based source carries
  // the interval's energy into its next successful Read.
  virtual absl::Status Read(Clock::TimePoint now, std::vector<double>* joules) = 0;
  // Appends standing notes on how the source counts, which every job's report carries
  // (e.g. a zone counted once because it mirrors another). Called after Read.
  virtual void AppendNotes(std::vector<std::string>* out) const {}
  // Appends power limits and utilisation where the source knows them (best effort).
  virtual void AppendStatus(std::vector<DeviceStatus>* out) {}
  // For the last Read, every channel's joules, those read but not charged too (a
  // StuckCounterGuard's standby, read beside its counter): the meter compares the two
  // sources as a cross-check. False (the default) when there is no such pair.
  virtual bool LastReadAll(std::vector<double>* joules) const { return false; }
  // Appends the state of each source this one reads; by default its channels' sources,
  // counting.
  virtual void AppendSourceStates(std::vector<SourceState>* out) const {
    for (const EnergyChannel& ch : channels()) {
      bool seen = false;
      for (const SourceState& s : *out) seen |= s.source == ch.source;
      if (!seen) out->push_back({ch.source, "counting", ""});
    }
  }
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_POWER_SOURCE_H_
