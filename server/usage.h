#ifndef JOULE_SERVER_USAGE_H_
#define JOULE_SERVER_USAGE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/job_charts.h"
#include "joule/v1/job.pb.h"

namespace joule::server {

// Sums jobs into UsageRequest's groups (`joule usage`). A pure tally: the coordinator feeds
// it the jobs it reads, newest first. Not thread-safe.
//
// Per job: device-hours from the energy report (wall seconds x devices / 3600) once it has
// one, else the elapsed training time x workers (a job still running); joules are the
// what `joule list` gives (the report's total once ended, progress.job_energy_joules while
// running); by source from the report's records (a running job's energy is
// "unreported" until its ranks report); kWh = J / 3.6e6; CO2 = kWh x `gco2_per_kwh`
// (the coordinator's --grid-gco2-per-kwh), and beside it the jobs' CO2 at the grid's
// intensity over their runs where they have it (Job.carbon: co2_grid_grams).
class UsageTally {
 public:
  static constexpr size_t kMaxGroups = 10000;

  // INVALID_ARGUMENT for an unknown group_by, a period other than "", "day" or "week", a label key
  // that is empty or longer than 63 bytes, a state out of range, or until <= since (both set).
  static absl::Status Validate(const v1::UsageRequest& request);

  UsageTally(v1::UsageRequest request, double gco2_per_kwh);
  // Whether `job` falls in the request (its time window and states).
  bool Wants(const v1::Job& job) const;
  void Add(const v1::Job& job);
  v1::UsageResponse Finish();

  // The group key of `job` for `group_by` (Validate'd).
  static std::string KeyOf(const v1::Job& job, const std::string& group_by);

 private:
  v1::UsageRequest request_;
  double gco2_per_kwh_;
  std::map<std::string, v1::UsageGroup> groups_;
  v1::UsageGroup total_;
  // With request_.period: each group's (and, under "", the total's) figures by period.
  std::map<std::string, std::map<std::string, v1::UsageGroup>> periods_;
  size_t cells_ = 0;  // groups and periods held (at most kMaxGroups)
  int64_t scanned_ = 0;
  bool truncated_ = false;
};

// The web UI's usage charts (Vega-Lite, common/job_charts.h), those with data:
//   "energy-by-group": each group's energy, bars, largest first;
//   "energy-over-time": with UsageRequest.period, energy per period stacked by group (the
//     total's periods without group_by).
// Energy in J, kJ, MJ or kWh, whichever reads best for the total.
std::vector<Chart> UsageCharts(const v1::UsageResponse& usage, const std::string& group_by);

}  // namespace joule::server

#endif  // JOULE_SERVER_USAGE_H_
