// The web UI's pages over many jobs: usage (accounting, like `joule usage`), sweeps and a
// sweep (its cells, jobs and charts, like `joule sweep --html`, live), tunes and a tune
// (`joule tune`'s cells, rung by rung, and its choice), and compare (jobs side by side). Their
// charts are defined once, in common/ (server/usage.h's UsageCharts, common/sweep_charts.h,
// common/job_charts.h's CompareCharts).
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fit.h"
#include "common/job_charts.h"
#include "common/json_output.h"
#include "common/names.h"
#include "common/sweep_charts.h"
#include "common/sweep_format.h"
#include "common/sweep_summary.h"
#include "common/text.h"
#include "common/tune_search.h"
#include "server/usage.h"
#include "server/web_ui_internal.h"

namespace joule::server::web_ui {
namespace {

using nlohmann::json;

// The most jobs one sweep page reads, and the most a comparison takes.
constexpr int kMaxSweepJobs = 10000;
constexpr int kMaxComparedJobs = 8;

constexpr char kUsagePage[] = R"UI(<h1>Usage</h1>
<form id="usage-form">
group by <select name="by"><option value="user">user</option><option value="sweep">sweep</option>
<option value="model">model</option><option value="device_kind">device kind</option>
<option value="day">day</option><option value="week">week</option>
<option value="">nothing (the total)</option></select>
<input name="label" placeholder="or label KEY" size="12">
per <select name="per"><option value="">-</option><option value="day">day</option>
<option value="week">week</option></select>
created in the last <select name="days"><option value="1">day</option>
<option value="7">7 days</option><option value="30">30 days</option>
<option value="365">year</option><option value="0">any time</option></select>
<select name="state"><option value="">any state</option><option>pending</option>
<option>running</option><option>succeeded</option><option>failed</option>
<option>cancelled</option><option>budget_exceeded</option></select>
<button type="submit">show</button></form>
<table id="usage"><thead><tr><th>group</th><th class="num">jobs</th>
<th class="num">device-hours</th><th class="num">energy</th><th class="num">kWh</th>
<th class="num">estimated</th><th class="num" title="at the constant --grid-gco2-per-kwh">CO2
</th><th class="num" title="at the grid's intensity over the runs of the jobs that have it
(--carbon-intensity), and what carbon-aware jobs saved against starting at submit">grid CO2
</th><th class="num">energy/sample</th>
<th>sources</th></tr></thead><tbody></tbody></table>
<p id="note" class="caption"></p>
<div id="charts"></div>
<script>
// The choices live in the address (?by=&label=&per=&days=&state=); by user, per week,
// over 30 days unless given.
const usageQuery = new URLSearchParams(location.search);
const usageDefaults = {by: "user", per: "week", days: "30"};
for (const el of document.querySelectorAll("#usage-form [name]")) {
  el.value = usageQuery.has(el.name) ? usageQuery.get(el.name) : (usageDefaults[el.name] || "");
}
document.getElementById("usage-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const q = new URLSearchParams();
  for (const el of document.querySelectorAll("#usage-form [name]")) q.set(el.name, el.value);
  location.search = q.toString();
});
function usageRow(body, g, label) {
  const row = document.createElement("tr");
  jouleCell(row, label);
  jouleCell(row, g.jobs || 0, "num");
  jouleCell(row, (g.device_hours || 0) < 0.1 ? ((g.device_hours || 0) * 3600).toFixed(1) +
            " device-s" : (g.device_hours || 0).toFixed(2), "num");
  jouleCell(row, jouleJoules(g.joules || 0), "num");
  jouleCell(row, (g.kwh || 0).toPrecision(3), "num");
  jouleCell(row, g.joules > 0 ? (100 * (g.estimated_joules || 0) / g.joules).toFixed(0) + "%"
            : "-", "num");
  const co2 = g.co2_grams || 0;
  jouleCell(row, (co2 > 0 && co2 < 10 ? co2.toPrecision(2) : co2.toFixed(1)) + " g", "num");
  const grid = g.co2_grid_grams || 0, saved = g.co2_saved_grams || 0;
  jouleCell(row, (g.grid_covered_kwh || 0) > 0
            ? grid.toFixed(2) + " g of " + g.grid_covered_kwh.toPrecision(3) + " kWh" +
              (saved ? ", " + saved.toFixed(2) + " g saved" : "") : "-", "num");
  jouleCell(row, g.samples > 0 ? (1000 * g.joules / g.samples).toFixed(3) + " mJ" : "-", "num");
  const sources = Object.entries(g.joules_by_source || {}).sort((a, b) => b[1] - a[1]);
  jouleCell(row, sources.map(([s, j]) => s + " " + (g.joules > 0 ? (100 * j / g.joules)
            .toFixed(0) : 0) + "%").join(", "));
  body.appendChild(row);
}
jouleEvery(30000, async () => {
  const el = (name) => document.querySelector("#usage-form [name=" + name + "]").value;
  const q = new URLSearchParams();
  q.set("by", el("label") ? "label:" + el("label") : el("by"));
  if (el("per")) q.set("per", el("per"));
  const days = el("days") === "" ? 30 : Number(el("days"));  // one the list lacks: 30
  if (days > 0) q.set("since_ms", String(Date.now() - days * 86400000));
  if (el("state")) q.set("state", el("state"));
  const d = await jouleGet("/api/usage?" + q.toString());
  if (!d) return;
  const body = document.querySelector("#usage tbody");
  body.replaceChildren();
  for (const g of d.usage.groups || []) usageRow(body, g, g.key || "(none)");
  usageRow(body, d.usage.total || {}, "total");
  document.getElementById("note").textContent = (d.usage.jobs_scanned || 0) +
      " jobs read; CO2 at " + (d.usage.grid_gco2_per_kwh || 0) + " g/kWh" +
      (d.usage.truncated ? "; more groups than shown: the total has them all" : "");
  jouleStats.usageRows = (d.usage.groups || []).length;
  await jouleDrawCharts(document.getElementById("charts"), d.charts);
  jouleStats.refreshes++;
});
</script></body></html>
)UI";

