#ifndef JOULE_WORKER_ENERGY_ESTIMATED_SOURCE_H_
#define JOULE_WORKER_ENERGY_ESTIMATED_SOURCE_H_

#include <memory>

#include "worker/energy/cpu_times.h"
#include "worker/energy/power_source.h"

namespace joule::worker {

struct EstimateOptions {
  // Watts one fully busy core draws. Default 6 W: a server CPU's TDP over its cores,
  // e.g. AMD EPYC 7763 280 W / 64 = 4.4 W, Intel Xeon Platinum 8380 270 W / 40 = 6.75 W,
  // Intel Xeon Gold 6148 150 W / 20 = 7.5 W (vendor datasheets); round, and a middle value.
  double watts_per_busy_core = 6.0;
  // Watts charged for every second whether busy or not (the worker's share of idle
  // power). Default 0: only the work is charged.
  double idle_watts = 0.0;
};

// The `estimated` source, for machines where no counter can be read (VMs, containers, no
// permission): energy = (this process's CPU seconds) x watts_per_busy_core
// + (wall seconds) x idle_watts. Per-process already, so not shared. Everything that
// shows its numbers labels them `estimated`.
class EstimatedSource final : public PowerSource {
 public:
  // `cpu` must outlive the source.
  EstimatedSource(CpuTimes* cpu, EstimateOptions options, Clock::TimePoint now);
  const std::vector<EnergyChannel>& channels() const override { return channels_; }
  absl::Status Read(Clock::TimePoint now, std::vector<double>* joules) override;

 private:
  CpuTimes* cpu_;
  EstimateOptions options_;
  std::vector<EnergyChannel> channels_;
  double last_cpu_seconds_ = 0;
  Clock::TimePoint last_read_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_ESTIMATED_SOURCE_H_
