#include "server/usage.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/names.h"
#include "common/text.h"

namespace joule::server {
namespace {

constexpr char kLabelPrefix[] = "label:";

double Finite(double x) { return std::isfinite(x) && x > 0 ? x : 0; }

void AddTo(v1::UsageGroup& g, const v1::Job& job, double gco2_per_kwh) {
  const v1::EnergyReport& e = job.result().energy();
  double device_hours = Finite(e.device_hours());
  if (device_hours == 0) {
    device_hours =
        Finite(job.progress().elapsed_seconds()) * std::max(1, job.spec().workers()) / 3600.0;
  }
  // The figure `joule list` and the web UI give: the report's once ended, the job's so
  // far while it runs.
  const double joules =
      Finite(IsTerminal(job.state()) ? e.total_joules() : job.progress().job_energy_joules());
  g.set_jobs(g.jobs() + 1);
  ++(*g.mutable_jobs_by_state())[JobStateName(job.state())];
  g.set_device_hours(g.device_hours() + device_hours);
  g.set_joules(g.joules() + joules);
  double recorded = 0;
  for (const v1::EnergyRecord& r : e.records()) {
    const double j = Finite(r.joules());
    (*g.mutable_joules_by_source())[r.source()] += j;
    recorded += j;
    if (r.source() == "estimated") g.set_estimated_joules(g.estimated_joules() + j);
  }
  // What the records do not hold: earlier attempts' energy, or a running job's so far.
  if (joules > recorded * (1 + 1e-9)) {
    (*g.mutable_joules_by_source())["unreported"] += joules - recorded;
  }
  g.set_kwh(g.joules() / 3.6e6);
  g.set_co2_grams(g.kwh() * gco2_per_kwh);
  if (const v1::CarbonAccount& c = job.carbon(); !c.source().empty()) {
    g.set_co2_grid_grams(g.co2_grid_grams() + Finite(c.grams()));
    g.set_grid_covered_kwh(g.grid_covered_kwh() + Finite(c.joules_covered()) / 3.6e6);
    if (job.spec().carbon_aware() && c.grams_at_submit() > 0 &&
        std::isfinite(c.grams_at_submit()) && std::isfinite(c.grams())) {
      g.set_co2_saved_grams(g.co2_saved_grams() + c.grams_at_submit() - c.grams());
    }
  }
  g.set_samples(g.samples() + std::max<int64_t>(0, job.result().samples()));
}

}  // namespace

absl::Status UsageTally::Validate(const v1::UsageRequest& request) {
  const std::string& by = request.group_by();
  static const char* const kKinds[] = {"", "user", "sweep", "model", "device_kind", "day", "week"};
  bool known = false;
  for (const char* k : kKinds) known |= by == k;
  if (absl::StartsWith(by, kLabelPrefix)) {
    const size_t key = by.size() - (sizeof(kLabelPrefix) - 1);
    if (key == 0 || key > 63) {
      return absl::InvalidArgumentError("group by label:KEY needs a key of 1 to 63 bytes");
    }
    known = true;
  }
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot group by \"", SanitizeUtf8(by, 64),
                     "\": one of user, label:KEY, sweep, model, device_kind, day, week"));
  }
  if (request.period() != "" && request.period() != "day" && request.period() != "week") {
    return absl::InvalidArgumentError(absl::StrCat(
        "usage: period \"", SanitizeUtf8(request.period(), 64), "\" is not day or week"));
  }
  for (int st : request.states()) {
    if (!v1::JobState_IsValid(st) || st == v1::JOB_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("no job state has the value ", st));
    }
  }
  if (request.since_unix_ms() < 0 || request.until_unix_ms() < 0) {
    return absl::InvalidArgumentError("usage: since and until must be after 1970-01-01");
  }
  if (request.since_unix_ms() > 0 && request.until_unix_ms() > 0 &&
      request.until_unix_ms() <= request.since_unix_ms()) {
    return absl::InvalidArgumentError("usage: until must be after since");
  }
  return absl::OkStatus();
}

UsageTally::UsageTally(v1::UsageRequest request, double gco2_per_kwh)
    : request_(std::move(request)), gco2_per_kwh_(gco2_per_kwh) {}

bool UsageTally::Wants(const v1::Job& job) const {
  const int64_t t = job.created_unix_ms();
  if (request_.since_unix_ms() > 0 && t < request_.since_unix_ms()) return false;
  if (request_.until_unix_ms() > 0 && t >= request_.until_unix_ms()) return false;
  if (request_.states_size() == 0) return true;
  for (int st : request_.states()) {
    if (st == job.state()) return true;
  }
  return false;
}

