#ifndef JOULE_WORKER_ENERGY_PERF_RAPL_SOURCE_H_
#define JOULE_WORKER_ENERGY_PERF_RAPL_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/energy/rapl_source.h"

namespace joule::worker {

// RAPL through the perf `power` PMU (`perf_rapl`): the same hardware counters as the
// powercap files, readable where those are not (energy_uj is root-only since Linux 5.10,
// CVE-2020-8694; a perf counter needs perf_event_paranoid <= 0 or CAP_PERFMON, and
// CAP_SYS_ADMIN before 5.8). The kernel describes the PMU in sysfs
// (Documentation/ABI/testing/sysfs-bus-event_source-devices-events):
//   DIR/type                  the PMU's perf_event_attr.type
//   DIR/cpumask               one CPU per package ("0", "0,28", "0-1"): where to open
//   DIR/events/energy-X       "event=0xNN": perf_event_attr.config
//   DIR/events/energy-X.scale joules per count (2^-32 on Intel and AMD)
//   DIR/events/energy-X.unit  "Joules"
// The kernel keeps each event's count in 64 bits from the moment it was opened (it folds
// in the 32-bit MSR's wraps itself), so the count wraps at 2^64 counts: 4.3e9 J at a
// scale of 2^-32, 50 days at 1 kW. It is read as uJ = count x scale x 1e6 with that
// range, and counted by RaplSource's rules (wraps, resets, mirrors, psys never beside a
// package).

// One event of the PMU.
struct PerfPowerEvent {
  std::string name;  // "energy-pkg"
  uint64_t config = 0;
  double scale = 0;  // joules per count
};

// The PMU as sysfs describes it.
struct PerfPowerPmu {
  uint32_t type = 0;
  std::vector<int> cpus;               // the cpumask, ascending: package P opens on cpus[P]
  std::vector<PerfPowerEvent> events;  // by name
};

// Reads the PMU description under `dir` (normally /sys/bus/event_source/devices/power).
// Errors: NOT_FOUND (no such PMU: a kernel without it, a CPU without RAPL); DATA_LOSS
// naming the file for one that does not parse (an event that is not "event=0x..", a scale
// that is not a positive number, a unit other than Joules, an empty cpumask).
absl::StatusOr<PerfPowerPmu> ReadPerfPowerPmu(const std::string& dir);

// Opens and reads system-wide perf counters: the seam between the source and the
// kernel. Not thread-safe.
class PerfCounterReader {
 public:
  virtual ~PerfCounterReader() = default;
  // Opens counter (type, config) on `cpu` for every process; a handle >= 0. Errors:
  // PERMISSION_DENIED naming what to grant; UNAVAILABLE for anything else the kernel said.
  virtual absl::StatusOr<int> Open(uint32_t type, uint64_t config, int cpu) = 0;
  // The counter's count now (64 bits, counts since Open). Errors: UNAVAILABLE.
  virtual absl::StatusOr<uint64_t> Read(int handle) = 0;
};

// perf_event_open(2) and read(2); closes what it opened on destruction.
std::unique_ptr<PerfCounterReader> SystemPerfCounterReader();

// The `perf_rapl` source: energy-pkg (cpu-package-P) and energy-ram (dram-P) on each
// package's CPU, energy-psys (psys) once and only where there is no energy-pkg;
// energy-cores and energy-gpu are parts of the package and not added to it. Shared
// devices, as the sysfs source's. `reader` is kept by the source.
// Errors: ReadPerfPowerPmu's; NOT_FOUND when the PMU has no event counted here; Open's
// and the first read's, naming the event and CPU.
absl::StatusOr<std::unique_ptr<RaplSource>> OpenPerfRaplSource(
    const std::string& dir, std::shared_ptr<PerfCounterReader> reader, Clock::TimePoint now);

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_PERF_RAPL_SOURCE_H_