constexpr char kSweepsPage[] = R"UI(<h1>Sweeps</h1>
<table id="groups"><thead><tr><th>sweep</th><th class="num">jobs</th>
<th class="num">unfinished</th><th class="num">energy</th><th class="num">device-hours</th>
</tr></thead><tbody></tbody></table>
<p class="caption">A sweep is the jobs of <code>joule sweep</code> (label sweep=NAME).</p>
<script>
jouleLabelledList("/api/sweeps", "/ui/sweep?name=", "sweeps");
</script></body></html>
)UI";

constexpr char kSweepPage[] = R"UI(<h1 id="title">Sweep</h1>
<table class="facts" id="facts"></table>
<h2>Cells</h2>
<table id="cells"><thead><tr><th>cell</th><th class="num">workers</th>
<th class="num">global batch</th><th class="num">done</th><th class="num">wall</th>
<th class="num">speedup</th><th class="num">efficiency</th><th class="num">accuracy</th>
<th class="num">energy</th><th class="num">energy/sample</th><th class="num">to target</th>
</tr></thead><tbody></tbody></table>
<div id="charts"></div>
<h2>Jobs</h2>
<p><a id="compare" href="#">compare the checked jobs</a></p>
<table id="jobs"><thead><tr><th></th><th>id</th><th>cell</th><th>state</th>
<th class="num">accuracy</th><th class="num">energy</th></tr></thead><tbody></tbody></table>
<script>
const sweepName = new URLSearchParams(location.search).get("name") || "";
const checked = new Set();
let shown = "";
document.getElementById("compare").addEventListener("click", (e) => {
  e.preventDefault();
  if (checked.size >= 2) location.href = "/ui/compare?ids=" + [...checked].slice(0, 8).join(",");
});
function fact(label, value) {
  const row = document.createElement("tr");
  jouleCell(row, label);
  jouleCell(row, value);
  document.getElementById("facts").appendChild(row);
}
jouleEvery(5000, async () => {
  const d = await jouleGet("/api/sweep?name=" + encodeURIComponent(sweepName), true);
  if (!d) return;
  if (d.missing) {
    document.getElementById("title").textContent = "No sweep " + sweepName;
    fact("not found", d.error);
    jouleStats.missing = true;
    return false;
  }
  const text = JSON.stringify(d);
  if (text !== shown) {
    shown = text;
    document.title = "Joule: sweep " + sweepName;
    document.getElementById("title").textContent = "Sweep " + sweepName;
    document.getElementById("facts").replaceChildren();
    fact("jobs", d.jobs.length + " (" + d.unfinished + " not ended)");
    fact("energy against device-hours", d.fit);
    const cells = document.querySelector("#cells tbody");
    cells.replaceChildren();
    for (const c of d.rows.cells) {
      const row = document.createElement("tr");
      jouleCell(row, c.cell);
      jouleCell(row, c.workers, "num");
      jouleCell(row, c.global_batch_size, "num");
      jouleCell(row, c.succeeded + "/" + c.jobs, "num");
      jouleCell(row, c.succeeded ? jouleFixed(c.wall_seconds_mean, 1) + " s" : "-", "num");
      jouleCell(row, c.speedup > 0 ? jouleFixed(c.speedup, 2) : "-", "num");
      jouleCell(row, c.efficiency > 0 ? (100 * c.efficiency).toFixed(0) + "%" : "-", "num");
      jouleCell(row, c.succeeded ? jouleFixed(c.test_accuracy_mean, 4) : "-", "num");
      jouleCell(row, c.succeeded ? jouleJoules(c.energy_joules_mean) : "-", "num");
      jouleCell(row, c.samples_per_joule > 0 ? jouleFixed(1000 / c.samples_per_joule, 3) + " mJ"
                : "-", "num");
      jouleCell(row, c.reached_target > 0 ? jouleFixed(c.time_to_target_seconds_mean, 1) + " s, " +
                jouleJoules(c.energy_to_target_joules_mean) : "-", "num");
      cells.appendChild(row);
    }
    const jobs = document.querySelector("#jobs tbody");
    jobs.replaceChildren();
    for (const j of d.jobs) {
      const row = document.createElement("tr");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = checked.has(j.id);
      box.addEventListener("change", () => box.checked ? checked.add(j.id) : checked.delete(j.id));
      jouleCell(row, "").appendChild(box);
      const a = document.createElement("a");
      a.href = "/ui/job?id=" + j.id;
      a.textContent = j.id;
      jouleCell(row, "").appendChild(a);
      jouleCell(row, j.cell);
      jouleCell(row, j.state, "state-" + j.state);
      jouleCell(row, j.test_accuracy > 0 ? jouleFixed(j.test_accuracy, 4) : "-", "num");
      jouleCell(row, jouleJoules(j.joules), "num");
      jobs.appendChild(row);
    }
    jouleStats.cells = d.rows.cells.length;
    await jouleDrawCharts(document.getElementById("charts"), d.charts);
  }
  jouleStats.refreshes++;
  return d.unfinished > 0;  // followed while jobs run
});
</script></body></html>
)UI";