std::string UsageTally::KeyOf(const v1::Job& job, const std::string& group_by) {
  const auto label = [&](const std::string& key) {
    auto it = job.spec().labels().find(key);
    return it == job.spec().labels().end() ? std::string() : it->second;
  };
  if (group_by.empty()) return "";
  if (group_by == "user") return job.submitted_by();
  if (group_by == "sweep") return label("sweep");
  if (group_by == "model") return job.spec().model();
  if (group_by == "device_kind") {
    return job.spec().device_kind() == v1::DEVICE_KIND_GPU ? "gpu" : "cpu";
  }
  if (group_by == "day" || group_by == "week") {
    absl::Time t = absl::FromUnixMillis(job.created_unix_ms());
    if (group_by == "week") {
      const absl::CivilDay day = absl::ToCivilDay(t, absl::UTCTimeZone());
      const int back =
          (static_cast<int>(absl::GetWeekday(day)) + 7 - static_cast<int>(absl::Weekday::monday)) %
          7;
      return absl::FormatCivilTime(day - back);
    }
    return absl::FormatCivilTime(absl::ToCivilDay(t, absl::UTCTimeZone()));
  }
  return label(group_by.substr(sizeof(kLabelPrefix) - 1));
}

namespace {

// The group `key` of `groups`, made when there is room for it (cells counts every
// group and period held, up to `max`); null when there is none.
v1::UsageGroup* UsageCell(std::map<std::string, v1::UsageGroup>& groups, const std::string& key,
                          size_t& cells, size_t max) {
  auto it = groups.find(key);
  if (it == groups.end()) {
    if (cells >= max) return nullptr;
    ++cells;
    it = groups.emplace(key, v1::UsageGroup()).first;
    it->second.set_key(key);
  }
  return &it->second;
}

}  // namespace

void UsageTally::Add(const v1::Job& job) {
  ++scanned_;
  if (!Wants(job)) return;
  AddTo(total_, job, gco2_per_kwh_);
  const std::string period = request_.period().empty() ? "" : KeyOf(job, request_.period());
  if (!period.empty()) {
    if (v1::UsageGroup* p = UsageCell(periods_[""], period, cells_, kMaxGroups)) {
      AddTo(*p, job, gco2_per_kwh_);
    } else {
      truncated_ = true;
    }
  }
  if (request_.group_by().empty()) return;
  // As stored (the coordinator took only valid UTF-8: a sweep's key names it exactly, for
  // the web UI's link to it); anything else made printable.
  std::string key = KeyOf(job, request_.group_by());
  if (!IsValidUtf8(key) || key.size() > 4096) key = SanitizeUtf8(key, 256);
  v1::UsageGroup* g = UsageCell(groups_, key, cells_, kMaxGroups);
  if (g == nullptr) {
    truncated_ = true;
    return;
  }
  AddTo(*g, job, gco2_per_kwh_);
  if (period.empty()) return;
  // A group's periods live under its key prefixed with "g" (the total's under "").
  if (v1::UsageGroup* p = UsageCell(periods_["g" + key], period, cells_, kMaxGroups)) {
    AddTo(*p, job, gco2_per_kwh_);
  } else {
    truncated_ = true;
  }
}

v1::UsageResponse UsageTally::Finish() {
  v1::UsageResponse out;
  const auto add_periods = [&](v1::UsageGroup& g, const std::string& slot) {
    auto it = periods_.find(slot);
    if (it == periods_.end()) return;
    for (auto& [key, p] : it->second) *g.add_periods() = std::move(p);
  };
  for (auto& [key, g] : groups_) {
    add_periods(g, "g" + key);
    *out.add_groups() = std::move(g);
  }
  groups_.clear();
  total_.set_key("total");
  add_periods(total_, "");
  periods_.clear();
  *out.mutable_total() = total_;
  out.set_grid_gco2_per_kwh(gco2_per_kwh_);
  out.set_jobs_scanned(scanned_);
  out.set_truncated(truncated_);
  return out;
}

