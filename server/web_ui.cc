#include "server/web_ui.h"

#include <openssl/rand.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/job_charts.h"
#include "common/json_output.h"
#include "common/names.h"
#include "common/security.h"
#include "server/web_ui_internal.h"
#include "third_party/vega/vega_assets.h"

namespace joule::server {

web_ui::Response web_ui::Json(const nlohmann::json& value, int status) {
  Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  r.headers.push_back({"Cache-Control", "no-store"});
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  return r;
}

namespace {

using nlohmann::json;
using web_ui::Json;
using web_ui::Request;
using web_ui::Response;

constexpr char kCookie[] = "joule_token";
constexpr char kCsrfCookie[] = "joule_csrf";
constexpr char kLoginCookie[] = "joule_login";  // the sign-in form's CSRF value

Response Html(std::string body, int status = 200) {
  Response r;
  r.status = status;
  r.content_type = "text/html; charset=utf-8";
  r.body = std::move(body);
  r.headers.push_back({"Cache-Control", "no-store"});
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  // The pages run only scripts this server serves as files (no inline script: each page's
  // own is /ui/assets/page-NAME.js), talk only to it and are framed by no one. Vega
  // compiles its expressions with Function(), hence 'unsafe-eval'; no page has markup
  // from a user that is not escaped (jouleCell sets textContent).
  r.headers.push_back({"Content-Security-Policy",
                       "default-src 'self'; script-src 'self' 'unsafe-eval'; "
                       "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                       "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"});
  return r;
}

Response Asset(std::string_view body, const char* type) {
  Response r;
  r.content_type = type;
  r.body.assign(body.data(), body.size());
  r.headers.push_back({"Cache-Control", "max-age=3600"});
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  return r;
}

// A page body's one inline script, moved out: the body with <script src="/ui/assets/
// page-NAME.js"> in its place, and the script. A body without one is kept as it is.
std::pair<std::string, std::string> SplitPageScript(absl::string_view body,
                                                    absl::string_view name) {
  const size_t open = body.find("<script>");
  const size_t close = open == absl::string_view::npos ? open : body.find("</script>", open);
  if (close == absl::string_view::npos) return {std::string(body), ""};
  return {absl::StrCat(body.substr(0, open), "<script src=\"/ui/assets/page-", name,
                       ".js\"></script>", body.substr(close + 9)),
          std::string(body.substr(open + 8, close - open - 8))};
}

// 32 random hex digits, or "" when the system has no random bytes.
std::string RandomHex() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return "";
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
}

// A cookie's value from the request's Cookie header, or "".
std::string CookieOf(const HttpServer::Request& r, absl::string_view name) {
  auto c = r.headers.find("cookie");
  if (c == r.headers.end()) return "";
  for (absl::string_view part : absl::StrSplit(c->second, ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, name) && absl::ConsumePrefix(&part, "=")) {
      return std::string(part);
    }
  }
  return "";
}

// Sign-in sessions: the cookie holds a random id, never the token (a cookie goes to every
// port of the host name). At most kMaxSessions, each for kSessionHours. Thread-safe.
class Sessions {
 public:
  static constexpr size_t kMaxSessions = 1000;
  static constexpr int kSessionHours = 12;
  std::string Open(const std::string& client) {
    std::string id = RandomHex();
    if (id.empty()) return "";
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      it = it->second.expires < now ? sessions_.erase(it) : std::next(it);
    }
    if (sessions_.size() >= kMaxSessions) sessions_.erase(sessions_.begin());
    sessions_[id] = {client, now + std::chrono::hours(kSessionHours)};
    return id;
  }
  bool Valid(const std::string& id) { return ClientOf(id).has_value(); }
  // The client a live session was opened for.
  std::optional<std::string> ClientOf(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second.expires <= std::chrono::steady_clock::now()) {
      return std::nullopt;
    }
    return it->second.client;
  }

 private:
  struct Session {
    std::string client;
    std::chrono::steady_clock::time_point expires;
  };
  std::mutex mu_;
  std::map<std::string, Session> sessions_;
};

bool Hex32(const std::string& s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// The session id in the login cookie, or "".
std::string SessionOf(const Request& r) {
  std::string id = CookieOf(r, kCookie);
  return Hex32(id) ? id : "";
}

// The sign-in form's own check against cross-site requests: an Origin header, when the
// browser sends one, names this server (scheme://Host), and the form's csrf field equals
// its cookie (double submit: another site can post the form but can read neither).
// Returns why not, or "".
std::string LoginForgery(const Request& r) {
  if (auto o = r.headers.find("origin"); o != r.headers.end()) {
    auto h = r.headers.find("host");
    const std::string host = h == r.headers.end() ? "" : h->second;
    if (o->second != "http://" + host && o->second != "https://" + host) {
      return "the sign-in came from another site";
    }
  }
  auto f = r.params.find("csrf");
  const std::string field = f == r.params.end() ? "" : f->second;
  const std::string cookie = CookieOf(r, kLoginCookie);
  if (!Hex32(field) || field != cookie) return "the sign-in form has expired: load it again";
  return "";
}

// Without tokens the UI is open, so only to pages this machine serves itself: a Host of
// loopback (another name could be a DNS rebinding of a hostile page to 127.0.0.1).
bool LoopbackHost(const Request& r) {
  auto h = r.headers.find("host");
  if (h == r.headers.end()) return false;
  std::string host = h->second;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == std::string::npos ? 0 : host.find(']') - 1);
  } else {
    host = host.substr(0, host.find(':'));
  }
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

// The bearer token of a request ("Authorization: Bearer T"), or "".
std::string TokenOf(const Request& r) {
  if (auto a = r.headers.find("authorization"); a != r.headers.end()) {
    if (absl::StartsWith(a->second, "Bearer ")) return a->second.substr(7);
  }
  return "";
}

