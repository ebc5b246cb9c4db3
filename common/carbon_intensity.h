#ifndef JOULE_COMMON_CARBON_INTENSITY_H_
#define JOULE_COMMON_CARBON_INTENSITY_H_
// The grid's carbon intensity over time, gCO2/kWh (issue 31): measured or forecast points
// read from a file in one of the formats grid-data services answer with, and what the
// scheduler asks of them (the intensity at an instant, the mean over a window).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace joule {

// One point: the intensity from `unix_ms` for `duration_ms`, gCO2/kWh (grams of CO2 or
// CO2-equivalent, as the source counts, per kilowatt-hour drawn from the grid).
struct IntensityPoint {
  int64_t unix_ms = 0;
  int64_t duration_ms = 0;  // > 0
  double gco2_per_kwh = 0;  // [0, kMaxGco2PerKwh]
};

// No grid emits more than ~1,100 g/kWh (lignite); a figure over this is a unit error.
inline constexpr double kMaxGco2PerKwh = 5000;
// What one source may hold (a year of 5-minute points is 105,120).
inline constexpr size_t kMaxIntensityPoints = 200000;
inline constexpr size_t kMaxIntensityFileBytes = 32u << 20;

// A series of points sorted by time, none overlapping. Immutable; thread-safe.
class IntensitySeries {
 public:
  IntensitySeries() = default;

  // Reads `text` in any of these formats (told apart by their shape; `format()` says
  // which was read):
  //  - "csv": a header `time,gco2_per_kwh`, then one row per point, the time RFC 3339
  //    (2026-12-05T02:00:00Z, an offset, or no seconds: 2026-12-05T02:00Z) or Unix
  //    seconds; each point lasts until the next one (the last one as long as the one
  //    before it; a single point one hour);
  //  - "carbon-aware-sdk": the Green Software Foundation Carbon Aware SDK's forecast
  //    (GET /emissions/forecasts/current: an array of forecasts, each with
  //    `forecastData` of {timestamp, duration (minutes), value}; the first forecast is
  //    read) or its emissions data (an array of {timestamp, duration, value});
  //  - "electricitymaps": Electricity Maps' carbon-intensity forecast or history
  //    ({"forecast"|"history": [{"datetime", "carbonIntensity"}]});
  //  - "watttime": WattTime's v3 forecast or historical data ({"meta": {"units"},
  //    "data": [{"point_time", "value"}]}), in lbs_co2_per_mwh (x 0.453592: 1 lb =
  //    453.592 g, 1 MWh = 1,000 kWh), g_co2_per_kwh or kg_co2_per_mwh; other units
  //    (a percentile, health damage) are refused;
  //  - "neso": the GB Carbon Intensity API of the National Energy System Operator
  //    ({"data": [{"from", "to", "intensity": {"forecast", "actual"}}]}: the actual
  //    where there is one, else the forecast).
  // Points that share a start: the later one is kept. INVALID_ARGUMENT with the format,
  // the row or index and the reason for anything else: not one of these, a time that does
  // not parse, a value that is not a number in [0, kMaxGco2PerKwh], no points, more than
  // kMaxIntensityPoints, text over kMaxIntensityFileBytes or not UTF-8.
  static absl::StatusOr<IntensitySeries> Parse(absl::string_view text);

  bool empty() const { return points_.empty(); }
  const std::vector<IntensityPoint>& points() const { return points_; }
  const std::string& format() const { return format_; }
  // The first point's start and the last one's end (0 when empty).
  int64_t begin_ms() const;
  int64_t end_ms() const;

  // The intensity at `unix_ms`; none outside the points (before the first, after the
  // last one's end, or in a gap between two).
  std::optional<double> At(int64_t unix_ms) const;
  // The time-weighted mean over [from_ms, to_ms) (to_ms > from_ms); none unless points
  // cover all of it. to_ms == from_ms: At(from_ms). O(log points): two binary searches
  // and a difference of prefix sums.
  std::optional<double> Mean(int64_t from_ms, int64_t to_ms) const;

 private:
  // The index of the point that holds `unix_ms`; none outside the points.
  std::optional<size_t> Holding(int64_t unix_ms) const;

