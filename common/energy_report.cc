#include "common/energy_report.h"

#include "absl/strings/str_cat.h"

namespace joule {

v1::EnergyReport BuildEnergyReport(const v1::JobResult& result, double grid_gco2_per_kwh,
                                   int ranks_expected) {
  v1::EnergyReport r;
  r.set_ranks_reported(result.ranks_size());
  r.set_ranks_expected(ranks_expected);
  int devices = 0;
  for (const v1::RankResult& rank : result.ranks()) {
    devices += std::max(1, rank.devices());
    for (const v1::EnergyRecord& e : rank.energy()) {
      v1::EnergyRecord* rec = r.add_records();
      *rec = e;
      rec->set_rank(rank.rank());
      r.set_total_joules(r.total_joules() + e.joules());
      if (e.source() == "estimated") r.set_estimated(true);
    }
    for (const std::string& w : rank.energy_warnings()) {
      r.add_warnings(absl::StrCat("rank ", rank.rank(), ": ", w));
    }
  }
  const double wall = result.wall_seconds();
  const double joules = r.total_joules();
  r.set_devices(devices);
  r.set_kwh(joules / 3.6e6);
  r.set_device_hours(wall * devices / 3600.0);
  r.set_average_watts(wall > 0 ? joules / wall : 0);
  r.set_joules_per_device_hour(r.device_hours() > 0 ? joules / r.device_hours() : 0);
  r.set_samples_per_joule(joules > 0 ? result.samples() / joules : 0);
  r.set_updates_per_device_hour(r.device_hours() > 0 ? result.steps() / r.device_hours() : 0);
  r.set_grid_gco2_per_kwh(grid_gco2_per_kwh);
  r.set_co2_grams(r.kwh() * grid_gco2_per_kwh);
  return r;
}

std::map<std::string, double> EnergyBy(const v1::EnergyReport& report, const std::string& key) {
  std::map<std::string, double> out;
  for (const v1::EnergyRecord& e : report.records()) {
    std::string k = key == "rank"     ? absl::StrCat(e.rank())
                    : key == "device" ? absl::StrCat(e.rank(), "/", e.device())
                    : key == "source" ? e.source()
                                      : e.phase();
    out[k] += e.joules();
  }
  return out;
}

}  // namespace joule
