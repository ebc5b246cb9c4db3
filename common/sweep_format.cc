#include "common/sweep_format.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/text.h"
#include "nlohmann/json.hpp"

namespace joule {

std::string SweepTable(const std::vector<SweepRow>& rows) {
  std::ostringstream out;
  out << absl::StrFormat("%-40s %4s %7s %9s %8s %7s %6s %10s %10s %7s %12s %9s %s\n", "cell",
                         "runs", "ok", "wall s", "+-", "speedup", "eff", "accuracy", "energy J",
                         "avg W", "J/device-h", "samples/J", "source");
  for (const SweepRow& r : rows) {
    if (r.succeeded == 0) {
      // Nothing measured: no figure is a zero (issue 23 showed "accuracy 0.0000, measured").
      out << absl::StrFormat("%-40s %4d %7d %9s %8s %7s %6s %10s %10s %7s %12s %9s %s\n", r.key,
                             r.jobs, 0, "-", "-", "-", "-", "-", "-", "-", "-", "-",
                             "none succeeded");
      continue;
    }
    out << absl::StrFormat(
        "%-40s %4d %7d %9.2f %8.2f %7.2f %6.2f %10.4f %10.1f %7.2f %12.1f %9.1f %s\n", r.key,
        r.jobs, r.succeeded, r.wall_mean, r.wall_sd, r.speedup, r.efficiency, r.accuracy_mean,
        r.energy_mean, r.average_watts, r.joules_per_device_hour, r.samples_per_joule,
        r.estimated ? "estimated" : "measured");
  }
  bool targets = false;
  for (const SweepRow& r : rows) targets = targets || r.target() > 0;
  if (targets) {
    out << absl::StrFormat("\n%-40s %-28s %8s %10s %12s\n", "to target (Zeus TTA/ETA)", "target",
                           "reached", "time s", "energy J");
    for (const SweepRow& r : rows) {
      if (r.target() <= 0) continue;
      const std::string target =
          absl::StrCat(r.target_metric, r.target_accuracy > 0 ? " >= " : " <= ", r.target());
      out << absl::StrFormat("%-40s %-28s %5d/%-2d %10s %12s\n", r.key, target, r.reached_target,
                             r.succeeded,
                             r.reached_target ? absl::StrFormat("%.2f", r.tta_mean) : "-",
                             r.reached_target ? absl::StrFormat("%.1f", r.eta_mean) : "-");
    }
  }
  return out.str();
}

std::vector<std::pair<std::string, std::string>> GridAxes(const std::string& key) {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view part : absl::StrSplit(key, ',')) {
    const size_t eq = part.find('=');
    // A part without "=" is the rest of a value that holds a comma ("hidden=[512, 256]").
    if ((eq == absl::string_view::npos ||
         part.substr(0, eq).find_first_of("[{ ") != absl::string_view::npos) &&
        !out.empty()) {
      absl::StrAppend(&out.back().second, ",", part);
      continue;
    }
    if (eq == absl::string_view::npos) continue;
    out.emplace_back(std::string(part.substr(0, eq)), std::string(part.substr(eq + 1)));
  }
  return out;
}

