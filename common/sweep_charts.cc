#include "common/sweep_charts.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace joule {
namespace {

using nlohmann::json;

// A sweep cell's key ("a=1,b=[2, 3],c=4") without the fields named: a grouping id for the
// cells that differ only in those.
std::string AllBut(const std::string& key, std::initializer_list<absl::string_view> fields) {
  std::vector<std::string> kept;
  for (absl::string_view part : absl::StrSplit(key, ',')) {
    const absl::string_view field = part.substr(0, part.find('='));
    if (std::find(fields.begin(), fields.end(), field) == fields.end()) kept.emplace_back(part);
  }
  return absl::StrJoin(kept, ",");
}

// A cell's grid axes but `fields` (those a chart shows otherwise), for its legend; "-"
// when none is left.
std::string OtherAxes(const std::string& key, std::initializer_list<absl::string_view> fields) {
  std::string rest = AllBut(key, fields);
  return rest.empty() ? "-" : rest;
}

// The energy-against-device-hours plot of the sweep's succeeded jobs with the fitted line
// (nothing without any); sets *estimated when some of their energy is.
void AddEnergyFitPlot(const std::vector<v1::Job>& jobs, const LineFit* fit, bool* estimated,
                      std::vector<Chart>& plots) {
  json points = json::array();
  double max_dh = 0;
  for (const v1::Job& j : jobs) {
    if (j.state() != v1::JOB_STATE_SUCCEEDED) continue;
    const v1::EnergyReport& e = j.result().energy();
    *estimated = *estimated || e.estimated();
    auto cell = j.spec().labels().find("cell");
    points.push_back({{"series", "jobs"},
                      {"device_hours", e.device_hours()},
                      {"joules", e.total_joules()},
                      {"cell", cell == j.spec().labels().end() ? "" : cell->second}});
    max_dh = std::max(max_dh, e.device_hours());
  }
  const std::string est = *estimated ? " Energy is estimated: the fit tests the estimator." : "";
  if (points.empty()) return;
  json layers = json::array();
  json dots = {{"data", {{"values", points}}},
               {"mark", {{"type", "point"}, {"filled", true}, {"size", 60}}},
               {"encoding",
                {{"x", ChartAxis("device_hours", "quantitative", "device-hours")},
                 {"y", ChartAxis("joules", "quantitative", "energy (J)")},
                 {"color", ChartAxis("series", "nominal", "")},
                 {"tooltip", json::array({ChartAxis("cell", "nominal", "cell"),
                                          ChartAxis("joules", "quantitative", "J")})}}}};
  layers.push_back(dots);
  if (fit) {
    json line = json::array();
    for (double x : {0.0, max_dh}) {
      line.push_back({{"series", "least-squares fit"},
                      {"device_hours", x},
                      {"joules", fit->intercept + fit->slope * x}});
    }
    layers.push_back({{"data", {{"values", line}}},
                      {"mark", "line"},
                      {"encoding",
                       {{"x", ChartAxis("device_hours", "quantitative", "device-hours")},
                        {"y", ChartAxis("joules", "quantitative", "energy (J)")},
                        {"color", ChartAxis("series", "nominal", "")}}}});
  }
  json spec = ChartSpec(json::array());  // the layers hold the data
  spec.erase("data");
  spec["layer"] = layers;
  plots.push_back({"energy-vs-device-hours", "Energy against device-hours",
                   fit ? absl::StrCat("Each point a job; the line: ", LineFitText(*fit), ".", est)
                       : "Each point a job (too few for a fit)." + est,
                   spec});
}

// Speedup and efficiency (each its own chart, with ideal linear scaling drawn) and average
// power against workers x threads: a colour per scaling series, a shape and dash per mode:
// more threads in one worker, more workers of one thread (the serial cell starts each that
// its series has), or both.
void AddParallelismPlots(const std::vector<SweepRow>& rows, const std::string& est,
                         std::vector<Chart>& plots) {
  json speedup = json::array(), efficiency = json::array(), power = json::array();
  std::set<std::string> series_with_threads, series_with_processes;
  std::map<std::string, int> base;  // each series' least parallelism
  std::set<std::pair<std::string, int>> parallelisms;
  std::set<std::string> weak_series;  // weak scaling: ideal speedup 1 (T0 / T at P x work)
  for (const SweepRow& r : rows) {
    if (r.succeeded == 0) continue;
    if (r.workers <= 1 && r.threads > 1) series_with_threads.insert(r.series);
    if (r.workers > 1 && r.threads <= 1) series_with_processes.insert(r.series);
    const int p = std::max(1, r.workers) * std::max(1, r.threads);
    auto [it, first] = base.emplace(r.series, p);
    if (!first) it->second = std::min(it->second, p);
    parallelisms.insert({r.series, p});
    if (r.weak) weak_series.insert(r.series);
  }
  for (const SweepRow& r : rows) {
    if (r.succeeded == 0) continue;
    const int workers = std::max(1, r.workers), threads = std::max(1, r.threads);
    std::vector<std::string> modes;
    if (workers == 1 && threads == 1) {
      if (series_with_threads.count(r.series)) modes.push_back("threads");
      if (series_with_processes.count(r.series) || modes.empty()) modes.push_back("processes");
    } else if (workers == 1) {
      modes.push_back("threads");
    } else if (threads == 1) {
      modes.push_back("processes");
    } else {
      modes.push_back("workers x threads");
    }
    const std::string series = r.series.empty() ? "all cells" : r.series;
    for (const std::string& mode : modes) {
      const json point = {
          {"parallelism", workers * threads}, {"series", series}, {"mode", mode}, {"cell", r.key}};
      json s = point, e = point;
      s["value"] = r.speedup;
      e["value"] = r.efficiency;
      if (r.speedup > 0) speedup.push_back(s);  // the log axis has no 0
      efficiency.push_back(e);
      if (r.average_watts > 0) {
        json w = point;
        w["watts"] = r.average_watts;
        power.push_back(w);
      }
    }
  }
  // Ideal linear scaling from each series' least parallel cell: speedup P / P0, efficiency 1.
  // A line of its own per series (their P0 differ); weak scaling's ideal speedup is 1.
  for (const auto& [series, p] : parallelisms) {
    const std::string name = series.empty() ? "all cells" : series;
    const std::string ideal_name =
        base.size() == 1 ? std::string("ideal (linear)") : "ideal: " + name;
    const double ideal = weak_series.count(series) ? 1.0 : static_cast<double>(p) / base[series];
    speedup.push_back({{"parallelism", p},
                       {"series", ideal_name},
                       {"mode", "ideal"},
                       {"cell", name},
                       {"value", ideal}});
    efficiency.push_back({{"parallelism", p},
                          {"series", ideal_name},
                          {"mode", "ideal"},
                          {"cell", name},
                          {"value", 1.0}});
  }
  const auto chart = [](json data, const char* y_title, bool log_y) {
    json spec = ChartSpec(std::move(data));
    spec["mark"] = {{"type", "line"}, {"point", true}};
    json x = ChartCountAxis("parallelism", "workers x threads");
    x["scale"] = {{"type", "log"}, {"base", 2}};
    json y = ChartAxis("value", "quantitative", y_title);
    if (log_y) y["scale"] = {{"type", "log"}, {"base", 2}};
    // The ideal dashed, the measured modes solid or dotted (Vega-Lite would give the
    // first name in alphabetical order, "ideal", the solid line).
    json dash = ChartAxis("mode", "nominal", "mode");
    dash["scale"] = {{"domain", {"processes", "threads", "workers x threads", "ideal"}},
                     {"range", json::array({json::array({1, 0}), json::array({1, 0}),
                                            json::array({2, 2}), json::array({6, 4})})}};
    spec["encoding"] = {{"x", x},
                        {"y", y},
                        {"color", ChartAxis("series", "nominal", "series")},
                        {"strokeDash", dash},
                        {"shape", ChartAxis("mode", "nominal", "mode")},
                        {"tooltip", json::array({ChartAxis("cell", "nominal", "cell"),
                                                 ChartAxis("value", "quantitative", y_title)})}};
    return spec;
  };
  if (!parallelisms.empty()) {
    plots.push_back({"speedup", "Speedup against parallelism",
                     "Against the least parallel cell of the same series (mean wall time over "
                     "repeats); parallelism = workers x intra-op threads; the dashed line is "
                     "ideal scaling (P / P0; 1 for weak scaling). Log-log axes, as in the "
                     "papers' scaling plots.",
                     chart(speedup, "speedup", true)});
    plots.push_back({"efficiency", "Parallel efficiency against parallelism",
                     "Efficiency = speedup x P0 / P (weak scaling: T0 / T); 1 is ideal.",
                     chart(efficiency, "parallel efficiency", false)});
  }
  if (!power.empty()) {
    json spec = ChartSpec(power);
    spec["mark"] = {{"type", "line"}, {"point", true}};
    spec["encoding"] = {{"x", ChartCountAxis("parallelism", "workers x threads")},
                        {"y", ChartAxis("watts", "quantitative", "average power (W)")},
                        {"color", ChartAxis("series", "nominal", "series")},
                        {"strokeDash", ChartAxis("mode", "nominal", "mode")},
                        {"shape", ChartAxis("mode", "nominal", "mode")},
                        {"tooltip", json::array({ChartAxis("cell", "nominal", "cell"),
                                                 ChartAxis("watts", "quantitative", "W")})}};
    plots.push_back({"power-vs-parallelism", "Average power against parallelism",
                     "Energy over wall time, mean over repeats: a faster parallel run saves "
                     "energy only if its speedup beats its rise in power." +
                         est,
                     spec});
  }
}

// Test accuracy against global batch and energy per sample against workers; lines join
// only cells that differ in the x field.
void AddBatchPlots(const std::vector<SweepRow>& rows, const std::string& est,
                   std::vector<Chart>& plots) {
  json accuracy = json::array(), per_sample = json::array();
  // Series named by global batch, listed in numeric order (not as text).
  std::set<int> batches;
  for (const SweepRow& r : rows) batches.insert(r.global_batch);
  json batch_order = json::array();
  for (int b : batches) batch_order.push_back(absl::StrCat("global batch ", b));
  for (const SweepRow& r : rows) {
    if (r.succeeded == 0) continue;
    accuracy.push_back(
        {{"global_batch", r.global_batch},
         {"accuracy", r.accuracy_mean},
         {"others", OtherAxes(r.key, {"global_batch_size", "globalBatchSize", "workers"})},
         {"workers", absl::StrCat(r.workers, r.workers == 1 ? " worker" : " workers")},
         {"cell", r.key}});
    if (r.samples_per_joule > 0) {
      per_sample.push_back(
          {{"workers", r.workers},
           {"millijoules_per_sample", 1000.0 / r.samples_per_joule},
           {"others", OtherAxes(r.key, {"workers", "global_batch_size", "globalBatchSize"})},
           {"batch", absl::StrCat("global batch ", r.global_batch)},
           {"cell", r.key}});
    }
  }
  if (!accuracy.empty()) {
    json acc = ChartSpec(accuracy);
    acc["mark"] = {{"type", "line"}, {"point", true}};
    acc["encoding"] = {
        {"x",
         {{"field", "global_batch"},
          {"type", "quantitative"},
          {"title", "global batch"},
          {"scale", {{"type", "log"}, {"base", 2}}}}},
        {"y",
         {{"field", "accuracy"},
          {"type", "quantitative"},
          {"title", "test accuracy"},
          {"scale", {{"zero", false}}}}},
        {"color", ChartAxis("workers", "nominal", "workers")},
        // The grid's other axes (hidden sizes, threads, ...): a shape and a line each, named
        // in the legend, so cells that differ only there do not hide each other.
        {"shape", ChartAxis("others", "nominal", "other axes")},
        {"strokeDash", ChartAxis("others", "nominal", "other axes")},
        {"tooltip", json::array({ChartAxis("cell", "nominal", "cell"),
                                 ChartAxis("accuracy", "quantitative", "accuracy")})}};
    plots.push_back({"accuracy-vs-global-batch", "Test accuracy against global batch",
                     "Mean over repeats, after the last epoch", acc});
  }
  if (!per_sample.empty()) {
    json spec = ChartSpec(per_sample);
    spec["mark"] = {{"type", "line"}, {"point", true}};
    json color = ChartAxis("batch", "nominal", "");
    color["sort"] = batch_order;
    spec["encoding"] = {
        {"x", ChartCountAxis("workers", "workers")},
        {"y", ChartAxis("millijoules_per_sample", "quantitative", "energy per sample (mJ)")},
        {"color", color},
        {"shape", ChartAxis("others", "nominal", "other axes")},
        {"strokeDash", ChartAxis("others", "nominal", "other axes")},
        {"tooltip",
         json::array({ChartAxis("cell", "nominal", "cell"),
                      ChartAxis("millijoules_per_sample", "quantitative", "mJ/sample")})}};
    plots.push_back({"energy-per-sample", "Energy per sample against workers",
                     "Energy over training samples, mean over repeats." + est, spec});
  }
}

}  // namespace

