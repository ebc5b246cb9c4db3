#ifndef JOULE_COMMON_ENERGY_REPORT_H_
#define JOULE_COMMON_ENERGY_REPORT_H_

#include <map>
#include <string>

#include "joule/v1/job.pb.h"

namespace joule {

// Grid carbon intensity assumed when none is configured, gCO2 per kWh: the world average
// of electricity generation in 2023 (IEA, "Electricity 2024", about 460 g/kWh).
inline constexpr double kDefaultGridGco2PerKwh = 460.0;

// Builds a job's energy account from its per-rank results (RankResult.energy,
// .devices, .energy_warnings) and totals (JobResult.samples, .steps, .wall_seconds):
//   total J = sum of all records;          kWh = J / 3.6e6
//   device-hours = wall s x devices / 3600 (devices: sum over ranks, at least 1 each;
//                  Huber et al., arXiv 2508.07706: GPU-hours = wall time x GPUs)
//   average W = J / wall s;                J per device-hour = J / device-hours
//   samples per J = samples / J;           updates per device-hour = steps / device-hours
//   CO2 g = kWh x grid intensity (gCO2/kWh)
// Quantities with a zero denominator are 0. `ranks_expected` is the world size: a report
// of a failed or cancelled attempt may cover fewer ranks (ranks_reported).
v1::EnergyReport BuildEnergyReport(const v1::JobResult& result, double grid_gco2_per_kwh,
                                   int ranks_expected);

// Sums of `report.records` by one key: "rank", "device", "source" or "phase"
// (ranks as decimal strings; devices as "rank/device").
std::map<std::string, double> EnergyBy(const v1::EnergyReport& report, const std::string& key);

}  // namespace joule

#endif  // JOULE_COMMON_ENERGY_REPORT_H_
