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