constexpr char kPageHead[] = R"UI(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Joule</title>
<link rel="stylesheet" href="/ui/assets/joule.css">
<script src="/ui/assets/vega.js"></script>
<script src="/ui/assets/vega-lite.js"></script>
<script src="/ui/assets/vega-embed.js"></script>
<script src="/ui/assets/joule.js"></script>
</head><body>
<header><b>Joule</b> <a href="/ui/">Jobs</a> <a href="/ui/workers">Workers</a>
<a href="/ui/usage">Usage</a> <a href="/ui/sweeps">Sweeps</a> <a href="/ui/tunes">Tunes</a>
<span id="error" class="error"></span></header>
)UI";

constexpr char kCss[] = R"UI(
body { font-family: system-ui, sans-serif; margin: 0 auto 3em; max-width: 1100px; color: #222; }
header { padding: 0.8em 0; border-bottom: 1px solid #ddd; margin-bottom: 1em; }
header a { margin-left: 1em; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #eee; font-size: 92%; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.state-running { color: #0a6; } .state-failed, .state-budget_exceeded { color: #b00; }
.state-cancelled { color: #888; } .state-pending { color: #a60; }
.error { color: #b00; margin-left: 2em; }
.estimated { color: #a60; }
pre { background: #f6f6f6; padding: 0.6em; overflow: auto; max-height: 28em; font-size: 85%; }
.facts td:first-child { color: #555; width: 14em; }
h2 { font-size: 1.05em; margin-top: 1.5em; }
p.caption { color: #555; font-size: 90%; margin-top: 0; }
.nodata { color: #888; font-style: italic; border: 1px dashed #ccc; padding: 2em; text-align: center; }
)UI";

// Shared by the pages: fetching (a 401 leads to the login page), formatting, and
// window.jouleStats, which tests read.
constexpr char kJs[] = R"UI(
"use strict";
window.jouleStats = {refreshes: 0, jobs: 0, powerPoints: 0, logLines: 0, state: "", workers: 0};
function jouleShowError(text) { document.getElementById("error").textContent = text; }
// The JSON at `path`; null on an error (shown in the header). With `missing`, a 404 (or a
// 400: asking again will not help) returns {missing: true, error} instead, for a page to
// say so and stop.
async function jouleGet(path, missing) {
  const r = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  if (r.status === 401) { location.href = "/ui/login"; return null; }
  if (missing && (r.status === 404 || r.status === 400)) {
    const d = await r.json().catch(() => ({}));
    return {missing: true, error: d.error || "not found"};
  }
  if (!r.ok) { jouleShowError(path + ": HTTP " + r.status); return null; }
  jouleShowError("");
  return r.json();
}
// A POST the server takes only from its own pages: the joule_csrf cookie's value (which
// another site can neither read nor set) in the X-Joule-CSRF header.
async function joulePost(path) {
  const m = document.cookie.match(/(?:^|; )joule_csrf=([0-9a-f]{32})/);
  const r = await fetch(path, {method: "POST", credentials: "same-origin", cache: "no-store",
                               headers: {"X-Joule-CSRF": m ? m[1] : ""}});
  const d = await r.json().catch(() => ({}));
  if (!r.ok) { jouleShowError(path + ": " + (d.error || "HTTP " + r.status)); return null; }
  jouleShowError("");
  return d;
}
function jouleJoules(j) {
  if (!(j > 0)) return "-";
  if (j >= 3.6e6) return (j / 3.6e6).toFixed(3) + " kWh";
  if (j >= 1e3) return (j / 1e3).toFixed(2) + " kJ";
  return j.toFixed(1) + " J";
}
// x with `digits` decimals, or "-" when it is not a finite number (JSON's null).
function jouleFixed(x, digits) {
  return Number.isFinite(x) ? x.toFixed(digits) : "-";
}
function jouleCell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}
function jouleTerminal(state) {
  return ["succeeded", "failed", "cancelled", "budget_exceeded"].includes(state);
}
// Draws `charts` (the API's [{id, title, caption, empty, spec}]) into `box`: each an <h2>,
// a <div id=ID> and its caption; an empty one's div says "no data yet" instead of a plot.
// jouleStats.charts counts the plots drawn, jouleStats.emptyCharts the others.
async function jouleDrawCharts(box, charts) {
  box.replaceChildren();
  for (const c of charts) {
    const h = document.createElement("h2");
    h.textContent = c.title;
    const div = document.createElement("div");
    div.id = c.id;
    if (c.empty) {
      div.className = "nodata";
      div.textContent = "no data yet";
    }
    const p = document.createElement("p");
    p.className = "caption";
    p.textContent = c.caption;
    box.append(h, div, p);
  }
  if (!charts.length) box.textContent = "No chart yet: nothing reported.";
  jouleStats.charts = charts.filter(c => !c.empty).length;
  jouleStats.emptyCharts = charts.length - jouleStats.charts;
  for (const c of charts) {
    if (!c.empty) await vegaEmbed("#" + c.id, c.spec, {renderer: "svg", actions: false});
  }
}
// The sweeps and tunes pages: the groups of one label from `api` ({`stat`: [{name, jobs,
// unfinished, joules, device_hours}]}) in #groups, each linked to `link` + its name;
// jouleStats[stat] counts them. Every 30 s: the list reads every job (the Usage RPC).
function jouleLabelledList(api, link, stat) {
  jouleEvery(30000, async () => {
    const d = await jouleGet(api);
    if (!d) return;
    const body = document.querySelector("#groups tbody");
    body.replaceChildren();
    if (!d[stat].length) {
      const row = document.createElement("tr");
      jouleCell(row, "no " + stat + " yet");
      body.appendChild(row);
    }
    for (const g of d[stat]) {
      const row = document.createElement("tr");
      const a = document.createElement("a");
      a.href = link + encodeURIComponent(g.name);
      a.textContent = g.name;
      jouleCell(row, "").appendChild(a);
      jouleCell(row, g.jobs, "num");
      jouleCell(row, g.unfinished, "num");
      jouleCell(row, jouleJoules(g.joules), "num");
      jouleCell(row, jouleFixed(g.device_hours, 4), "num");
      body.appendChild(row);
    }
    jouleStats[stat] = d[stat].length;
    jouleStats.refreshes++;
  });
}
function jouleEvery(ms, fn) {
  let stop = false;
  const tick = async () => {
    try { stop = (await fn()) === false; } catch (e) { jouleShowError(String(e)); }
    if (!stop) setTimeout(tick, ms);
  };
  tick();
}
)UI";

constexpr char kJobsPage[] = R"UI(<h1>Jobs</h1>
<form id="filters">
<select name="state"><option value="">any state</option><option>pending</option>
<option>running</option><option>succeeded</option><option>failed</option>
<option>cancelled</option><option>budget_exceeded</option></select>
<input name="user" placeholder="user" size="10">
<input name="label" placeholder="label KEY=VALUE" size="16">
<input name="q" placeholder="name or model" size="14">
<button type="submit">filter</button></form>
<p><a id="compare" href="#">compare the checked jobs</a></p>
<table id="jobs"><thead><tr><th></th><th>id</th><th>name</th><th>state</th><th>model</th>
<th class="num">workers</th><th>progress</th><th class="num">accuracy</th>
<th class="num">energy</th><th class="num">power</th><th class="num">duration</th>
<th>submitted</th><th></th></tr></thead>
<tbody></tbody></table>
<p><a id="newer" href="#" hidden>newest</a> <a id="older" href="#" hidden>older</a></p>
<script>
// The filters and the page live in the address (?state=&user=&label=&q=&before=).
const jouleQuery = new URLSearchParams(location.search);
const checked = new Set();  // jobs to compare, kept across refreshes
document.getElementById("compare").addEventListener("click", (e) => {
  e.preventDefault();
  if (checked.size >= 2) location.href = "/ui/compare?ids=" + [...checked].slice(0, 8).join(",");
});
for (const el of document.querySelectorAll("#filters [name]")) {
  el.value = jouleQuery.get(el.name) || "";
}
document.getElementById("filters").addEventListener("submit", (e) => {
  e.preventDefault();
  const q = new URLSearchParams();
  for (const el of document.querySelectorAll("#filters [name]")) {
    if (el.value) q.set(el.name, el.value);
  }
  location.search = q.toString();
});
function jouleDuration(j) {
  const start = Date.parse(j.started_time || "");
  if (!(start > 0)) return "-";
  const end = j.finished_time ? Date.parse(j.finished_time) : Date.now();
  const s = Math.max(0, (end - start) / 1000);
  return s < 120 ? s.toFixed(1) + " s" : s < 7200 ? (s / 60).toFixed(1) + " min"
      : (s / 3600).toFixed(1) + " h";
}
jouleEvery(2000, async () => {
  const q = new URLSearchParams(jouleQuery);
  q.set("limit", "100");
  const d = await jouleGet("/api/jobs?" + q.toString());
  if (!d) return;
  const body = document.querySelector("#jobs tbody");
  body.textContent = "";
  const older = document.getElementById("older");
  older.hidden = !(d.next_before_id > 0);
  const next = new URLSearchParams(jouleQuery);
  next.set("before", d.next_before_id);
  older.href = "?" + next.toString();
  const newer = document.getElementById("newer");
  newer.hidden = !jouleQuery.get("before");
  const first = new URLSearchParams(jouleQuery);
  first.delete("before");
  newer.href = "?" + first.toString();
  if (d.jobs.length === 0) {
    const row = document.createElement("tr");
    jouleCell(row, "no jobs" + (location.search ? " match the filters" : " yet"));
    body.appendChild(row);
  }
  for (const j of d.jobs) {
    const row = document.createElement("tr");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "pick";
    box.checked = checked.has(j.id);
    box.addEventListener("change", () => box.checked ? checked.add(j.id) : checked.delete(j.id));
    jouleCell(row, "").appendChild(box);
    const id = jouleCell(row, "");
    const a = document.createElement("a");
    a.href = "/ui/job?id=" + j.id;
    a.textContent = j.id;
    id.appendChild(a);
    jouleCell(row, j.spec.name);
    jouleCell(row, j.state, "state-" + j.state);
    jouleCell(row, j.spec.model);
    jouleCell(row, j.spec.workers, "num");
    const p = j.progress;
    jouleCell(row, j.state === "running" && p.epoch > 0
        ? "epoch " + p.epoch + "/" + j.spec.epochs + ", step " + p.step + "/" +
          p.steps_per_epoch * j.spec.epochs : j.state === "succeeded" ? "done" : "-");
    const acc = j.state === "succeeded" ? j.result.test_accuracy
        : (p.test_accuracy >= 0 && j.state === "running" ? p.test_accuracy : null);
    jouleCell(row, acc === null ? "-" : acc.toFixed(4), "num");
    const joules = p.job_energy_joules;  // the coordinator's one figure, live or ended
    const est = j.result.energy.estimated || p.energy_estimated;
    jouleCell(row, jouleJoules(joules) + (est && joules > 0 ? " (est.)" : ""),
              "num" + (est ? " estimated" : ""));
    const watts = p.rank_power_watts && p.rank_power_watts.length ? p.job_power_watts
        : p.power_watts;  // the job's (an older coordinator: rank 0's)
    jouleCell(row, j.state === "running" && watts > 0 ? watts.toFixed(1) + " W" : "-", "num");
    jouleCell(row, jouleDuration(j), "num");
    jouleCell(row, j.created_time ? j.created_time.replace("T", " ").slice(0, 19) : "-");
    const act = jouleCell(row, "");
    if (j.state === "pending" || j.state === "running") {
      const b = document.createElement("button");
      b.className = "cancel";
      b.textContent = "cancel";
      b.addEventListener("click", async () => {
        b.disabled = true;
        const r = await joulePost("/api/jobs/" + j.id + "/cancel");
        if (r) jouleStats.cancelled = (jouleStats.cancelled || 0) + 1;
        else b.disabled = false;
      });
      act.appendChild(b);
    }
    body.appendChild(row);
  }
  jouleStats.jobs = d.jobs.length;
  jouleStats.refreshes++;
});
</script></body></html>
)UI";

constexpr char kJobPage[] = R"UI(<h1 id="title">Job</h1>
<table class="facts" id="facts"></table>
<div id="charts"></div>
<h2>Spec</h2><table class="facts" id="spec"></table>
<h2>Log</h2><pre id="log"></pre>
<script>
const jobId = /^[0-9]{1,18}$/.test(new URLSearchParams(location.search).get("id") || "")
    ? new URLSearchParams(location.search).get("id") : "0";
let logAfter = 0, chartsShown = "", endedAt = -1;
function fact(table, label, value) {
  const row = document.createElement("tr");
  jouleCell(row, label);
  jouleCell(row, value);
  table.appendChild(row);
}
// The job's charts, the HTML report's (common/job_charts.h), redrawn when their data
// changes (jouleDrawCharts).
async function drawCharts() {
  const charts = await jouleGet("/api/jobs/" + jobId + "/charts");
  if (!charts) return;
  const text = JSON.stringify(charts);
  if (text === chartsShown) return;
  chartsShown = text;
  const power = charts.find(c => c.id === "power-by-rank" && !c.empty);
  // The reported samples (each rank's line also starts at 0 s).
  jouleStats.powerPoints = power ? power.spec.data.values.filter(v => v.seconds > 0).length : 0;
  await jouleDrawCharts(document.getElementById("charts"), charts);
}
// The spec's fields that say something (not zero, empty or false), flattened to dotted
// names; the GA's only for a GA job.
function specRows(spec, prefix, out) {
  for (const [k, v] of Object.entries(spec)) {
    if (k === "ga" && spec.algorithm !== "ga" && prefix === "") continue;
    const name = prefix + k;
    if (v === null || v === 0 || v === "" || v === false || v === "unspecified") continue;
    if (Array.isArray(v)) {
      if (v.length) out.push([name, v.map(x => typeof x === "object" ? JSON.stringify(x) : x)
                                      .join(", ")]);
    } else if (typeof v === "object") {
      specRows(v, name + ".", out);
    } else {
      out.push([name, String(v)]);
    }
  }
  return out;
}
let jobMissing = false;
jouleEvery(1500, async () => {
  if (jobMissing) return;
  const j = await jouleGet("/api/jobs/" + jobId, true);
  if (!j) return;
  if (j.missing) {
    jobMissing = true;
    document.title = "Joule: no job " + jobId;
    document.getElementById("title").textContent = "No job " + jobId;
    const f = document.getElementById("facts");
    f.textContent = "";
    fact(f, "not found", j.error + ". ");
    const back = document.createElement("a");
    back.href = "/ui/";
    back.textContent = "All jobs";
    f.querySelector("td:last-child").appendChild(back);
    for (const id of ["charts", "spec", "log"]) document.getElementById(id).replaceChildren();
    jouleStats.missing = true;
    return;
  }
  document.getElementById("title").textContent =
      "Job " + j.id + (j.spec.name ? " (" + j.spec.name + ")" : "") + ": " + j.state;
  const f = document.getElementById("facts");
  f.textContent = "";
  fact(f, "state", j.state + (j.reason ? ": " + j.reason : ""));
  fact(f, "model", j.spec.model + " on " + j.spec.dataset + ", " + j.spec.workers + " " +
       j.spec.device_kind + " workers, global batch " + j.spec.global_batch_size);
  const p = j.progress, ended = jouleTerminal(j.state);
  if (j.state === "running") {
    fact(f, "progress", "epoch " + p.epoch + "/" + j.spec.epochs + ", step " + p.step + ", " +
         p.samples_per_second.toFixed(0) + " samples/s" +
         (p.transport ? ", synchronising over " + p.transport : "") +
         (p.phase !== "unspecified" ? "; now: " + p.phase : ""));
    const ranks = p.rank_power_watts || [];
    fact(f, "energy so far", jouleJoules(p.job_energy_joules) +
         (p.energy_estimated ? " (estimated)" : "") +
         (ranks.length ? ", " + p.job_power_watts.toFixed(1) + " W now" +
              (ranks.length > 1 ? " (" + ranks.map((w, r) => "rank " + r + " " + w.toFixed(1) +
                                                   " W").join(", ") + ")" : "")
          : ", rank 0 at " + p.power_watts.toFixed(1) + " W"));
  }
  if (ended) {
    const e = j.result.energy;
    fact(f, "energy", jouleJoules(p.job_energy_joules) + (e.estimated ? " (estimated)" : "") +
         (e.unreported_joules > 0 ? " (" + jouleJoules(e.unreported_joules) +
              " of it from progress: ranks not reported yet)" : "") + ", " +
         e.average_watts.toFixed(1) + " W average, " + e.device_hours.toFixed(6) + " device-hours, " +
         e.samples_per_joule.toFixed(1) + " samples/J");
    // Each rank's own energy (the last attempt's records; earlier attempts are in the total).
    const byRank = new Map();
    for (const rec of e.records || []) {
      byRank.set(rec.rank || 0, (byRank.get(rec.rank || 0) || 0) + (rec.joules || 0));
    }
    if (byRank.size) {
      fact(f, "energy by rank", [...byRank.entries()].sort((a, b) => a[0] - b[0])
           .map(([r, joules]) => "rank " + r + " " + jouleJoules(joules)).join(", "));
    }
    const last = (j.result.history || []).slice(-1)[0];
    if (last && (j.spec.dataset || "").startsWith("hdf5:")) {  // a regression: its RMSE
      fact(f, "test RMSE", Number(last.test_rmse).toPrecision(4));
    } else {
      fact(f, "test accuracy", j.result.test_accuracy > 0 ? j.result.test_accuracy.toFixed(4) : "-");
    }
    for (const t of j.result.to_accuracy || []) {
      fact(f, "to " + (t.metric || "test_accuracy") + (t.lower_is_better ? " <= " : " >= ") + t.target,
           t.reached ? Number(t.seconds || 0).toFixed(2) + " s, " + jouleJoules(t.joules || 0) +
               " (epoch " + t.epoch + ")" : "not reached");
    }
  }
  if (j.spec.carbon_aware) {  // issue 31: when it waits for, and what waiting saved
    const c = j.carbon_plan || {};
    const at = (ms) => new Date(Number(ms)).toISOString().replace("T", " ").slice(0, 16) + " UTC";
    fact(f, "carbon-aware start",
         (Number(c.planned_start_unix_ms || 0) > 0 ? "planned " + at(c.planned_start_unix_ms) : "") +
         (c.region ? " in region " + c.region : "") +
         (c.planned_gco2_per_kwh ? " (forecast " + c.planned_gco2_per_kwh.toFixed(0) +
              " g/kWh against " + (c.now_gco2_per_kwh || 0).toFixed(0) + " at submit)" : "") +
         (Number(c.latest_start_unix_ms || 0) > 0 ? ", by " + at(c.latest_start_unix_ms) +
              " at the latest" : "") +
         (c.note ? "; starts without waiting: " + c.note : ""));
  }
  if (j.carbon && j.carbon.source) {
    const c = j.carbon, grams = c.grams || 0, before = c.grams_at_submit || 0;
    fact(f, "CO2 at the grid's intensity", grams.toFixed(2) + " g (mean " +
         (c.mean_gco2_per_kwh || 0).toFixed(0) + " g/kWh of " + c.source + ")" +
         (before > 0 ? "; " + Math.abs(before - grams).toFixed(2) + " g " +
              (grams <= before ? "saved" : "more") + " against starting at submit" : ""));
  }
  if (j.spec.energy_budget_joules > 0) {
    fact(f, "energy budget", jouleJoules(j.spec.energy_budget_joules) + ": " +
         jouleJoules(p.job_energy_joules) + ", " + (100 * p.energy_budget_used).toFixed(1) +
         "% used");
  }
  const spec = document.getElementById("spec");
  spec.textContent = "";
  for (const [name, value] of specRows(j.spec, "", [])) fact(spec, name, value);
  if (j.created_time) {
    fact(f, "times", "submitted " + j.created_time.replace("T", " ").slice(0, 19) +
         (j.started_time ? ", started " + j.started_time.replace("T", " ").slice(0, 19) : "") +
         (j.finished_time ? ", ended " + j.finished_time.replace("T", " ").slice(0, 19) : "") +
         " (UTC), by " + (j.submitted_by || "anonymous"));
  }
  const o = j.spec.optimizer || {};
  if (j.spec.algorithm !== "ga") {
    fact(f, "optimizer", (o.name || "sgd") + " lr " + o.lr +
         (o.momentum ? " momentum " + o.momentum : "") + ", seed " + (j.spec.seed || 0));
  }
  jouleStats.state = j.state;
  await drawCharts();
  const log = await jouleGet("/api/jobs/" + jobId + "/log?after=" + logAfter);
  if (log) {
    const pre = document.getElementById("log");
    if (log.lines.length) {
      pre.append(log.lines.map(l => "[rank " + l.rank + "] " + l.text + "\n").join(""));
      jouleStats.logLines += log.lines.length;
      // The page keeps about the newest 400 kB (`joule logs` has every line).
      while (pre.childNodes.length > 1 && pre.textContent.length > 400000) pre.firstChild.remove();
    }
    logAfter = log.last_seq;
  }
  jouleStats.refreshes++;
  // An ended job's charts are its stored ones (drawn above); they change only while
  // ranks that were told to stop have still to report (for a minute at most: a lost
  // worker's rank never does).
  if (ended && endedAt < 0) endedAt = jouleStats.refreshes;
  const waiting = ended && j.result.energy.ranks_reported < j.result.energy.ranks_expected &&
      jouleStats.refreshes - endedAt < 40;
  return !(ended && jouleStats.refreshes > 2 && !waiting);
});
</script></body></html>
)UI";

constexpr char kWorkersPage[] = R"UI(<h1>Workers</h1>
<table id="workers"><thead><tr><th>worker</th><th>state</th><th>kind</th><th>host</th>
<th class="num">cores</th><th>job</th><th class="num">its rank's energy so far</th>
<th class="num">the job's energy so far</th>
<th>energy source</th><th>BLAS</th></tr></thead><tbody></tbody></table>
<script>
jouleEvery(2000, async () => {
  const d = await jouleGet("/api/workers");
  if (!d) return;
  const body = document.querySelector("#workers tbody");
  body.textContent = "";
  for (const w of d.workers) {
    const row = document.createElement("tr");
    jouleCell(row, w.worker_id);
    jouleCell(row, w.state);
    jouleCell(row, w.device_kind);
    jouleCell(row, w.host);
    jouleCell(row, w.cores, "num");
    const job = jouleCell(row, w.state === "busy" ? "" : "-");
    if (w.state === "busy") {
      const a = document.createElement("a");
      a.href = "/ui/job?id=" + w.job_id;
      a.textContent = "job " + w.job_id;
      job.appendChild(a);
      job.appendChild(document.createTextNode(", rank " + w.rank));
    }
    jouleCell(row, w.state === "busy" ? jouleJoules(w.rank_energy_joules) : "-", "num");
    jouleCell(row, w.state === "busy" ? jouleJoules(w.job_energy_joules) : "-", "num");
    const src = w.energy_sources.join(", ");
    jouleCell(row, src, src.includes("estimated") ? "estimated" : "");
    const b = w.blas || {};
    jouleCell(row, b.library ? b.library + (b.core ? " " + b.core : "") +
              (b.fallback ? " (fallback)" : "") : "-", b.fallback ? "estimated" : "");
    body.appendChild(row);
  }
  jouleStats.workers = d.workers.length;
  jouleStats.refreshes++;
});
</script></body></html>
)UI";

constexpr char kLoginPage[] = R"UI(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Joule: sign in</title>
<link rel="stylesheet" href="/ui/assets/joule.css"></head><body>
<h1>Joule</h1>
<p>This coordinator needs a client token (the one `joule` uses: --token-file or JOULE_TOKEN).</p>
<form method="post" action="/ui/login"><input type="hidden" name="csrf" value="@CSRF@">
<input type="password" name="token" size="40"
autocomplete="current-password"> <button type="submit">Sign in</button></form>
)UI";

// The sign-in page with a fresh CSRF value, in its form and in its cookie.
Response LoginPage(const std::string& note = "", int status = 200) {
  const std::string csrf = RandomHex();
  if (csrf.empty()) return Html("no random bytes for a sign-in form", 503);
  Response r = Html(absl::StrCat(absl::StrReplaceAll(kLoginPage, {{"@CSRF@", csrf}}), note,
                                 "</body></html>\n"),
                    status);
  r.headers.push_back({"Set-Cookie", absl::StrCat(kLoginCookie, "=", csrf,
                                                  "; Path=/ui/login; HttpOnly; SameSite=Strict")});
  return r;
}

// The job without what the list does not show (per-rank results, records, series).
v1::Job Trimmed(const v1::Job& job) {
  v1::Job j = job;
  v1::JobResult* r = j.mutable_result();
  r->clear_ranks();
  r->clear_history();
  r->mutable_energy()->clear_records();
  for (v1::AttemptSummary& a : *r->mutable_attempts()) {
    a.clear_energy();
    a.clear_history();
    a.clear_power();
  }
  return j;
}

// Whether a request lacks what the UI asks of it (see web_ui.h): the refusal, or nothing.
using web_ui::Refusal;

// The pages, their assets and the sign-in.
void InstallPages(HttpServer& http, Coordinator* c, const Refusal& refused,
                  std::shared_ptr<Sessions> sessions,
                  const std::map<std::string, std::string>& tokens) {
  // Each page's script is served as a file (the CSP allows no inline script).
  auto page = [&http, refused](const char* body, const char* name) {
    auto [html, script] = SplitPageScript(body, name);
    http.ServeRequest(absl::StrCat("/ui/assets/page-", name, ".js"),
                      [script = std::move(script)](const Request&) {
                        return Asset(script, "text/javascript; charset=utf-8");
                      });
    return [refused, html = absl::StrCat(kPageHead, html)](const Request& r) {
      if (auto no = refused(r, false)) return *no;
      Response page = Html(html);
      // The double-submit value the pages' POSTs carry (joulePost); readable by the
      // page's script, sent by the browser only to this site (SameSite=Strict).
      if (!Hex32(CookieOf(r, kCsrfCookie))) {
        if (const std::string csrf = RandomHex(); !csrf.empty()) {
          page.headers.push_back(
              {"Set-Cookie", absl::StrCat(kCsrfCookie, "=", csrf, "; Path=/; SameSite=Strict")});
        }
      }
      return page;
    };
  };
  http.ServeRequest("/ui", [](const Request&) {
    Response r;
    r.status = 302;
    r.headers.push_back({"Location", "/ui/"});
    return r;
  });
  http.ServeRequest("/ui/", page(kJobsPage, "jobs"));
  // A job that does not exist is a page of its own, 404, not an empty job page.
  http.ServeRequest("/ui/job", [c, refused, job_page = page(kJobPage, "job")](const Request& r) {
    if (auto no = refused(r, false)) return *no;
    auto id_param = r.params.find("id");
    int64_t id = 0;
    const bool numeric = id_param != r.params.end() && id_param->second.size() <= 18 &&
                         absl::SimpleAtoi(id_param->second, &id) && id > 0;
    if (numeric) {
      absl::StatusOr<v1::Job> job = c->GetJob(id);
      if (job.ok() || job.status().code() != absl::StatusCode::kNotFound) return job_page(r);
    }
    const std::string name = numeric ? absl::StrCat("job ", id) : "such job";
    return Html(absl::StrCat(kPageHead, "<h1 id=\"title\">No ", name, "</h1><p>",
                             numeric ? "It" : "The address names no job: it",
                             " is not in this coordinator's job store. <a href=\"/ui/\">All "
                             "jobs</a>.</p></body></html>"),
                404);
  });
  http.ServeRequest("/ui/workers", page(kWorkersPage, "workers"));
  web_ui::InstallAnalysisPages(http, c, refused, page);
  http.ServeRequest("/ui/assets/joule.js",
                    [](const Request&) { return Asset(kJs, "text/javascript; charset=utf-8"); });
  http.ServeRequest("/ui/assets/joule.css",
                    [](const Request&) { return Asset(kCss, "text/css; charset=utf-8"); });
  http.ServeRequest("/ui/assets/vega.js", [](const Request&) {
    return Asset(assets::VegaJs(), "text/javascript; charset=utf-8");
  });
  http.ServeRequest("/ui/assets/vega-lite.js", [](const Request&) {
    return Asset(assets::VegaLiteJs(), "text/javascript; charset=utf-8");
  });
  http.ServeRequest("/ui/assets/vega-embed.js", [](const Request&) {
    return Asset(assets::VegaEmbedJs(), "text/javascript; charset=utf-8");
  });
  http.ServeRequest(
      "/ui/login",
      [tokens, sessions](const Request& r) {
        if (r.method != "POST") return LoginPage();
        if (const std::string why = LoginForgery(r); !why.empty()) {
          return LoginPage(absl::StrCat("<p class=\"error\">", why, ".</p>"), 403);
        }
        auto t = r.params.find("token");
        const std::string token = t == r.params.end() ? "" : t->second;
        absl::StatusOr<std::string> client = AuthenticateToken(token, tokens);
        if (token.empty() || tokens.empty() || !client.ok()) {
          return LoginPage("<p class=\"error\">That token is not accepted.</p>", 401);
        }
        const std::string id = sessions->Open(*client);
        if (id.empty()) return Html("no random bytes for a session", 503);
        Response ok;
        ok.status = 303;
        ok.headers.push_back({"Location", "/ui/"});
        ok.headers.push_back({"Set-Cookie", absl::StrCat(kCookie, "=", id,
                                                         "; Path=/; HttpOnly; SameSite=Strict")});
        return ok;
      },
      /*post=*/true);
}

// The client a request acts for (its token's or its session's name; "anonymous" where the
// UI needs no token).
using Who = std::function<std::string(const Request&)>;

// Why a state-changing request is not the UI's own, or "": it must be a POST whose
// X-Joule-CSRF header equals its joule_csrf cookie (double submit: another site can make
// the browser post, but cannot read the cookie or, without CORS, set the header), and a
// browser's Origin, when sent, must be this server.
std::string ApiForgery(const Request& r) {
  if (r.method != "POST") return "use POST";
  if (auto o = r.headers.find("origin"); o != r.headers.end()) {
    auto h = r.headers.find("host");
    const std::string host = h == r.headers.end() ? "" : h->second;
    if (o->second != "http://" + host && o->second != "https://" + host) {
      return "a request from another site";
    }
  }
  auto field = r.headers.find("x-joule-csrf");
  const std::string cookie = CookieOf(r, kCsrfCookie);
  if (field == r.headers.end() || !Hex32(field->second) || field->second != cookie) {
    return "the page's CSRF value is missing or stale: reload the page";
  }
  return "";
}

// The JSON API the pages read.
void InstallApi(HttpServer& http, Coordinator* c, const Refusal& refused, const Who& who) {
  http.ServeRequest("/api/jobs", [c, refused](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    v1::ListJobsRequest req;
    int limit = 100;
    if (auto l = r.params.find("limit"); l != r.params.end()) {
      if (!absl::SimpleAtoi(l->second, &limit) || limit < 1 || limit > 1000) {
        return Json({{"error", "limit is not in [1, 1000]"}}, 400);
      }
    }
    const auto param = [&r](const char* name) {
      auto it = r.params.find(name);
      return it == r.params.end() ? std::string() : it->second;
    };
    // Filters: state (comma-separated), label KEY=VALUE and the page (before) by the
    // store's indexes; user and q (a substring of the name or model) on the pages read.
    for (absl::string_view name : absl::StrSplit(param("state"), ',', absl::SkipEmpty())) {
      absl::StatusOr<v1::JobState> st = ParseJobState(std::string(name));
      if (!st.ok()) return Json({{"error", std::string(st.status().message())}}, 400);
      req.add_states(*st);
    }
    if (const std::string label = param("label"); !label.empty()) {
      const size_t eq = label.find('=');
      if (eq == std::string::npos || eq == 0) {
        return Json({{"error", "label is not KEY=VALUE"}}, 400);
      }
      (*req.mutable_labels())[label.substr(0, eq)] = label.substr(eq + 1);
    }
    int64_t before = 0;
    if (const std::string b = param("before"); !b.empty() && !absl::SimpleAtoi(b, &before)) {
      return Json({{"error", "before is not a number"}}, 400);
    }
    const std::string user = param("user"), text = absl::AsciiStrToLower(param("q"));
    const auto wanted = [&](const v1::Job& j) {
      if (!user.empty() && j.submitted_by() != user) return false;
      if (text.empty()) return true;
      return absl::StrContains(absl::AsciiStrToLower(j.spec().name()), text) ||
             absl::StrContains(absl::AsciiStrToLower(j.spec().model()), text);
    };
    req.set_page_size(limit);
    req.set_before_id(before);
    json out = {{"jobs", json::array()}, {"next_before_id", 0}};
    // At most 20 pages read for one answer: a rare user or text goes on with `before`.
    for (int pages = 0; pages < 20; ++pages) {
      absl::StatusOr<v1::ListJobsResponse> jobs = c->ListJobs(req);
      if (!jobs.ok()) return Json({{"error", std::string(jobs.status().message())}}, 503);
      int64_t last = 0;
      for (const v1::Job& j : jobs->jobs()) {
        if (out["jobs"].size() >= static_cast<size_t>(limit)) break;
        last = j.id();
        if (wanted(j)) out["jobs"].push_back(ProtoToJson(Trimmed(j)));
      }
      const bool full = out["jobs"].size() >= static_cast<size_t>(limit);
      if (full) {
        out["next_before_id"] = last;  // the jobs after the last one read
        break;
      }
      out["next_before_id"] = jobs->next_before_id();
      if (jobs->next_before_id() <= 0) break;
      req.set_before_id(jobs->next_before_id());
    }
    return Json(out);
  });
  // The job id of the path; 0 (no job has it) when it is not a positive number.
  const auto job_id = [](const Request& r) -> int64_t {
    int64_t id = 0;
    if (r.matches.empty() || !absl::SimpleAtoi(r.matches[0], &id) || id <= 0) return 0;
    return id;
  };
  const auto not_found = [](const absl::Status& s) {
    return Json({{"error", std::string(s.message())}},
                s.code() == absl::StatusCode::kNotFound ? 404 : 503);
  };
  http.ServeRequest("/api/jobs/(\\d{1,18})", [c, refused, job_id, not_found](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    absl::StatusOr<v1::Job> job = c->GetJob(job_id(r));
    if (!job.ok()) return not_found(job.status());
    v1::Job j = *job;
    j.mutable_result()->clear_ranks();
    return Json(ProtoToJson(j));
  });
  http.ServeRequest("/api/jobs/(\\d{1,18})/power",
                    [c, refused, job_id, not_found](const Request& r) {
                      if (auto no = refused(r, true)) return *no;
                      const int64_t id = job_id(r);
                      absl::StatusOr<std::vector<v1::RankPower>> power = c->JobPower(id);
                      if (!power.ok()) return not_found(power.status());
                      absl::StatusOr<v1::Job> job = c->GetJob(id);
                      if (!job.ok()) return not_found(job.status());
                      json out = {{"ranks", json::array()},
                                  {"estimated", job->progress().energy_estimated() ||
                                                    job->result().energy().estimated()}};
                      for (const v1::RankPower& rp : *power) out["ranks"].push_back(ProtoToJson(rp));
                      return Json(out);
                    });
  // The job's charts (common/job_charts.h), the HTML report's: a running attempt's power
  // is the live one.
  http.ServeRequest("/api/jobs/(\\d{1,18})/charts",
                    [c, refused, job_id, not_found](const Request& r) {
                      if (auto no = refused(r, true)) return *no;
                      const int64_t id = job_id(r);
                      absl::StatusOr<v1::Job> job = c->GetJob(id);
                      if (!job.ok()) return not_found(job.status());
                      std::optional<std::vector<v1::RankPower>> live;
                      if (job->state() == v1::JOB_STATE_RUNNING) {
                        absl::StatusOr<std::vector<v1::RankPower>> power = c->JobPower(id);
                        if (!power.ok()) return not_found(power.status());
                        live = *std::move(power);
                      }
                      return Json(ChartsJson(
                          JobCharts(*job, live ? &*live : nullptr, /*with_empty=*/true)));
                    });
  http.ServeRequest("/api/jobs/(\\d{1,18})/log", [c, refused, job_id, not_found](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    v1::GetJobLogRequest req;
    req.set_job_id(job_id(r));
    req.set_rank(-1);
    int64_t after = 0;
    if (auto a = r.params.find("after"); a != r.params.end()) {
      if (!absl::SimpleAtoi(a->second, &after)) return Json({{"error", "after is not a number"}}, 400);
    }
    req.set_after_seq(after);
    absl::StatusOr<v1::GetJobLogResponse> log = c->GetJobLog(req);
    if (!log.ok()) {
      if (log.status().code() == absl::StatusCode::kInvalidArgument) {
        return Json({{"error", std::string(log.status().message())}}, 400);
      }
      return not_found(log.status());
    }
    return Json(ProtoToJson(*log));
  });
  // Cancels a pending or running job: the CLI's `joule cancel`, with its rule (a client
  // cancels its own jobs; "anonymous", any).
  http.ServeRequest(
      "/api/jobs/(\\d{1,18})/cancel",
      [c, refused, who, job_id](const Request& r) {
        if (auto no = refused(r, true)) return *no;
        if (const std::string forged = ApiForgery(r); !forged.empty()) {
          return Json({{"error", forged}}, r.method == "POST" ? 403 : 405);
        }
        absl::StatusOr<v1::Job> job = c->CancelJob(job_id(r), who(r));
        if (!job.ok()) {
          const absl::StatusCode code = job.status().code();
          const int http = code == absl::StatusCode::kNotFound             ? 404
                           : code == absl::StatusCode::kPermissionDenied   ? 403
                           : code == absl::StatusCode::kFailedPrecondition ? 409
                                                                           : 503;
          return Json({{"error", std::string(job.status().message())}}, http);
        }
        return Json({{"id", job->id()}, {"state", JobStateName(job->state())}});
      },
      /*post=*/true);
  http.ServeRequest("/api/workers", [c, refused](const Request& r) {
    if (auto no = refused(r, true)) return *no;
    json out = {{"workers", json::array()}};
    for (const v1::WorkerInfo& w : c->ListWorkers()) out["workers"].push_back(ProtoToJson(w));
    return Json(out);
  });
}

}  // namespace

void InstallWebUi(HttpServer& http, Coordinator* c, std::map<std::string, std::string> tokens) {
  auto sessions = std::make_shared<Sessions>();
  const Refusal refused = [tokens, sessions](const Request& r,
                                             bool api) -> std::optional<Response> {
    if (tokens.empty() ? LoopbackHost(r)
                       : AuthenticateToken(TokenOf(r), tokens).ok() || sessions->Valid(SessionOf(r))) {
      return std::nullopt;
    }
    if (api) return Json({{"error", "a client token is required (Authorization: Bearer)"}}, 401);
    return Html(absl::StrCat("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                             "<title>Joule</title></head><body><p>A client token is needed: "
                             "<a href=\"/ui/login\">sign in</a>.</p></body></html>"),
                401);
  };
  const Who who = [tokens, sessions](const Request& r) -> std::string {
    if (tokens.empty()) return "anonymous";
    if (absl::StatusOr<std::string> client = AuthenticateToken(TokenOf(r), tokens); client.ok()) {
      return *client;
    }
    return sessions->ClientOf(SessionOf(r)).value_or("");
  };
  InstallPages(http, c, refused, sessions, tokens);
  InstallApi(http, c, refused, who);
}

}  // namespace joule::server