constexpr char kComparePage[] = R"UI(<h1 id="title">Compare</h1>
<table id="compare"><thead><tr id="heads"><th></th></tr></thead><tbody></tbody></table>
<div id="charts"></div>
<script>
const ids = (new URLSearchParams(location.search).get("ids") || "").split(",")
    .filter(s => /^[0-9]{1,18}$/.test(s));
let shown = "";
jouleEvery(3000, async () => {
  const d = await jouleGet("/api/compare?ids=" + ids.join(","), true);
  if (!d) return;
  if (d.missing) {
    document.getElementById("title").textContent = "Nothing to compare";
    jouleShowError(d.error);
    jouleStats.missing = true;
    return false;
  }
  const text = JSON.stringify(d);
  if (text !== shown) {
    shown = text;
    document.getElementById("title").textContent = "Compare jobs " + ids.join(", ");
    const heads = document.getElementById("heads");
    heads.replaceChildren(document.createElement("th"));
    for (const j of d.jobs) {
      const th = document.createElement("th");
      const a = document.createElement("a");
      a.href = "/ui/job?id=" + j.id;
      a.textContent = "job " + j.id + (j.spec.name ? " (" + j.spec.name + ")" : "");
      th.appendChild(a);
      heads.appendChild(th);
    }
    const body = document.querySelector("#compare tbody");
    body.replaceChildren();
    const facts = [
      ["state", j => j.state],
      ["model", j => j.spec.model + " on " + j.spec.dataset],
      ["workers", j => j.spec.workers + " " + j.spec.device_kind],
      ["global batch", j => j.spec.global_batch_size],
      ["epochs", j => j.spec.epochs],
      ["optimizer", j => ((j.spec.optimizer || {}).name || "sgd") + " lr " +
                         ((j.spec.optimizer || {}).lr || 0)],
      ["test accuracy", j => j.result.test_accuracy > 0 ? j.result.test_accuracy.toFixed(4) : "-"],
      ["energy", j => jouleJoules(j.progress.job_energy_joules) +
                      (j.result.energy.estimated ? " (estimated)" : "")],
      ["train time", j => j.result.train_seconds > 0 ? j.result.train_seconds.toFixed(1) + " s"
                                                     : "-"],
      ["device-hours", j => (j.result.energy.device_hours || 0).toFixed(5)],
      ["samples/J", j => (j.result.energy.samples_per_joule || 0).toFixed(1)],
    ];
    for (const [label, value] of facts) {
      const row = document.createElement("tr");
      jouleCell(row, label);
      for (const j of d.jobs) jouleCell(row, String(value(j)));
      body.appendChild(row);
    }
    jouleStats.compared = d.jobs.length;
    await jouleDrawCharts(document.getElementById("charts"), d.charts);
  }
  jouleStats.refreshes++;
  return d.jobs.some(j => !jouleTerminal(j.state));
});
</script></body></html>
)UI";

