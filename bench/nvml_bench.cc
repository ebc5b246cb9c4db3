// joule-bench-nvml: what Joule's energy meter charges for the GPUs over one window, read the
// way a GPU worker reads them, for comparison with another reader of the same counter
// (pynvml, nvidia-smi) over the same window (scripts/gpu-check.sh, step `energy`).
//
//   joule-bench-nvml [--seconds S] [--period-ms P] [--library libnvidia-ml.so.1]
//
// Two NVML sources in one EnergyMeter (worker/energy), sampled every P ms on the meter's
// thread as a worker's are: "nvml" (the total-energy counter) and "nvml_power" (the power
// reading integrated with the trapezoid rule, the fallback for GPUs without a counter),
// both over every GPU CUDA_VISIBLE_DEVICES leaves visible. The window opens with
// EnergyMeter::BeginJob and closes with EndJob, as an attempt's does.
//
// Prints one JSON object on stdout: start_unix and end_unix (seconds since the epoch,
// CLOCK_REALTIME, the midpoints of the calls that open and close the window, so another
// reader can interpolate its own samples there), and joules per source and device.
// Exit 1 with a one-line error when NVML cannot be loaded or no GPU can be read.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "worker/energy/cpu_times.h"
#include "worker/energy/energy_meter.h"
#include "worker/energy/nvml_source.h"
#include "worker/energy/phase_clock.h"

namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  using joule::worker::NvmlReading;
  using joule::worker::NvmlSource;
  double seconds = 10;
  int period_ms = 100;  // the worker's default --energy-period-ms
  std::string library = "libnvidia-ml.so.1";
  CLI::App app{"Joule's NVML energy over one window (counter and power integration)"};
  app.add_option("--seconds", seconds, "length of the window")->check(CLI::Range(0.1, 3600.0));
  app.add_option("--period-ms", period_ms, "the meter's sampling period")
      ->check(CLI::Range(1, 60000));
  app.add_option("--library", library, "NVML library name or path");
  CLI11_PARSE(app, argc, argv);

  joule::worker::SteadyClock clock;
  joule::worker::PhaseClock phases(&clock);
  joule::worker::ProcCpuTimes cpu;
  std::vector<std::unique_ptr<joule::worker::PowerSource>> sources;
  for (NvmlReading reading : {NvmlReading::kCounterWherePossible, NvmlReading::kPowerOnly}) {
    auto nvml =
        NvmlSource::Open(library, std::getenv("CUDA_VISIBLE_DEVICES"), clock.Now(), reading);
    if (!nvml.ok()) {
      std::cerr << "joule-bench-nvml: " << nvml.status().message() << "\n";
      return 1;
    }
    sources.push_back(*std::move(nvml));
  }
  joule::worker::EnergyMeter meter(std::move(sources), &phases, &cpu, &clock);
  meter.Start(std::chrono::milliseconds(period_ms));
  double t = UnixNow();
  meter.BeginJob("bench", "0");
  const double start_unix = 0.5 * (t + UnixNow());
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  t = UnixNow();
  joule::worker::JobEnergy totals = meter.EndJob();
  const double end_unix = 0.5 * (t + UnixNow());
  meter.Stop();

  nlohmann::json out;
  out["start_unix"] = start_unix;
  out["end_unix"] = end_unix;
  out["period_ms"] = period_ms;
  std::map<std::string, std::map<std::string, double>> joules;  // source -> device -> J
  for (const joule::worker::EnergyEntry& e : totals.entries) {
    joules[e.source][e.device] += e.joules;
  }
  out["joules"] = joules;
  out["warnings"] = totals.warnings;
  std::cout << out.dump() << "\n";
  return 0;
}
