#include "common/carbon_intensity.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/text.h"
#include "nlohmann/json.hpp"

namespace joule {
namespace {

using json = nlohmann::json;

constexpr int64_t kHourMs = 3'600'000;

// common/text.h takes std::string_view; Debian's Abseil has its own string_view.
std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// Points by start as read (no duration yet where the format gives none: 0).
using Raw = std::map<int64_t, IntensityPoint>;

absl::Status Bad(absl::string_view format, const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("carbon intensity (", format, "): ", where, ": ", why));
}

absl::Status AddPoint(absl::string_view format, const std::string& where, int64_t unix_ms,
                      int64_t duration_ms, double value, Raw& raw) {
  if (!std::isfinite(value) || value < 0 || value > kMaxGco2PerKwh) {
    return Bad(format, where,
               absl::StrCat("intensity ", SanitizeUtf8(absl::StrCat(value), 32),
                            " g/kWh is not a number in [0, ", kMaxGco2PerKwh, "]"));
  }
  if (duration_ms < 0 || duration_ms > 366 * 24 * kHourMs) {
    return Bad(format, where, absl::StrCat("duration ", duration_ms, " ms is out of range"));
  }
  if (raw.size() >= kMaxIntensityPoints && raw.find(unix_ms) == raw.end()) {
    return Bad(format, where, absl::StrCat("more than ", kMaxIntensityPoints, " points"));
  }
  raw[unix_ms] = {unix_ms, duration_ms, value};
  return absl::OkStatus();
}

// A time in a JSON field: an RFC 3339 string.
absl::StatusOr<int64_t> JsonTime(absl::string_view format, const std::string& where,
                                 const json& v) {
  if (!v.is_string()) return Bad(format, where, "the time is not a string");
  std::optional<int64_t> ms = ParseRfc3339Ms(v.get_ref<const std::string&>());
  if (!ms) {
    return Bad(format, where,
               absl::StrCat("time \"", SanitizeUtf8(v.get_ref<const std::string&>(), 64),
                            "\" is not RFC 3339"));
  }
  return *ms;
}

absl::StatusOr<double> JsonNumber(absl::string_view format, const std::string& where, const json& v,
                                  absl::string_view field) {
  if (!v.is_number()) return Bad(format, where, absl::StrCat(field, " is not a number"));
  return v.get<double>();
}

// An array of {timestamp, duration (minutes), value}: the SDK's EmissionsData.
absl::Status ReadSdkData(const json& data, Raw& raw) {
  constexpr absl::string_view kFormat = "carbon-aware-sdk";
  if (!data.is_array()) return Bad(kFormat, "forecastData", "is not an array");
  for (size_t i = 0; i < data.size(); ++i) {
    const json& p = data[i];
    const std::string where = absl::StrCat("point ", i);
    if (!p.is_object() || !p.contains("timestamp") || !p.contains("value")) {
      return Bad(kFormat, where, "has no timestamp and value");
    }
    absl::StatusOr<int64_t> t = JsonTime(kFormat, where, p["timestamp"]);
    if (!t.ok()) return t.status();
    absl::StatusOr<double> v = JsonNumber(kFormat, where, p["value"], "value");
    if (!v.ok()) return v.status();
    double minutes = 0;
    if (p.contains("duration")) {
      absl::StatusOr<double> d = JsonNumber(kFormat, where, p["duration"], "duration");
      if (!d.ok()) return d.status();
      minutes = *d;
    }
    if (!std::isfinite(minutes) || minutes < 0) {
      return Bad(kFormat, where, "duration is not a number of minutes >= 0");
    }
    if (absl::Status s =
            AddPoint(kFormat, where, *t, std::llround(std::min(minutes, 1e9) * 60000), *v, raw);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadElectricityMaps(const json& list, Raw& raw) {
  constexpr absl::string_view kFormat = "electricitymaps";
  if (!list.is_array()) return Bad(kFormat, "forecast", "is not an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& p = list[i];
    const std::string where = absl::StrCat("point ", i);
    if (!p.is_object() || !p.contains("datetime") || !p.contains("carbonIntensity")) {
      return Bad(kFormat, where, "has no datetime and carbonIntensity");
    }
    if (p["carbonIntensity"].is_null()) continue;  // a gap in the history
    absl::StatusOr<int64_t> t = JsonTime(kFormat, where, p["datetime"]);
    if (!t.ok()) return t.status();
    absl::StatusOr<double> v = JsonNumber(kFormat, where, p["carbonIntensity"], "carbonIntensity");
    if (!v.ok()) return v.status();
    if (absl::Status s = AddPoint(kFormat, where, *t, 0, *v, raw); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReadWattTime(const json& doc, Raw& raw) {
  constexpr absl::string_view kFormat = "watttime";
  static const json kNone;
  const json& meta = doc.contains("meta") ? doc.at("meta") : kNone;
  std::string units = meta.is_object() && meta.contains("units") && meta["units"].is_string()
                          ? meta["units"].get<std::string>()
                          : "";
  double scale = 0;
  if (units == "lbs_co2_per_mwh") {
    scale = 0.453592;  // 453.592 g per lb, 1,000 kWh per MWh
  } else if (units == "g_co2_per_kwh" || units == "kg_co2_per_mwh") {
    scale = 1;
  } else {
    return Bad(kFormat, "meta.units",
               absl::StrCat("\"", SanitizeUtf8(units, 64),
                            "\" is not an emission rate (lbs_co2_per_mwh, g_co2_per_kwh or "
                            "kg_co2_per_mwh)"));
  }
  int64_t period_ms = 0;
  if (meta.contains("data_point_period_seconds") && meta["data_point_period_seconds"].is_number()) {
    const double s = meta["data_point_period_seconds"].get<double>();
    if (std::isfinite(s) && s > 0 && s < 366 * 24 * 3600.0) period_ms = std::llround(s * 1000);
  }
  const json& data = doc.at("data");
  for (size_t i = 0; i < data.size(); ++i) {
    const json& p = data[i];
    const std::string where = absl::StrCat("point ", i);
    if (!p.is_object() || !p.contains("point_time") || !p.contains("value")) {
      return Bad(kFormat, where, "has no point_time and value");
    }
    absl::StatusOr<int64_t> t = JsonTime(kFormat, where, p["point_time"]);
    if (!t.ok()) return t.status();
    absl::StatusOr<double> v = JsonNumber(kFormat, where, p["value"], "value");
    if (!v.ok()) return v.status();
    if (absl::Status s = AddPoint(kFormat, where, *t, period_ms, *v * scale, raw); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadNeso(const json& data, Raw& raw) {
  constexpr absl::string_view kFormat = "neso";
  for (size_t i = 0; i < data.size(); ++i) {
    const json& p = data[i];
    const std::string where = absl::StrCat("period ", i);
    if (!p.is_object() || !p.contains("from") || !p.contains("to") || !p.contains("intensity") ||
        !p.at("intensity").is_object()) {
      return Bad(kFormat, where, "has no from, to and intensity");
    }
    absl::StatusOr<int64_t> from = JsonTime(kFormat, where, p["from"]);
    if (!from.ok()) return from.status();
    absl::StatusOr<int64_t> to = JsonTime(kFormat, where, p["to"]);
    if (!to.ok()) return to.status();
    if (*to <= *from) return Bad(kFormat, where, "ends before it starts");
    static const json kNone;
    const json& in = p.at("intensity");
    const json& v = in.contains("actual") && !in.at("actual").is_null() ? in.at("actual")
                    : in.contains("forecast")                           ? in.at("forecast")
                                                                        : kNone;
    absl::StatusOr<double> value = JsonNumber(kFormat, where, v, "intensity");
    if (!value.ok()) return value.status();
    if (absl::Status s = AddPoint(kFormat, where, *from, *to - *from, *value, raw); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadJson(absl::string_view text, Raw& raw, std::string& format) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError("carbon intensity: the text is not valid JSON");
  }
  if (doc.is_array()) {
    format = "carbon-aware-sdk";
    if (doc.empty()) return Bad(format, "the array", "is empty");
    if (doc[0].is_object() && doc[0].contains("forecastData")) {
      return ReadSdkData(doc[0]["forecastData"], raw);
    }
    return ReadSdkData(doc, raw);
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        "carbon intensity: the JSON is neither an object nor an "
        "array");
  }
  if (doc.contains("forecast") || doc.contains("history")) {
    format = "electricitymaps";
    return ReadElectricityMaps(doc.contains("forecast") ? doc["forecast"] : doc["history"], raw);
  }
  if (doc.contains("data") && doc["data"].is_array()) {
    if (doc.contains("meta")) {
      format = "watttime";
      return ReadWattTime(doc, raw);
    }
    format = "neso";
    return ReadNeso(doc["data"], raw);
  }
  return absl::InvalidArgumentError(
      "carbon intensity: JSON of no known shape (a Carbon Aware SDK forecast array, "
      "Electricity Maps' {\"forecast\"}, WattTime's {\"meta\", \"data\"} or NESO's "
      "{\"data\": [{\"from\", \"to\", \"intensity\"}]})");
}

absl::Status ReadCsv(absl::string_view text, Raw& raw) {
  constexpr absl::string_view kFormat = "csv";
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  bool header = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view line = absl::StripAsciiWhitespace(lines[i]);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = absl::StrCat("line ", i + 1);
    std::vector<absl::string_view> cells = absl::StrSplit(line, ',');
    if (cells.size() != 2) {
      return Bad(kFormat, where, absl::StrCat(cells.size(), " columns, not 2 (time,gco2_per_kwh)"));
    }
    const absl::string_view time = absl::StripAsciiWhitespace(cells[0]);
    const absl::string_view value = absl::StripAsciiWhitespace(cells[1]);
    if (!header) {
      if (time != "time" || value != "gco2_per_kwh") {
        return Bad(kFormat, where, "the header is not `time,gco2_per_kwh`");
      }
      header = true;
      continue;
    }
    int64_t unix_ms = 0;
    int64_t seconds = 0;
    if (absl::SimpleAtoi(time, &seconds) && seconds >= 0 && seconds <= kMaxIntensityTimeMs / 1000) {
      unix_ms = seconds * 1000;
    } else if (std::optional<int64_t> ms = ParseRfc3339Ms(time)) {
      unix_ms = *ms;
    } else {
      return Bad(kFormat, where,
                 absl::StrCat("time \"", SanitizeUtf8(Std(time), 64),
                              "\" is neither RFC 3339 nor Unix seconds"));
    }
    double v = 0;
    if (!absl::SimpleAtod(value, &v)) {
      return Bad(kFormat, where,
                 absl::StrCat("\"", SanitizeUtf8(Std(value), 64), "\" is not a number"));
    }
    if (absl::Status s = AddPoint(kFormat, where, unix_ms, 0, v, raw); !s.ok()) return s;
  }
  if (!header) return Bad(kFormat, "the text", "has no header `time,gco2_per_kwh`");
  return absl::OkStatus();
}

}  // namespace

std::optional<int64_t> ParseRfc3339Ms(absl::string_view text) {
  const std::string s(absl::StripAsciiWhitespace(text));
  absl::Time t;
  std::string err;
  for (const char* layout : {absl::RFC3339_full, "%Y-%m-%d%ET%H:%M%Ez"}) {
    // Years far off overflow the arithmetic on Unix ms; no grid forecast needs them.
    if (absl::ParseTime(layout, s, &t, &err) && t >= absl::FromUnixMillis(kMinIntensityTimeMs) &&
        t <= absl::FromUnixMillis(kMaxIntensityTimeMs)) {
      return absl::ToUnixMillis(t);
    }
  }
  return std::nullopt;
}

absl::StatusOr<IntensitySeries> IntensitySeries::Parse(absl::string_view text) {
  if (text.size() > kMaxIntensityFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("carbon intensity: ", text.size(),
                                                   " bytes, more than ", kMaxIntensityFileBytes));
  }
  if (!IsValidUtf8(Std(text))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "carbon intensity: not UTF-8 text (invalid at byte ", FirstInvalidUtf8(Std(text)), ")"));
  }
  Raw raw;
  IntensitySeries series;
  const absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  absl::Status s;
  if (!trimmed.empty() && (trimmed.front() == '[' || trimmed.front() == '{')) {
    s = ReadJson(trimmed, raw, series.format_);
  } else {
    series.format_ = "csv";
    s = ReadCsv(text, raw);
  }
  if (!s.ok()) return s;
  if (raw.empty()) return Bad(series.format_, "the text", "holds no points");
  // Durations: as given, else until the next point; the last as long as the one before
  // (a lone point: an hour). Overlaps are cut at the next point's start.
  std::vector<IntensityPoint> points;
  points.reserve(raw.size());
  for (const auto& [t, p] : raw) points.push_back(p);
  for (size_t i = 0; i < points.size(); ++i) {
    IntensityPoint& p = points[i];
    const bool last = i + 1 == points.size();
    if (p.duration_ms == 0) {
      if (!last) {
        p.duration_ms = points[i + 1].unix_ms - p.unix_ms;
      } else {
        p.duration_ms = i > 0 ? p.unix_ms - points[i - 1].unix_ms : kHourMs;
      }
    }
    if (!last) p.duration_ms = std::min(p.duration_ms, points[i + 1].unix_ms - p.unix_ms);
    p.duration_ms = std::max<int64_t>(p.duration_ms, 1);
  }
  series.integral_before_.reserve(points.size());
  series.run_.reserve(points.size());
  double integral = 0;
  int32_t run = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    if (i > 0 && points[i - 1].unix_ms + points[i - 1].duration_ms != points[i].unix_ms) ++run;
    series.integral_before_.push_back(integral);
    series.run_.push_back(run);
    integral += points[i].gco2_per_kwh * static_cast<double>(points[i].duration_ms);
  }
  series.points_ = std::move(points);
  return series;
}

int64_t IntensitySeries::begin_ms() const { return points_.empty() ? 0 : points_.front().unix_ms; }

int64_t IntensitySeries::end_ms() const {
  return points_.empty() ? 0 : points_.back().unix_ms + points_.back().duration_ms;
}

std::optional<size_t> IntensitySeries::Holding(int64_t unix_ms) const {
  auto it = std::upper_bound(points_.begin(), points_.end(), unix_ms,
                             [](int64_t t, const IntensityPoint& p) { return t < p.unix_ms; });
  if (it == points_.begin()) return std::nullopt;
  --it;
  if (unix_ms >= it->unix_ms + it->duration_ms) return std::nullopt;
  return static_cast<size_t>(it - points_.begin());
}

std::optional<double> IntensitySeries::At(int64_t unix_ms) const {
  std::optional<size_t> i = Holding(unix_ms);
  if (!i) return std::nullopt;
  return points_[*i].gco2_per_kwh;
}

std::optional<double> IntensitySeries::Mean(int64_t from_ms, int64_t to_ms) const {
  if (to_ms <= from_ms) return At(from_ms);
  const std::optional<size_t> first = Holding(from_ms), last = Holding(to_ms - 1);
  if (!first || !last || run_[*first] != run_[*last]) return std::nullopt;  // a gap
  const IntensityPoint& a = points_[*first];
  const IntensityPoint& b = points_[*last];
  const double integral = integral_before_[*last] - integral_before_[*first] -
                          a.gco2_per_kwh * static_cast<double>(from_ms - a.unix_ms) +
                          b.gco2_per_kwh * static_cast<double>(to_ms - b.unix_ms);
  return std::max(0.0, integral / static_cast<double>(to_ms - from_ms));
}

namespace {

// The most workers the reservations hold at once over a window: their sum as a step
// function of time, and a sparse table for the maximum over a range of its steps.
class Occupancy {
 public:
  explicit Occupancy(const std::vector<WorkerReservation>& reserved) {
    std::map<int64_t, int> delta;
    for (const WorkerReservation& r : reserved) {
      if (r.end_ms <= r.start_ms || r.workers <= 0) continue;
      delta[r.start_ms] += r.workers;
      delta[r.end_ms] -= r.workers;
    }
    int level = 0;
    std::vector<int> levels;
    for (const auto& [t, d] : delta) {
      level += d;
      times_.push_back(t);
      levels.push_back(level);  // on [t, the next time)
    }
    table_.push_back(std::move(levels));
    for (size_t w = 1; 2 * w <= times_.size(); w *= 2) {
      const std::vector<int>& prev = table_.back();
      std::vector<int> next(times_.size() - 2 * w + 1);
      for (size_t i = 0; i < next.size(); ++i) next[i] = std::max(prev[i], prev[i + w]);
      table_.push_back(std::move(next));
    }
  }
  // The most held at once over [from_ms, to_ms).
  int Max(int64_t from_ms, int64_t to_ms) const {
    // Steps k with times_[k] < to and (k is the last or times_[k + 1] > from).
    const auto lo_it = std::upper_bound(times_.begin(), times_.end(), from_ms);
    const size_t lo = lo_it == times_.begin() ? 0 : static_cast<size_t>(lo_it - times_.begin()) - 1;
    const size_t hi =
        static_cast<size_t>(std::lower_bound(times_.begin(), times_.end(), to_ms) - times_.begin());
    if (hi <= lo) return 0;
    const auto n = hi - lo;
    const int k = std::bit_width(n) - 1;
    return std::max(table_[k][lo], table_[k][hi - (size_t{1} << k)]);
  }

 private:
  std::vector<int64_t> times_;
  std::vector<std::vector<int>> table_;  // table_[k][i]: the max of levels [i, i + 2^k)
};

}  // namespace

CarbonPlan PlanGreenestStart(const IntensitySeries& series, const CarbonPlanRequest& r) {
  CarbonPlan plan;
  plan.start_ms = r.now_ms;
  const int64_t run = std::max<int64_t>(r.run_ms, 1);
  plan.now_gco2_per_kwh = series.Mean(r.now_ms, r.now_ms + run);
  plan.planned_gco2_per_kwh = plan.now_gco2_per_kwh;
  if (r.latest_start_ms <= r.now_ms) {
    plan.why_now = "its deadline leaves no time to wait";
    return plan;
  }
  // The exact candidates first (the optimum lies on one of them), then a grid with what
  // is left of kMaxPlanCandidates.
  std::vector<int64_t> starts = {r.now_ms, r.latest_start_ms};
  const auto add = [&](int64_t t) {
    if (t > r.now_ms && t <= r.latest_start_ms &&
        starts.size() < static_cast<size_t>(kMaxPlanCandidates)) {
      starts.push_back(t);
    }
  };
  const bool capacity = r.capacity > 0;
  if (capacity) {
    // Where room opens (a reservation ends) or closes (a run would end as one begins).
    for (const WorkerReservation& w : r.reserved) {
      add(w.end_ms);
      add(w.start_ms - run);
    }
  }
  // Where a point begins, and where a run would end as one ends (the mean over a run is
  // linear in its start between these): only the points a run started in [now, latest
  // start] can touch.
  const std::vector<IntensityPoint>& points = series.points();
  auto it = std::partition_point(points.begin(), points.end(), [&](const IntensityPoint& p) {
    return p.unix_ms + p.duration_ms <= r.now_ms;  // ended by now
  });
  for (; it != points.end() && it->unix_ms <= r.latest_start_ms + run; ++it) {
    add(it->unix_ms);
    add(it->unix_ms + it->duration_ms - run);
  }
  const int64_t step = std::max<int64_t>(r.step_ms, 1000);
  for (int64_t t = r.now_ms + step;
       t < r.latest_start_ms && starts.size() < static_cast<size_t>(kMaxPlanCandidates);
       t += step) {
    starts.push_back(t);
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  const Occupancy occupancy(capacity ? r.reserved : std::vector<WorkerReservation>{});
  // The least overbooking first (0 where the gang fits), then the least mean.
  std::optional<double> best;
  int best_over = 0;
  for (int64_t s : starts) {
    std::optional<double> mean = series.Mean(s, s + run);
    if (!mean) continue;
    const int over = capacity ? std::max(0, occupancy.Max(s, s + run) + r.workers - r.capacity) : 0;
    // Strictly less by more than rounding (prefix sums over a long series lose ~1e-7
    // g/kWh): the earliest of equals.
    if (!best || over < best_over ||
        (over == best_over && *mean < *best - std::max(1e-9 * *best, 1e-6))) {
      best = mean;
      best_over = over;
      plan.start_ms = s;
    }
  }
  if (!best) {
    plan.why_now = "the forecast does not cover a whole run from any start before its deadline";
    return plan;
  }
  plan.crowded = best_over > 0;
  plan.planned_gco2_per_kwh = best;
  return plan;
}

absl::Status CheckRegionName(absl::string_view field, absl::string_view region) {
  const bool valid = !region.empty() && region.size() <= 64 &&
                     std::all_of(region.begin(), region.end(), [](char c) {
                       return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                              c == '_' || c == '-';
                     });
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " \"", SanitizeUtf8(std::string(region), 64),
      "\" is not a region name: 1-64 letters, digits, '.', '_' or '-' (a zone such as DE)"));
}

}  // namespace joule