constexpr char kTunesPage[] = R"UI(<h1>Tunes</h1>
<table id="groups"><thead><tr><th>tune</th><th class="num">jobs</th>
<th class="num">unfinished</th><th class="num">energy</th><th class="num">device-hours</th>
</tr></thead><tbody></tbody></table>
<p class="caption">A tune is the jobs of <code>joule tune run</code> (label tune=NAME).</p>
<script>
jouleLabelledList("/api/tunes", "/ui/tune?name=", "tunes");
</script></body></html>
)UI";

constexpr char kTunePage[] = R"UI(<h1 id="title">Tune</h1>
<table class="facts" id="facts"></table>
<h2>Cells</h2>
<table id="cells"><thead><tr><th>cell</th><th class="num">rungs</th>
<th class="num">epochs</th><th class="num">accuracy</th><th class="num">to target</th>
<th>state</th></tr></thead><tbody></tbody></table>
<div id="charts"></div>
<script>
const tuneName = new URLSearchParams(location.search).get("name") || "";
let tuneShown = "";
function tuneFact(label, value) {
  const row = document.createElement("tr");
  jouleCell(row, label);
  jouleCell(row, value);
  document.getElementById("facts").appendChild(row);
}
jouleEvery(5000, async () => {
  const d = await jouleGet("/api/tune?name=" + encodeURIComponent(tuneName), true);
  if (!d) return;
  if (d.missing) {
    document.getElementById("title").textContent = "No tune " + tuneName;
    tuneFact("not found", d.error);
    jouleStats.missing = true;
    return false;
  }
  const text = JSON.stringify(d);
  if (text !== tuneShown) {
    tuneShown = text;
    document.title = "Joule: tune " + tuneName;
    document.getElementById("title").textContent = "Tune " + tuneName;
    document.getElementById("facts").replaceChildren();
    tuneFact("minimizing", d.minimize + " to test accuracy " + d.target_accuracy);
    tuneFact("jobs", d.jobs + " (" + d.unfinished + " not ended), " + jouleJoules(d.joules));
    tuneFact("chosen", d.chosen ? d.chosen : "none yet");
    const body = document.querySelector("#cells tbody");
    body.replaceChildren();
    for (const c of d.cells) {
      const row = document.createElement("tr");
      jouleCell(row, c.cell);
      jouleCell(row, c.rungs, "num");
      jouleCell(row, c.epochs, "num");
      jouleCell(row, c.epochs > 0 ? jouleFixed(c.accuracy, 4) : "-", "num");
      jouleCell(row, c.feasible ? (c.reached ? "" : "~") + jouleJoules(c.joules) + ", " +
                (c.reached ? "" : "~") + jouleFixed(c.seconds, 1) + " s" : "-", "num");
      jouleCell(row, c.state);
      body.appendChild(row);
    }
    jouleStats.cells = d.cells.length;
    await jouleDrawCharts(document.getElementById("charts"), d.charts);
  }
  jouleStats.refreshes++;
  return d.unfinished > 0;  // followed while its jobs run
});
</script></body></html>
)UI";

std::string Param(const Request& r, const char* name) {
  auto it = r.params.find(name);
  return it == r.params.end() ? std::string() : it->second;
}

