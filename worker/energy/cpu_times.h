#ifndef JOULE_WORKER_ENERGY_CPU_TIMES_H_
#define JOULE_WORKER_ENERGY_CPU_TIMES_H_

#include <string>

#include "absl/status/statusor.h"

namespace joule::worker {

// CPU-time counters, the OS seam of CPU energy attribution. Thread-safe.
class CpuTimes {
 public:
  virtual ~CpuTimes() = default;
  // User + system CPU seconds this process has used since it started.
  virtual absl::StatusOr<double> ProcessSeconds() = 0;
  // CPU seconds every core of the machine has spent busy (not idle or iowait) since boot.
  virtual absl::StatusOr<double> SystemBusySeconds() = 0;
};

// getrusage(RUSAGE_SELF) and /proc/stat (its first "cpu" line, in USER_HZ ticks).
class ProcCpuTimes final : public CpuTimes {
 public:
  explicit ProcCpuTimes(std::string proc_stat = "/proc/stat") : proc_stat_(std::move(proc_stat)) {}
  absl::StatusOr<double> ProcessSeconds() override;
  absl::StatusOr<double> SystemBusySeconds() override;

 private:
  std::string proc_stat_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_CPU_TIMES_H_
