#include "client/html_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/job_format.h"
#include "common/atomic_file.h"
#include "common/energy_report.h"
#include "common/names.h"
#include "third_party/vega/vega_assets.h"

namespace joule::client {
namespace {

using nlohmann::json;

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string Escape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"},
                                 {"\"", "&quot;"}, {"'", "&#39;"}});
}

// Script text inside <script>: "</script" (any case) would end the element early (HTML's
// script data state); written "<\/script", which JavaScript reads the same in strings,
// regular expressions and comments, where alone it can occur.
std::string ScriptText(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 8 <= s.size() && s[i + 1] == '/' &&
        absl::EqualsIgnoreCase(Absl(s.substr(i + 2, 6)), "script")) {
      out += "<\\/";
      ++i;  // the '/'
      continue;
    }
    out += s[i];
  }
  return out;
}

// JSON inside <script type="application/json">: '<' occurs only in its strings, where
// "\u003c" stands for it, so no markup can begin.
std::string ScriptJson(const json& j) {
  // Invalid UTF-8 (which the coordinator refuses anyway) becomes U+FFFD rather than throwing.
  return absl::StrReplaceAll(j.dump(-1, ' ', false, json::error_handler_t::replace),
                             {{"<", "\\u003c"}});
}

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

std::string Joules(double j) {
  if (j >= 1e6) return absl::StrFormat("%.3f MJ", j / 1e6);
  if (j >= 1e3) return absl::StrFormat("%.2f kJ", j / 1e3);
  return absl::StrFormat("%.1f J", j);
}

}  // namespace

