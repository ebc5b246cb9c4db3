#include "worker/energy/estimated_source.h"

namespace joule::worker {

EstimatedSource::EstimatedSource(CpuTimes* cpu, EstimateOptions options, Clock::TimePoint now)
    : cpu_(cpu), options_(options), last_read_(now) {
  EnergyChannel ch;
  ch.device = "cpu";
  ch.source = "estimated";
  ch.shared = false;
  ch.name = "cpu time x watts per busy core";
  channels_.push_back(ch);
  absl::StatusOr<double> s = cpu_->ProcessSeconds();
  last_cpu_seconds_ = s.ok() ? *s : 0;
}

absl::Status EstimatedSource::Read(Clock::TimePoint now, std::vector<double>* joules) {
  joules->clear();
  absl::StatusOr<double> cpu = cpu_->ProcessSeconds();
  if (!cpu.ok()) return cpu.status();
  const double busy = std::max(0.0, *cpu - last_cpu_seconds_);
  const double wall = std::max(0.0, Seconds(now - last_read_));
  joules->push_back(busy * options_.watts_per_busy_core + wall * options_.idle_watts);
  last_cpu_seconds_ = *cpu;
  last_read_ = now;
  return absl::OkStatus();
}

}  // namespace joule::worker