std::vector<Chart> UsageCharts(const v1::UsageResponse& usage, const std::string& group_by) {
  using nlohmann::json;
  const double largest = usage.total().joules();
  // The unit in which the total reads as 1 to 9999 (or more kWh).
  const auto unit = [&]() -> std::pair<const char*, double> {
    if (largest >= 3.6e6) return {"kWh", 3.6e6};
    if (largest >= 1e6) return {"MJ", 1e6};
    if (largest >= 1e4) return {"kJ", 1e3};
    return {"J", 1};
  }();
  const std::string energy_title = absl::StrCat("energy (", unit.first, ")");
  const auto label = [](const std::string& key) { return key.empty() ? "(none)" : key; };
  std::vector<Chart> charts;
  // The kChartGroups largest groups by energy are drawn; the rest are one group, "other".
  constexpr size_t kChartGroups = 20;
  std::vector<const v1::UsageGroup*> by_energy;
  for (const v1::UsageGroup& g : usage.groups()) by_energy.push_back(&g);
  std::stable_sort(by_energy.begin(), by_energy.end(),
                   [](const auto* a, const auto* b) { return a->joules() > b->joules(); });
  std::set<const v1::UsageGroup*> drawn(
      by_energy.begin(), by_energy.begin() + std::min(by_energy.size(), kChartGroups));
  const std::string other = absl::StrCat("other (", by_energy.size() - drawn.size(), " groups)");
  v1::UsageGroup rest;
  for (const v1::UsageGroup* g : by_energy) {
    if (drawn.count(g) > 0) continue;
    rest.set_jobs(rest.jobs() + g->jobs());
    rest.set_joules(rest.joules() + g->joules());
    rest.set_estimated_joules(rest.estimated_joules() + g->estimated_joules());
  }
  json bars = json::array();
  for (const v1::UsageGroup& g : usage.groups()) {
    if (drawn.count(&g) == 0) continue;
    bars.push_back({{"group", label(g.key())},
                    {"energy", g.joules() / unit.second},
                    {"estimated_share", g.joules() > 0 ? g.estimated_joules() / g.joules() : 0.0},
                    {"jobs", g.jobs()}});
  }
  if (rest.jobs() > 0) {
    bars.push_back(
        {{"group", other},
         {"energy", rest.joules() / unit.second},
         {"estimated_share", rest.joules() > 0 ? rest.estimated_joules() / rest.joules() : 0.0},
         {"jobs", rest.jobs()}});
  }
  if (!bars.empty()) {
    json spec = ChartSpec(bars);
    spec["height"] = std::min<int>(600, std::max<int>(120, 22 * static_cast<int>(bars.size())));
    spec["mark"] = "bar";
    spec["encoding"] = {
        {"y", {{"field", "group"}, {"type", "nominal"}, {"title", group_by}, {"sort", "-x"}}},
        {"x", ChartAxis("energy", "quantitative", energy_title)},
        {"tooltip", json::array({ChartAxis("group", "nominal", group_by),
                                 ChartAxis("energy", "quantitative", energy_title),
                                 ChartAxis("jobs", "quantitative", "jobs"),
                                 {{"field", "estimated_share"},
                                  {"type", "quantitative"},
                                  {"title", "estimated share"},
                                  {"format", ".0%"}}})}};
    charts.push_back({"energy-by-group", absl::StrCat("Energy by ", group_by),
                      "Each group's energy over the jobs selected", spec});
  }
  json stacked = json::array();
  const auto add_periods = [&](const v1::UsageGroup& g, const std::string& group) {
    for (const v1::UsageGroup& p : g.periods()) {
      stacked.push_back({{"period", p.key()},
                         {"group", group},
                         {"energy", p.joules() / unit.second},
                         {"jobs", p.jobs()}});
    }
  };
  if (usage.groups_size() > 0) {
    for (const v1::UsageGroup& g : usage.groups()) {
      add_periods(g, drawn.count(&g) > 0 ? label(g.key()) : other);
    }
  } else {
    add_periods(usage.total(), "all jobs");
  }
  if (!stacked.empty()) {
    json spec = ChartSpec(stacked);
    spec["mark"] = "bar";
    spec["encoding"] = {
        {"x", {{"field", "period"}, {"type", "ordinal"}, {"title", "period (UTC, first day)"}}},
        {"y", ChartAxis("energy", "quantitative", energy_title)},
        {"color", ChartAxis("group", "nominal", group_by.empty() ? "" : group_by)},
        {"tooltip", json::array({ChartAxis("period", "ordinal", "period"),
                                 ChartAxis("group", "nominal", "group"),
                                 ChartAxis("energy", "quantitative", energy_title),
                                 ChartAxis("jobs", "quantitative", "jobs")})}};
    charts.push_back({"energy-over-time", "Energy over time",
                      "Energy of the jobs created in each period, stacked by group", spec});
  }
  return charts;
}

}  // namespace joule::server