// GET /api/usage?by=&per=&since_ms=&until_ms=&state=a,b: the Usage RPC's answer (as
// JSON) and its charts. 400 for what UsageTally::Validate refuses.
Response UsageApi(Coordinator* c, const Request& r) {
  v1::UsageRequest req;
  req.set_group_by(Param(r, "by"));
  req.set_period(Param(r, "per"));
  for (const auto& [name, set] : {std::pair{"since_ms", &v1::UsageRequest::set_since_unix_ms},
                                  std::pair{"until_ms", &v1::UsageRequest::set_until_unix_ms}}) {
    int64_t ms = 0;
    if (const std::string t = Param(r, name); !t.empty() && !absl::SimpleAtoi(t, &ms)) {
      return Json({{"error", absl::StrCat(name, " is not a number")}}, 400);
    }
    (req.*set)(ms);
  }
  for (absl::string_view name : absl::StrSplit(Param(r, "state"), ',', absl::SkipEmpty())) {
    absl::StatusOr<v1::JobState> st = ParseJobState(std::string(name));
    if (!st.ok()) return Json({{"error", std::string(st.status().message())}}, 400);
    req.add_states(*st);
  }
  absl::StatusOr<v1::UsageResponse> usage = c->Usage(req);
  if (!usage.ok()) {
    return Json({{"error", std::string(usage.status().message())}},
                absl::IsInvalidArgument(usage.status()) ? 400 : 503);
  }
  return Json({{"usage", ProtoToJson(*usage)},
               {"charts", ChartsJson(UsageCharts(*usage, req.group_by()))}});
}

// GET /api/sweeps, /api/tunes: every value of label `key` (each a sweep or a tune) with
// its jobs, the unfinished ones, energy and device-hours, as {`list`: [...]}; from one
// Usage RPC, by the label.
Response LabelledGroupsApi(Coordinator* c, const std::string& key, const char* list) {
  v1::UsageRequest req;
  req.set_group_by("label:" + key);
  absl::StatusOr<v1::UsageResponse> all = c->Usage(req);
  if (!all.ok()) return Json({{"error", std::string(all.status().message())}}, 503);
  json groups = json::array();
  for (const v1::UsageGroup& g : all->groups()) {
    if (g.key().empty()) continue;  // jobs without the label
    int64_t unfinished = 0;
    for (const auto& [state, n] : g.jobs_by_state()) {
      absl::StatusOr<v1::JobState> s = ParseJobState(state);
      if (s.ok() && !IsTerminal(*s)) unfinished += n;
    }
    groups.push_back({{"name", g.key()},
                      {"jobs", g.jobs()},
                      {"unfinished", unfinished},
                      {"joules", g.joules()},
                      {"device_hours", g.device_hours()}});
  }
  return Json({{list, groups}});
}

// Up to kMaxSweepJobs jobs carrying label key=value, newest first, without what the sweep
// and tune pages do not read (each rank's result, the attempts' power series).
absl::StatusOr<std::vector<v1::Job>> LabelledJobs(Coordinator* c, const std::string& key,
                                                  const std::string& value) {
  v1::ListJobsRequest req;
  (*req.mutable_labels())[key] = value;
  req.set_page_size(500);
  std::vector<v1::Job> jobs;
  for (;;) {
    absl::StatusOr<v1::ListJobsResponse> page = c->ListJobs(req);
    if (!page.ok()) return page.status();
    for (v1::Job& j : *page->mutable_jobs()) {
      j.mutable_result()->clear_ranks();
      j.mutable_result()->mutable_attempts()->Clear();
      jobs.push_back(std::move(j));
    }
    if (page->next_before_id() <= 0 || static_cast<int>(jobs.size()) >= kMaxSweepJobs) break;
    req.set_before_id(page->next_before_id());
  }
  return jobs;
}

