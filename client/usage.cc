// `joule usage`: energy accounting over the coordinator's jobs, like Slurm's sreport.
#include <iostream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/job_client.h"
#include "common/json_output.h"
#include "common/names.h"
#include "common/text.h"

namespace joule::client {

absl::StatusOr<int64_t> ParseUsageTime(const std::string& text, absl::Time now) {
  const std::string t(absl::StripAsciiWhitespace(text));
  // A span back from now: 30m, 12h, 7d, 2w.
  if (t.size() >= 2 && std::string("mhdw").find(t.back()) != std::string::npos) {
    int64_t n = 0;
    if (absl::SimpleAtoi(t.substr(0, t.size() - 1), &n) && n >= 0 && n <= 100000) {
      const absl::Duration unit = t.back() == 'm'   ? absl::Minutes(1)
                                  : t.back() == 'h' ? absl::Hours(1)
                                  : t.back() == 'd' ? absl::Hours(24)
                                                    : absl::Hours(24 * 7);
      return absl::ToUnixMillis(now - n * unit);
    }
  }
  absl::Time parsed;
  std::string err;
  for (const char* format : {absl::RFC3339_full, "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S",
                             "%Y-%m-%d %H:%M", "%Y-%m-%d"}) {
    if (absl::ParseTime(format, t, absl::UTCTimeZone(), &parsed, &err)) {
      if (parsed <= absl::UnixEpoch()) break;  // 0 means "unbounded" in UsageRequest
      return absl::ToUnixMillis(parsed);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", SanitizeUtf8(t, 64),
                   "\" is not a time: YYYY-MM-DD[THH:MM:SS[Z|+HH:MM]] (UTC unless given) "
                   "or a span back from now (30m, 12h, 7d, 2w)"));
}

std::string UsageTable(const v1::UsageResponse& r, const std::string& by) {
  // The grid's CO2 columns where some job has a figure at the grid's intensity.
  const bool grid = r.total().grid_covered_kwh() > 0;
  const auto grid_cells = [grid](const v1::UsageGroup& g) {
    if (!grid) return std::string();
    return absl::StrFormat(" %10.2f %10.2f", g.co2_grid_grams(), g.co2_saved_grams());
  };
  std::string out = absl::StrFormat(
      "%-24s %6s %12s %14s %10s %6s %10s%s %10s  %s\n", by.empty() ? "" : absl::AsciiStrToUpper(by),
      "JOBS", "DEVICE-H", "ENERGY J", "kWh", "EST.%", "CO2 g",
      grid ? absl::StrFormat(" %10s %10s", "GRID CO2 g", "SAVED g") : "", "mJ/SAMPLE", "SOURCES");
  const auto row = [&](const v1::UsageGroup& g) {
    std::vector<std::pair<double, std::string>> sources;
    for (const auto& [source, joules] : g.joules_by_source()) sources.emplace_back(joules, source);
    std::sort(sources.rbegin(), sources.rend());
    std::vector<std::string> parts;
    for (const auto& [joules, source] : sources) {
      if (g.joules() > 0) {
        parts.push_back(absl::StrFormat("%s %.0f%%", source, 100 * joules / g.joules()));
      }
    }
    std::string key = g.key().empty() ? "(none)" : SanitizeUtf8(g.key(), 24);
    absl::StrAppendFormat(
        &out, "%-24s %6d %12.4f %14.1f %10.4f %6.1f %10.2f%s %10s  %s\n", key, g.jobs(),
        g.device_hours(), g.joules(), g.kwh(),
        g.joules() > 0 ? 100 * g.estimated_joules() / g.joules() : 0.0, g.co2_grams(),
        grid_cells(g),
        g.samples() > 0 ? absl::StrFormat("%.3f", 1000 * g.joules() / g.samples()) : "-",
        absl::StrJoin(parts, ", "));
  };
  // A group's periods (--per) under it, indented, then the group's own row.
  const auto with_periods = [&](const v1::UsageGroup& g) {
    row(g);
    for (v1::UsageGroup p : g.periods()) {
      p.set_key("  " + p.key());
      row(p);
    }
  };
  for (const v1::UsageGroup& g : r.groups()) with_periods(g);
  with_periods(r.total());
  absl::StrAppendFormat(
      &out, "(%d jobs read; CO2 at a constant %.0f g/kWh%s%s)\n", r.jobs_scanned(),
      r.grid_gco2_per_kwh(),
      grid ? absl::StrFormat("; GRID CO2 at the grid's intensity over the runs, for %.4f of "
                             "the %.4f kWh; SAVED: carbon-aware jobs against starting at submit",
                             r.total().grid_covered_kwh(), r.total().kwh())
           : "",
      r.truncated() ? "; more groups than shown: the total has them all" : "");
  return out;
}

std::string UsageCsv(const v1::UsageResponse& r) {
  std::set<std::string> sources;
  for (const auto& [s, j] : r.total().joules_by_source()) sources.insert(s);
  std::string out =
      "group,period,jobs,device_hours,joules,kwh,estimated_joules,co2_grams,samples,"
      "co2_grid_grams,grid_covered_kwh,co2_saved_grams";
  for (const std::string& s : sources) out += "," + CsvField("joules_" + s);
  out += "\n";
  // One line a group (period empty) and one a period of it (--per).
  const auto row = [&](const v1::UsageGroup& g, const std::string& key, const std::string& period) {
    absl::StrAppendFormat(&out, "%s,%s,%d,%.6f,%.3f,%.6f,%.3f,%.3f,%d,%.3f,%.6f,%.3f",
                          CsvField(key), CsvField(period), g.jobs(), g.device_hours(), g.joules(),
                          g.kwh(), g.estimated_joules(), g.co2_grams(), g.samples(),
                          g.co2_grid_grams(), g.grid_covered_kwh(), g.co2_saved_grams());
    for (const std::string& s : sources) {
      auto it = g.joules_by_source().find(s);
      absl::StrAppendFormat(&out, ",%.3f", it == g.joules_by_source().end() ? 0.0 : it->second);
    }
    out += "\n";
  };
  for (const v1::UsageGroup& g : r.groups()) {
    row(g, g.key(), "");
    for (const v1::UsageGroup& p : g.periods()) row(p, g.key(), p.key());
  }
  row(r.total(), "total", "");
  for (const v1::UsageGroup& p : r.total().periods()) row(p, "total", p.key());
  return out;
}

namespace {

struct UsageFlags {
  std::string by, since, until, states, per;
  std::string output = "table";
};

int Usage(const GlobalOptions& g, const UsageFlags& f) {
  v1::UsageRequest req;
  std::string by = f.by == "device-kind" ? "device_kind" : f.by;
  req.set_group_by(by);
  req.set_period(f.per);
  const absl::Time now = absl::Now();
  for (const auto& [flag, text, set] :
       {std::tuple{"--since", f.since, &v1::UsageRequest::set_since_unix_ms},
        std::tuple{"--until", f.until, &v1::UsageRequest::set_until_unix_ms}}) {
    if (text.empty()) continue;
    absl::StatusOr<int64_t> t = ParseUsageTime(text, now);
    if (!t.ok()) {
      std::cerr << "error: " << flag << ": " << t.status().message() << "\n";
      return kExitUsage;
    }
    (req.*set)(*t);
  }
  for (absl::string_view name : absl::StrSplit(f.states, ',', absl::SkipWhitespace())) {
    absl::StatusOr<v1::JobState> s = ParseJobState(std::string(absl::StripAsciiWhitespace(name)));
    if (!s.ok()) {
      std::cerr << "error: --state: " << s.status().message() << "\n";
      return kExitUsage;
    }
    req.add_states(*s);
  }
  JobClient client = JobClient::ForCoordinator(g);
  absl::StatusOr<v1::UsageResponse> r = client.Usage(req);
  if (!r.ok()) return client.Report("usage", r.status());
  if (f.output == "json") {
    std::cout << JsonText(ProtoToJson(*r));
  } else if (f.output == "csv") {
    std::cout << UsageCsv(*r);
  } else {
    std::cout << UsageTable(*r, by);
  }
  return kExitOk;
}

}  // namespace

void AddUsageCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<UsageFlags>();
  KeepAlive(f);
  CLI::App* cmd = app.add_subcommand(
      "usage", "energy accounting: jobs, device-hours, energy by source, kWh, CO2 per group");
  cmd->add_option("--by", f->by,
                  "group by user, label:KEY, sweep, model, device-kind, day or week (UTC); "
                  "default: the total only");
  cmd->add_option("--per", f->per,
                  "also each group's figures per day or week (UTC): energy over time")
      ->check(CLI::IsMember({"day", "week"}));
  cmd->add_option("--since", f->since,
                  "jobs created from this time: YYYY-MM-DD[THH:MM:SS[Z]] (UTC) or a span "
                  "back from now (30m, 12h, 7d, 2w)");
  cmd->add_option("--until", f->until, "jobs created before this time (the same forms)");
  cmd->add_option("--state", f->states,
                  "only these states, comma-separated (pending, running, succeeded, failed, "
                  "cancelled, budget_exceeded)");
  cmd->add_option("-o,--output", f->output, "table (default), csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}));
  cmd->callback([&g, f, rc] { *rc = Usage(g, *f); });
}

}  // namespace joule::client
