#include "common/sweep_summary.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/names.h"

namespace joule {

namespace {

struct Stats {
  double mean = 0, sd = 0;
};
Stats MeanSd(const std::vector<double>& v) {
  Stats s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / (v.size() - 1));
  }
  return s;
}

// The cell's values other than workers and threads: cells that share it form one scaling
// series. (Keys are "field=value" joined by ','; a list value's own commas stay inside
// its brackets, which split apart and join back alike.)
std::string SeriesKey(const std::string& cell_key) {
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(cell_key, ',')) {
    if (!absl::StartsWith(p, "workers=") && !absl::StartsWith(p, "intra_op_threads=") &&
        !absl::StartsWith(p, "intraOpThreads=")) {
      parts.emplace_back(p);
    }
  }
  return absl::StrJoin(parts, ",");
}

int Parallelism(const SweepRow& r) { return std::max(1, r.workers) * std::max(1, r.threads); }

}  // namespace

std::vector<SweepRow> SummariseSweep(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const v1::Job*>> by_cell;
  std::map<std::string, std::string> series_of;  // cell -> its scaling series
  for (const v1::Job& j : jobs) {
    auto it = j.spec().labels().find("cell");
    if (it == j.spec().labels().end()) continue;
    if (!by_cell.count(it->second)) order.push_back(it->second);
    by_cell[it->second].push_back(&j);
    // The sweep's own series label where it set one (zipped axes), else from the key.
    auto series = j.spec().labels().find("series");
    series_of[it->second] =
        series != j.spec().labels().end() ? series->second : SeriesKey(it->second);
  }
  std::vector<SweepRow> rows;
  std::set<std::string> weak;  // cells of weak-scaling sweeps
  for (const v1::Job& j : jobs) {
    auto p = j.spec().labels().find("sweep_preset");
    auto c = j.spec().labels().find("cell");
    if (p != j.spec().labels().end() && p->second == "weak" && c != j.spec().labels().end()) {
      weak.insert(c->second);
    }
  }
  for (const std::string& key : order) {
    SweepRow r;
    r.key = key;
    r.series = series_of[key];
    std::vector<double> wall, acc, energy, dh, spdh, updh, spj, tta, eta, watts;
    for (const v1::Job* j : by_cell[key]) {
      ++r.jobs;
      r.workers = j->spec().workers();
      r.threads = j->spec().intra_op_threads();
      r.global_batch = j->spec().global_batch_size();
      r.local_batch = j->spec().local_batch_size();
      r.target_metric =
          j->spec().target_metric().empty() ? "test_accuracy" : j->spec().target_metric();
      r.target_accuracy = j->spec().target_accuracy();
      r.target_loss = j->spec().target_loss();
      if (j->state() != v1::JOB_STATE_SUCCEEDED) continue;
      ++r.succeeded;
      for (const v1::AccuracyTarget& t : j->result().to_accuracy()) {
        const std::string metric = t.metric().empty() ? "test_accuracy" : t.metric();
        if (r.target() > 0 && t.target() == r.target() && metric == r.target_metric &&
            t.reached()) {
          tta.push_back(t.seconds());
          eta.push_back(t.joules());
        }
      }
      const v1::EnergyReport& e = j->result().energy();
      wall.push_back(j->result().wall_seconds());
      acc.push_back(j->result().test_accuracy());
      energy.push_back(e.total_joules());
      dh.push_back(e.device_hours());
      spdh.push_back(e.device_hours() > 0 ? j->result().samples() / e.device_hours() : 0);
      updh.push_back(e.updates_per_device_hour());
      spj.push_back(e.samples_per_joule());
      if (j->result().wall_seconds() > 0) {
        watts.push_back(e.total_joules() / j->result().wall_seconds());
      }
      r.estimated = r.estimated || e.estimated();
    }
    const Stats w = MeanSd(wall), en = MeanSd(energy);
    r.wall_mean = w.mean;
    r.wall_sd = w.sd;
    r.accuracy_mean = MeanSd(acc).mean;
    r.energy_mean = en.mean;
    r.energy_sd = en.sd;
    r.device_hours_mean = MeanSd(dh).mean;
    r.joules_per_device_hour = r.device_hours_mean > 0 ? r.energy_mean / r.device_hours_mean : 0;
    r.samples_per_device_hour = MeanSd(spdh).mean;
    r.updates_per_device_hour = MeanSd(updh).mean;
    r.samples_per_joule = MeanSd(spj).mean;
    r.average_watts = MeanSd(watts).mean;
    r.reached_target = static_cast<int>(tta.size());
    r.tta_mean = MeanSd(tta).mean;
    r.eta_mean = MeanSd(eta).mean;
    rows.push_back(r);
  }
  // Speedup and parallel efficiency against the least parallel cell of the same series.
  for (SweepRow& r : rows) {
    const SweepRow* ref = nullptr;
    for (const SweepRow& o : rows) {
      if (series_of[o.key] != series_of[r.key] || o.succeeded == 0) continue;
      if (!ref || Parallelism(o) < Parallelism(*ref)) ref = &o;
    }
    if (ref && r.succeeded > 0 && r.wall_mean > 0) {
      r.speedup = ref->wall_mean / r.wall_mean;
      // Weak scaling: N workers do N times the work, so ideal is T = T0.
      r.weak = weak.count(r.key) > 0;
      r.efficiency = weak.count(r.key)
                         ? r.speedup
                         : r.speedup * Parallelism(*ref) / static_cast<double>(Parallelism(r));
    }
  }
  return rows;
}

SweepAnalysis AnalyseSweep(const std::vector<v1::Job>& jobs) {
  SweepAnalysis a;
  a.rows = SummariseSweep(jobs);
  // Per succeeded job: energy against device-hours, and (the slope's model) energy per
  // device-hour against samples and updates per device-hour.
  std::vector<double> x, y, samples_dh, updates_dh, joules_dh;
  for (const v1::Job& j : jobs) {
    if (j.state() != v1::JOB_STATE_SUCCEEDED) continue;
    const v1::EnergyReport& e = j.result().energy();
    x.push_back(e.device_hours());
    y.push_back(e.total_joules());
    if (e.device_hours() > 0) {
      samples_dh.push_back(j.result().samples() / e.device_hours());
      updates_dh.push_back(e.updates_per_device_hour());
      joules_dh.push_back(e.joules_per_device_hour());
    }
    a.estimated = a.estimated || e.estimated();
  }
  a.fit = FitLine(x, y);
  a.slope_model = FitLinear({samples_dh, updates_dh}, joules_dh);
  return a;
}

}  // namespace joule