  std::vector<IntensityPoint> points_;
  // Per point: the integral of the points before it, g/kWh x ms (gaps count 0), and the
  // run of contiguous points it belongs to (a gap starts a new one).
  std::vector<double> integral_before_;
  std::vector<int32_t> run_;
  std::string format_;
};

// Workers of one kind promised over [start_ms, end_ms), Unix ms: a running job's gang
// until it is expected to end, a waiting carbon-aware job's over its planned run.
struct WorkerReservation {
  int64_t start_ms = 0, end_ms = 0;
  int workers = 0;
};

// What a carbon-aware job asks of the forecast: the greenest start in [now_ms,
// latest_start_ms] for a run of run_ms, where its gang fits beside the others' plans.
struct CarbonPlanRequest {
  int64_t now_ms = 0;
  int64_t latest_start_ms = 0;  // the last start that keeps the job's deadline
  int64_t run_ms = 0;           // the run to plan for (the estimate's upper bound), > 0
  // Starts tried: now, the latest start, every step_ms between, where a point begins or
  // a run would end as one ends, and where a reservation ends or a run would end as one
  // begins. At most kMaxPlanCandidates of them.
  int64_t step_ms = 5 * 60 * 1000;
  // The gang's place (capacity <= 0: not considered): a start is chosen only where
  // `workers` plus the reservations overlapping its run stay within `capacity` all
  // through it, while such a start exists (else where the fewest workers are overbooked:
  // CarbonPlan.crowded). Without it, jobs planned one by one all pick the same green
  // hours and then queue past their deadlines.
  int capacity = 0;
  int workers = 1;
  std::vector<WorkerReservation> reserved;
};
inline constexpr int kMaxPlanCandidates = 20000;

struct CarbonPlan {
  int64_t start_ms = 0;  // when to start; now_ms: at once
  // The forecast mean intensity over the planned run and over a run started now (none
  // where the forecast does not cover it), gCO2/kWh.
  std::optional<double> planned_gco2_per_kwh, now_gco2_per_kwh;
  // Set when the plan is to start now for want of a choice: why (no slack before the
  // deadline, no forecast that covers a whole run).
  std::string why_now;
  // No covered start before the deadline leaves room for the gang beside the
  // reservations: planned where the fewest workers are overbooked (it queues then).
  bool crowded = false;
};

// The start in [now_ms, max(now_ms, latest_start_ms)] whose run has the least forecast
// mean intensity (the same energy at a lower mean emits less; the run's power is taken as
// constant) among those where the gang fits (CarbonPlanRequest.capacity; where none
// does, among those that overbook the fewest workers), the earliest of equals. Exact: the mean is
// linear in the start between the candidates, and whether the gang fits changes only at them.
// O((candidates + reservations) log). A start whose run the forecast does not cover wholly is not
// chosen; where none is covered, or latest_start_ms <= now_ms, the plan is to start now (why_now
// says so). Pure; thread-safe.
CarbonPlan PlanGreenestStart(const IntensitySeries& series, const CarbonPlanRequest& request);

// RFC 3339 (with or without seconds, fractional seconds, Z or an offset) to Unix ms;
// none when it does not parse or lies outside [kMinIntensityTimeMs, kMaxIntensityTimeMs].
inline constexpr int64_t kMinIntensityTimeMs = 0;                  // 1970-01-01
inline constexpr int64_t kMaxIntensityTimeMs = 7'258'118'400'000;  // 2200-01-01
std::optional<int64_t> ParseRfc3339Ms(absl::string_view text);

// A grid region's name (joule-worker --region, joule-coordinator --region and
// --carbon-intensity REGION=SOURCE): 1-64 of [A-Za-z0-9._-], as a zone code (DE, US-CAL-CISO,
// eu-west-1). It ends up in metric labels, logs and job rows. INVALID_ARGUMENT naming
// `field` otherwise.
absl::Status CheckRegionName(absl::string_view field, absl::string_view region);

}  // namespace joule

#endif  // JOULE_COMMON_CARBON_INTENSITY_H_