// GET /api/sweep?name=NAME: the sweep's rows (SweepJson's cells and fits), its jobs in
// brief, the fit in words, and its charts (SweepPlots). 404 for a name no job carries.
Response SweepApi(Coordinator* c, const Request& r) {
  const std::string name = Param(r, "name");
  if (name.empty()) return Json({{"error", "no sweep name given"}}, 404);
  if (name.size() > 4096) return Json({{"error", "the sweep name is longer than a label"}}, 404);
  absl::StatusOr<std::vector<v1::Job>> listed = LabelledJobs(c, "sweep", name);
  if (!listed.ok()) return Json({{"error", std::string(listed.status().message())}}, 503);
  std::vector<v1::Job> jobs = *std::move(listed);
  if (jobs.empty()) {
    return Json(
        {{"error", absl::StrCat("no job carries the label sweep=", SanitizeUtf8(name, 64))}}, 404);
  }
  std::reverse(jobs.begin(), jobs.end());  // oldest first, as `joule sweep` reads them
  const SweepAnalysis analysis = AnalyseSweep(jobs);
  json brief = json::array();
  int unfinished = 0;
  for (const v1::Job& j : jobs) {
    unfinished += IsTerminal(j.state()) ? 0 : 1;
    auto cell = j.spec().labels().find("cell");
    brief.push_back({{"id", j.id()},
                     {"cell", cell == j.spec().labels().end() ? "" : cell->second},
                     {"state", JobStateName(j.state())},
                     {"test_accuracy", j.result().test_accuracy()},
                     {"joules", j.progress().job_energy_joules()}});
  }
  const std::string fit = analysis.fit.ok()
                              ? LineFitText(*analysis.fit)
                              : absl::StrCat("no fit: ", analysis.fit.status().message());
  return Json(
      {{"rows", json::parse(SweepJson(analysis.rows, analysis.fit_or_null(),
                                      analysis.slope_model_or_null()),
                            nullptr, false)},
       {"jobs", brief},
       {"unfinished", unfinished},
       {"fit", fit},
       {"charts", ChartsJson(SweepPlots(name, jobs, analysis.rows, analysis.fit_or_null()))}});
}

// GET /api/tune?name=NAME: the tune's cells (their rungs, epochs, accuracy, measured or
// projected cost to the target, state), the choice so far and its charts (TuneCharts);
// the objective and target from its jobs (labels tune_minimize and tune_epochs, and
// spec.target_accuracy). 404 for a name no job carries.
Response TuneApi(Coordinator* c, const Request& r) {
  const std::string name = Param(r, "name");
  if (name.empty() || name.size() > 4096) return Json({{"error", "no tune name given"}}, 404);
  absl::StatusOr<std::vector<v1::Job>> listed = LabelledJobs(c, "tune", name);
  if (!listed.ok()) return Json({{"error", std::string(listed.status().message())}}, 503);
  std::vector<v1::Job> jobs = *std::move(listed);
  if (jobs.empty()) {
    return Json({{"error", absl::StrCat("no job carries the label tune=", SanitizeUtf8(name, 64))}},
                404);
  }
  TuneOptions o;
  const auto& labels = jobs.front().spec().labels();
  if (auto m = labels.find("tune_minimize"); m != labels.end()) {
    (void)ParseTuneObjective(m->second, &o.objective);
  }
  o.target_accuracy = jobs.front().spec().target_accuracy();
  int unfinished = 0;
  double joules = 0;
  std::set<std::string> running;
  for (const v1::Job& j : jobs) {
    o.max_epochs = std::max(o.max_epochs, j.spec().epochs());
    if (auto e = j.spec().labels().find("tune_epochs"); e != j.spec().labels().end()) {
      int epochs = 0;
      if (absl::SimpleAtoi(e->second, &epochs)) o.max_epochs = std::max(o.max_epochs, epochs);
    }
    joules += j.progress().job_energy_joules();
    if (!IsTerminal(j.state())) {
      ++unfinished;
      if (auto cell = j.spec().labels().find("cell"); cell != j.spec().labels().end()) {
        running.insert(cell->second);
      }
    }
  }
  std::map<std::string, int> rungs;
  std::vector<TuneCell> cells;
  for (auto& [key, cell] : TuneCellsFromJobs(jobs, &rungs)) cells.push_back(std::move(cell));
  const TuneOutcome out = ChooseTuneCell(cells, o);
  json rows = json::array();
  for (const TuneCell& cell : cells) {
    const TuneProjection& p = out.projections.at(cell.key);
    const int epochs = cell.epochs.empty() ? 0 : cell.epochs.back().epoch;
    std::string state = running.count(cell.key) > 0 ? "running"
                        : cell.failed               ? "failed"
                        : p.reached ? absl::StrCat("reached the target at epoch ", p.epoch)
                                    : absl::StrCat("stopped after ", epochs, " epochs");
    if (cell.key == out.chosen) state += " (chosen)";
    rows.push_back({{"cell", cell.key},
                    {"rungs", rungs[cell.key]},
                    {"epochs", epochs},
                    {"accuracy", cell.epochs.empty() ? 0.0 : cell.epochs.back().accuracy},
                    {"reached", p.reached},
                    {"feasible", p.feasible},
                    {"seconds", p.seconds},
                    {"joules", p.joules},
                    {"state", state}});
  }
  return Json({{"minimize", TuneObjectiveName(o.objective)},
               {"target_accuracy", o.target_accuracy},
               {"jobs", jobs.size()},
               {"unfinished", unfinished},
               {"joules", joules},
               {"chosen", out.chosen},
               {"cells", rows},
               {"charts", ChartsJson(TuneCharts(cells, o))}});
}