std::vector<Chart> SweepPlots(const std::string& name, const std::vector<v1::Job>& jobs,
                              const std::vector<SweepRow>& rows, const LineFit* fit) {
  std::vector<Chart> plots;
  bool estimated = false;
  AddEnergyFitPlot(jobs, fit, &estimated, plots);
  const std::string est = estimated ? " Energy is estimated: the fit tests the estimator." : "";
  AddParallelismPlots(rows, est, plots);
  AddBatchPlots(rows, est, plots);
  (void)name;
  return plots;
}

namespace {

// Cells by colour, their keys whole in the legend (Vega-Lite cuts labels at 160 px).
json CellColor() {
  json c = ChartAxis("cell", "nominal", "cell");
  c["legend"] = {{"labelLimit", 480}};
  return c;
}

}  // namespace

std::vector<Chart> TuneCharts(const std::vector<TuneCell>& cells, const TuneOptions& o) {
  std::vector<Chart> charts;
  json paths = json::array();
  for (const TuneCell& c : cells) {
    for (const TuneEpoch& e : c.epochs) {
      paths.push_back({{"cell", c.key},
                       {"epoch", e.epoch},
                       {"accuracy", e.accuracy},
                       {"joules", e.joules},
                       {"seconds", e.seconds}});
    }
  }
  if (!paths.empty()) {
    json spec = ChartSpec(paths);
    json lines = {{"mark", {{"type", "line"}, {"point", true}}},
                  {"encoding",
                   {{"x", ChartAxis("joules", "quantitative", "energy spent by then (J)")},
                    {"y",
                     {{"field", "accuracy"},
                      {"type", "quantitative"},
                      {"title", "test accuracy"},
                      {"scale", {{"zero", false}}}}},
                    {"color", CellColor()},
                    {"tooltip", json::array({ChartAxis("cell", "nominal", "cell"),
                                             ChartAxis("epoch", "ordinal", "epoch"),
                                             ChartAxis("accuracy", "quantitative", "accuracy"),
                                             ChartAxis("joules", "quantitative", "J"),
                                             ChartAxis("seconds", "quantitative", "s")})}}}};
    json target = {{"data", {{"values", json::array({{{"accuracy", o.target_accuracy}}})}}},
                   {"mark", {{"type", "rule"}, {"strokeDash", {6, 4}}, {"color", "#c0392b"}}},
                   {"encoding", {{"y", {{"field", "accuracy"}, {"type", "quantitative"}}}}}};
    spec["layer"] = json::array({lines, target});
    charts.push_back({"tune-paths", "Each cell's path: accuracy against energy",
                      absl::StrFormat("Each cell's epochs over its rungs (a stopped cell's line "
                                      "ends where it stopped); the dashed line is the target %.4g",
                                      o.target_accuracy),
                      spec});
  }
  const TuneOutcome out = ChooseTuneCell(cells, o);
  json points = json::array(), front = json::array();
  for (const auto& [key, p] : out.projections) {
    if (!p.reached) continue;
    const bool on_front = std::find(out.front.begin(), out.front.end(), key) != out.front.end();
    const json point = {{"cell", key},
                        {"seconds", p.seconds},
                        {"joules", p.joules},
                        {"role", key == out.chosen ? "chosen"
                                 : on_front        ? "on the front"
                                                   : "reached the target"}};
    points.push_back(point);
    if (on_front) front.push_back(point);
  }
  if (!points.empty()) {
    json spec = ChartSpec(points);
    const json x = ChartAxis("seconds", "quantitative", "time to the target (s)");
    const json y = ChartAxis("joules", "quantitative", "energy to the target (J)");
    json dots = {{"mark", {{"type", "point"}, {"filled", true}, {"size", 80}}},
                 {"encoding",
                  {{"x", x},
                   {"y", y},
                   {"color", ChartAxis("role", "nominal", "")},
                   {"tooltip", json::array({ChartAxis("cell", "nominal", "cell"),
                                            ChartAxis("seconds", "quantitative", "s"),
                                            ChartAxis("joules", "quantitative", "J")})}}}};
    json line = {
        {"data", {{"values", front}}},
        {"mark", {{"type", "line"}, {"color", "#888"}}},
        {"encoding", {{"x", x}, {"y", y}, {"order", ChartAxis("seconds", "quantitative", "")}}}};
    spec["layer"] = json::array({line, dots});
    charts.push_back({"tune-front", "Time against energy to the target",
                      "The cells that reached the target, measured; the line joins the Pareto "
                      "front (no other cell both faster and cheaper)",
                      spec});
  }
  return charts;
}

}  // namespace joule