std::string RenderHtmlPage(const std::string& title, const std::vector<HtmlFact>& facts,
                           const std::vector<std::string>& notes,
                           const std::vector<HtmlPlot>& plots) {
  std::string out;
  absl::StrAppend(&out, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
                  "<title>", Escape(title), "</title>\n<!-- ",
                  absl::StrReplaceAll(Absl(assets::VegaLicenceNotice()), {{"--", "- -"}}), " -->\n");
  absl::StrAppend(&out, R"(<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 760px; color: #222; }
table.facts { border-collapse: collapse; margin-bottom: 1em; }
table.facts td { padding: 2px 12px 2px 0; vertical-align: top; }
table.facts td:first-child { color: #555; }
p.note { color: #8a4b00; }
p.caption { color: #555; font-size: 90%; margin-top: 0; }
h2 { font-size: 1.1em; margin-top: 1.6em; }
</style>
)");
  for (std::string_view js : {assets::VegaJs(), assets::VegaLiteJs(), assets::VegaEmbedJs()}) {
    absl::StrAppend(&out, "<script>", ScriptText(js), "</script>\n");
  }
  absl::StrAppend(&out, "</head>\n<body>\n<h1>", Escape(title), "</h1>\n<table class=\"facts\">\n");
  for (const auto& [label, value] : facts) {
    absl::StrAppend(&out, "<tr><td>", Escape(label), "</td><td>", Escape(value), "</td></tr>\n");
  }
  absl::StrAppend(&out, "</table>\n");
  for (const std::string& n : notes) absl::StrAppend(&out, "<p class=\"note\">", Escape(n), "</p>\n");
  json specs = json::array();
  for (const HtmlPlot& p : plots) {
    absl::StrAppend(&out, "<h2>", Escape(p.title), "</h2>\n<div class=\"joule-plot\" id=\"",
                    Escape(p.id), "\" data-title=\"", Escape(p.title), "\"></div>\n");
    if (!p.caption.empty()) absl::StrAppend(&out, "<p class=\"caption\">", Escape(p.caption), "</p>\n");
    specs.push_back({{"id", p.id}, {"spec", p.spec}});
  }
  if (plots.empty()) absl::StrAppend(&out, "<p>No plot: the job recorded no series.</p>\n");
  absl::StrAppend(&out, "<script type=\"application/json\" id=\"joule-plots\">",
                  ScriptJson(specs), "</script>\n");
  absl::StrAppend(&out, R"(<script>
(function () {
  const plots = JSON.parse(document.getElementById("joule-plots").textContent);
  Promise.all(plots.map(function (p) {
    return vegaEmbed("#" + p.id, p.spec, {renderer: "svg", actions: false});
  })).then(function () {
    document.body.dataset.rendered = String(plots.length);
  }).catch(function (e) {
    console.error("joule: a plot failed to render: " + e);
  });
})();
</script>
</body>
</html>
)");
  return out;
}

namespace {

// The last epoch's test accuracy, or a regression's test RMSE.
HtmlFact LastEvaluationFact(const v1::JobResult& r) {
  if (r.history_size() == 0) return {"test accuracy", "-"};
  const v1::EpochRecord& last = r.history(r.history_size() - 1);
  if (last.has_test_rmse()) return {"test RMSE", absl::StrFormat("%.4g", last.test_rmse())};
  return {"test accuracy", absl::StrFormat("%.4f", last.test_accuracy())};
}

}  // namespace

std::vector<HtmlPlot> JobPlots(const v1::Job& job) { return JobCharts(job); }

std::string JobHtml(const v1::Job& job) {
  const v1::JobSpec& s = job.spec();
  const v1::JobResult& r = job.result();
  const v1::EnergyReport& e = r.energy();
  const char* est = e.estimated() ? " (estimated)" : "";
  std::vector<HtmlFact> facts = {
      {"state", JobStateName(job.state()) + (job.reason().empty() ? "" : ": " + job.reason())},
      {"model", absl::StrCat(s.model(), " on ", s.dataset())},
      {"workers", absl::StrCat(s.workers(), " ", DeviceKindName(s.device_kind()))},
      {"batch", absl::StrCat("global ", s.global_batch_size(), ", local ", s.local_batch_size())},
      {"epochs", absl::StrCat(s.epochs())},
      {"wall time", absl::StrFormat("%.2f s", r.wall_seconds())},
      LastEvaluationFact(r),
      {"energy", absl::StrCat(Joules(JobJoulesSoFar(e)), est,
                              absl::StrFormat(" = %.6f kWh", JobJoulesSoFar(e) / 3.6e6))},
      {"average power", absl::StrFormat("%.2f W", e.average_watts())},
      {"device-hours", absl::StrFormat("%.6f", e.device_hours())},
      {"energy per device-hour", absl::StrCat(Joules(e.joules_per_device_hour()), est)},
      {"samples per joule", absl::StrFormat("%.2f", e.samples_per_joule())},
      {"CO2", absl::StrFormat("%.3f g at %.0f gCO2/kWh", e.co2_grams(), e.grid_gco2_per_kwh())}};
  if (s.energy_budget_joules() > 0) {
    facts.push_back({"energy budget",
                     absl::StrFormat("%s: %s spent, %.1f%% used", Joules(s.energy_budget_joules()),
                                     Joules(JobJoulesSoFar(e)),
                                     100 * JobJoulesSoFar(e) / s.energy_budget_joules())});
  }
  for (const v1::AccuracyTarget& t : r.to_accuracy()) {
    facts.push_back({absl::StrCat("to ", TargetLabel(t)),
                     t.reached() ? absl::StrFormat("%.2f s, %s (epoch %d)", t.seconds(),
                                                   Joules(t.joules()), t.epoch())
                                 : "not reached"});
  }
  // The BLAS the ranks' GEMMs ran on (each distinct one once), and a fallback's warning.
  std::set<std::string> blas;
  std::vector<std::string> notes;
  for (const v1::RankResult& rank : r.ranks()) {
    if (rank.blas().library().empty()) continue;
    blas.insert(BlasLabel(rank.blas()));
    if (rank.blas().fallback()) {
      notes.push_back(absl::StrCat("warning: rank ", rank.rank(), " ran its GEMMs on ",
                                   rank.blas().core(),
                                   ", narrower than its CPU's vectors: slower than it "
                                   "could be (",
                                   rank.blas().choice(), ")."));
    }
  }
  if (!blas.empty()) facts.push_back({"BLAS", absl::StrJoin(blas, "; ")});
  if (e.estimated()) {
    notes.push_back("Energy is estimated (CPU time x watts per busy core), not read from a "
                    "meter: the figures test the estimator, not the hardware.");
  }
  for (const std::string& w : e.warnings()) notes.push_back("warning: " + w);
  return RenderHtmlPage(absl::StrCat("Joule job ", job.id(), s.name().empty() ? "" : " (" + s.name() + ")"),
                        facts, notes, JobPlots(job));
}

namespace {

// The energy-against-device-hours plot of the sweep's succeeded jobs with the fitted line
// (nothing without any); sets *estimated when some of their energy is.
void AddEnergyFitPlot(const std::vector<v1::Job>& jobs, const LineFit* fit, bool* estimated,
                      std::vector<HtmlPlot>& plots) {
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
  plots.push_back(
      {"energy-vs-device-hours", "Energy against device-hours",
       fit ? absl::StrCat("Each point a job; the line: ", LineFitText(*fit), ".", est)
           : "Each point a job (too few for a fit)." + est,
       spec});
}

// Speedup and efficiency (each its own chart, with ideal linear scaling drawn) and average
// power against workers x threads: a colour per scaling series, a shape and dash per mode:
// more threads in one worker, more workers of one thread (the serial cell starts each that
// its series has), or both.
void AddParallelismPlots(const std::vector<SweepRow>& rows, const std::string& est,
                         std::vector<HtmlPlot>& plots) {
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
                     "energy only if its speedup beats its rise in power." + est,
                     spec});
  }
}

// Test accuracy against global batch and energy per sample against workers; lines join
// only cells that differ in the x field.
void AddBatchPlots(const std::vector<SweepRow>& rows, const std::string& est,
                   std::vector<HtmlPlot>& plots) {
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

std::vector<HtmlPlot> SweepPlots(const std::string& name, const std::vector<v1::Job>& jobs,
                                 const std::vector<SweepRow>& rows, const LineFit* fit) {
  std::vector<HtmlPlot> plots;
  bool estimated = false;
  AddEnergyFitPlot(jobs, fit, &estimated, plots);
  const std::string est = estimated ? " Energy is estimated: the fit tests the estimator." : "";
  AddParallelismPlots(rows, est, plots);
  AddBatchPlots(rows, est, plots);
  (void)name;
  return plots;
}

std::string SweepHtml(const std::string& name, const std::vector<v1::Job>& jobs,
                      const std::vector<SweepRow>& rows, const LineFit* fit,
                      const LinearFit* slope_model) {
  std::map<std::string, int> states;
  bool estimated = false;
  for (const v1::Job& j : jobs) {
    ++states[JobStateName(j.state())];
    estimated = estimated || j.result().energy().estimated();
  }
  std::string counts;
  for (const auto& [state, n] : states) absl::StrAppend(&counts, counts.empty() ? "" : ", ", n, " ", state);
  std::vector<HtmlFact> facts = {{"jobs", counts}, {"cells", absl::StrCat(rows.size())}};
  if (fit) {
    facts.push_back({"energy vs device-hours", LineFitText(*fit)});
  }
  if (slope_model) {
    facts.push_back({"J per device-hour model",
                     LinearFitText(*slope_model,
                                   {"x samples/device-hour", "x updates/device-hour"})});
  }
  for (const SweepRow& r : rows) {
    facts.push_back({r.key, absl::StrFormat("%d/%d ok, wall %.2f s, speedup %.2f, efficiency "
                                            "%.2f, accuracy %.4f, %s, %.1f samples/J",
                                            r.succeeded, r.jobs, r.wall_mean, r.speedup,
                                            r.efficiency, r.accuracy_mean, Joules(r.energy_mean),
                                            r.samples_per_joule)});
  }
  std::vector<std::string> notes;
  if (estimated) {
    notes.push_back("Energy is estimated (CPU time x watts per busy core), not read from a "
                    "meter: the fits test the estimator, not the hardware.");
  }
  return RenderHtmlPage(absl::StrCat("Joule sweep ", name), facts, notes,
                        SweepPlots(name, jobs, rows, fit));
}

absl::Status WriteHtmlFile(const std::string& path, const std::string& html) {
  return WriteFileAtomically(path, html);
}

}  // namespace joule::client