// GET /api/compare?ids=A,B,...: 2 to kMaxComparedJobs jobs (without their per-rank
// results) and CompareCharts. 400 for a malformed or too long list, 404 for a missing job.
Response CompareApi(Coordinator* c, const Request& r) {
  std::vector<int64_t> ids;
  for (absl::string_view part : absl::StrSplit(Param(r, "ids"), ',', absl::SkipEmpty())) {
    int64_t id = 0;
    if (part.size() > 18 || !absl::SimpleAtoi(part, &id) || id <= 0) {
      return Json({{"error", "ids is not a list of job ids"}}, 400);
    }
    if (static_cast<int>(ids.size()) >= kMaxComparedJobs) {
      return Json({{"error", absl::StrCat("at most ", kMaxComparedJobs, " jobs at once")}}, 400);
    }
    ids.push_back(id);
  }
  std::vector<v1::Job> jobs;
  for (int64_t id : ids) {
    absl::StatusOr<v1::Job> job = c->GetJob(id);
    if (!job.ok()) {
      return Json({{"error", std::string(job.status().message())}},
                  absl::IsNotFound(job.status()) ? 404 : 503);
    }
    job->mutable_result()->clear_ranks();
    jobs.push_back(*std::move(job));
  }
  if (jobs.empty()) return Json({{"error", "no job ids given (ids=A,B)"}}, 400);
  json list = json::array();
  for (const v1::Job& j : jobs) list.push_back(ProtoToJson(j));
  return Json({{"jobs", list}, {"charts", ChartsJson(CompareCharts(jobs))}});
}

// Answers of the whole-store reads (/api/usage, /api/sweeps) kept for kCacheSeconds, by
// the request's path and parameters: many tabs polling cost one read. Thread-safe.
class AnswerCache {
 public:
  static constexpr int kCacheSeconds = 10;
  static constexpr size_t kMaxEntries = 64;

  template <typename F>
  Response Get(const Request& r, F answer) {
    std::string key = r.path;
    for (const auto& [k, v] : r.params) absl::StrAppend(&key, "\n", k, "=", v);
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = entries_.find(key);
      if (it != entries_.end() && now - it->second.first < std::chrono::seconds(kCacheSeconds)) {
        return it->second.second;
      }
    }
    Response fresh = answer();
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.size() >= kMaxEntries) entries_.clear();
    if (fresh.status == 200) entries_[key] = {now, fresh};
    return fresh;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::pair<std::chrono::steady_clock::time_point, Response>> entries_;
};

}  // namespace

void InstallAnalysisPages(HttpServer& http, Coordinator* c, const Refusal& refused,
                          const PageMaker& page) {
  http.ServeRequest("/ui/usage", page(kUsagePage, "usage"));
  http.ServeRequest("/ui/sweeps", page(kSweepsPage, "sweeps"));
  http.ServeRequest("/ui/sweep", page(kSweepPage, "sweep"));
  http.ServeRequest("/ui/compare", page(kComparePage, "compare"));
  http.ServeRequest("/ui/tunes", page(kTunesPage, "tunes"));
  http.ServeRequest("/ui/tune", page(kTunePage, "tune"));
  auto cache = std::make_shared<AnswerCache>();
  http.ServeRequest("/api/usage", [c, refused, cache](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    return cache->Get(r, [&] { return UsageApi(c, r); });
  });
  http.ServeRequest("/api/sweeps", [c, refused, cache](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    return cache->Get(r, [&] { return LabelledGroupsApi(c, "sweep", "sweeps"); });
  });
  http.ServeRequest("/api/tunes", [c, refused, cache](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    return cache->Get(r, [&] { return LabelledGroupsApi(c, "tune", "tunes"); });
  });
  http.ServeRequest("/api/tune", [c, refused](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    return TuneApi(c, r);
  });
  http.ServeRequest("/api/sweep", [c, refused](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    return SweepApi(c, r);
  });
  http.ServeRequest("/api/compare", [c, refused](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    return CompareApi(c, r);
  });
}

}  // namespace joule::server::web_ui