std::string SweepCsv(const std::vector<SweepRow>& rows) {
  // A column per grid axis ("grid.FIELD"), in the order the cells name them.
  std::vector<std::string> axes;
  for (const SweepRow& r : rows) {
    for (const auto& [field, value] : GridAxes(r.key)) {
      if (std::find(axes.begin(), axes.end(), field) == axes.end()) axes.push_back(field);
    }
  }
  std::ostringstream out;
  out << "cell,workers,jobs,succeeded,wall_seconds_mean,wall_seconds_sd,speedup,efficiency,"
         "test_accuracy_mean,energy_joules_mean,energy_joules_sd,device_hours_mean,"
         "joules_per_device_hour,samples_per_device_hour,updates_per_device_hour,"
         "samples_per_joule,energy_source,global_batch_size,local_batch_size,"
         "target_accuracy,reached_target,time_to_target_seconds_mean,"
         "energy_to_target_joules_mean,intra_op_threads,average_watts,target_metric,"
         "target_loss";
  for (const std::string& axis : axes) out << "," << CsvField("grid." + axis);
  out << "\n";
  for (const SweepRow& r : rows) {
    out << "\"" << absl::StrReplaceAll(r.key, {{"\"", "\"\""}}) << "\","
        << absl::StrJoin(
               std::vector<std::string>{
                   absl::StrCat(r.workers), absl::StrCat(r.jobs), absl::StrCat(r.succeeded),
                   absl::StrCat(r.wall_mean), absl::StrCat(r.wall_sd), absl::StrCat(r.speedup),
                   absl::StrCat(r.efficiency), absl::StrCat(r.accuracy_mean),
                   absl::StrCat(r.energy_mean), absl::StrCat(r.energy_sd),
                   absl::StrCat(r.device_hours_mean), absl::StrCat(r.joules_per_device_hour),
                   absl::StrCat(r.samples_per_device_hour), absl::StrCat(r.updates_per_device_hour),
                   absl::StrCat(r.samples_per_joule)},
               ",")
        << "," << (r.estimated ? "estimated" : "measured") << ","
        << absl::StrJoin(
               std::vector<std::string>{
                   absl::StrCat(r.global_batch), absl::StrCat(r.local_batch),
                   absl::StrCat(r.target_accuracy), absl::StrCat(r.reached_target),
                   absl::StrCat(r.tta_mean), absl::StrCat(r.eta_mean), absl::StrCat(r.threads),
                   absl::StrCat(r.average_watts), r.target_metric, absl::StrCat(r.target_loss)},
               ",");
    const auto cell = GridAxes(r.key);
    for (const std::string& axis : axes) {
      auto it =
          std::find_if(cell.begin(), cell.end(), [&](const auto& kv) { return kv.first == axis; });
      out << "," << (it == cell.end() ? std::string() : CsvField(it->second));
    }
    out << "\n";
  }
  return out.str();
}

std::string SweepJson(const std::vector<SweepRow>& rows, const LineFit* fit,
                      const LinearFit* slope_model) {
  nlohmann::json cells = nlohmann::json::array();
  for (const SweepRow& r : rows) {
    cells.push_back({{"cell", r.key},
                     {"workers", r.workers},
                     {"jobs", r.jobs},
                     {"succeeded", r.succeeded},
                     {"wall_seconds_mean", r.wall_mean},
                     {"wall_seconds_sd", r.wall_sd},
                     {"speedup", r.speedup},
                     {"efficiency", r.efficiency},
                     {"test_accuracy_mean", r.accuracy_mean},
                     {"energy_joules_mean", r.energy_mean},
                     {"energy_joules_sd", r.energy_sd},
                     {"device_hours_mean", r.device_hours_mean},
                     {"joules_per_device_hour", r.joules_per_device_hour},
                     {"samples_per_device_hour", r.samples_per_device_hour},
                     {"updates_per_device_hour", r.updates_per_device_hour},
                     {"samples_per_joule", r.samples_per_joule},
                     {"energy_source", r.estimated ? "estimated" : "measured"},
                     {"global_batch_size", r.global_batch},
                     {"local_batch_size", r.local_batch},
                     {"target_accuracy", r.target_accuracy},
                     {"reached_target", r.reached_target},
                     {"time_to_target_seconds_mean", r.tta_mean},
                     {"energy_to_target_joules_mean", r.eta_mean},
                     {"intra_op_threads", r.threads},
                     {"average_watts", r.average_watts},
                     {"target_metric", r.target_metric},
                     {"target_loss", r.target_loss}});
  }
  nlohmann::json out = {{"cells", cells}};
  if (fit) {
    out["energy_vs_device_hours"] = {{"n", fit->n},
                                     {"slope_joules_per_device_hour", fit->slope},
                                     {"slope_ci95", fit->slope_ci95},
                                     {"intercept_joules", fit->intercept},
                                     {"intercept_ci95", fit->intercept_ci95},
                                     {"r2", fit->r2}};
  }
  if (slope_model) {
    const auto& b = slope_model->coefficients;
    const auto& ci = slope_model->ci95;
    out["joules_per_device_hour_model"] = {{"n", slope_model->n},
                                           {"intercept", b[0]},
                                           {"intercept_ci95", ci[0]},
                                           {"per_sample_per_device_hour", b[1]},
                                           {"per_sample_per_device_hour_ci95", ci[1]},
                                           {"per_update_per_device_hour", b[2]},
                                           {"per_update_per_device_hour_ci95", ci[2]},
                                           {"r2", slope_model->r2}};
  }
  return out.dump(2) + "\n";
}

}  // namespace joule
