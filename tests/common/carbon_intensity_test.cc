#include "common/carbon_intensity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace joule {
namespace {

constexpr int64_t kHour = 3'600'000;
constexpr int64_t kT0 = 1'800'000'000'000;  // ms; the tests' fake clock's start

CarbonPlanRequest Request(int64_t now_ms, int64_t latest_start_ms, int64_t run_ms) {
  CarbonPlanRequest r;
  r.now_ms = now_ms;
  r.latest_start_ms = latest_start_ms;
  r.run_ms = run_ms;
  return r;
}

// An hourly CSV from kT0 of `values`.
std::string HourlyCsv(const std::vector<double>& values) {
  std::string csv = "time,gco2_per_kwh\n";
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppend(&csv, (kT0 + static_cast<int64_t>(i) * kHour) / 1000, ",", values[i], "\n");
  }
  return csv;
}

TEST(IntensitySeriesTest, CsvPointsLastUntilTheNextAndTheLastAsLongAsTheOneBefore) {
  absl::StatusOr<IntensitySeries> s = IntensitySeries::Parse(HourlyCsv({300, 100, 200}));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->format(), "csv");
  EXPECT_EQ(s->begin_ms(), kT0);
  EXPECT_EQ(s->end_ms(), kT0 + 3 * kHour);
  EXPECT_EQ(s->At(kT0 - 1), std::nullopt);
  EXPECT_DOUBLE_EQ(*s->At(kT0), 300);
  EXPECT_DOUBLE_EQ(*s->At(kT0 + kHour + 5), 100);
  EXPECT_DOUBLE_EQ(*s->At(kT0 + 3 * kHour - 1), 200);
  EXPECT_EQ(s->At(kT0 + 3 * kHour), std::nullopt);
  // Half an hour at 300 and half at 100: 200.
  EXPECT_DOUBLE_EQ(*s->Mean(kT0 + kHour / 2, kT0 + 3 * kHour / 2), 200);
  EXPECT_DOUBLE_EQ(*s->Mean(kT0, kT0 + 3 * kHour), 200);
  EXPECT_EQ(s->Mean(kT0, kT0 + 3 * kHour + 1), std::nullopt) << "past the end";
  EXPECT_EQ(s->Mean(kT0 - 1, kT0 + kHour), std::nullopt) << "before the start";
}

TEST(IntensitySeriesTest, CsvTakesRfc3339TimesCommentsAndBlankLinesAndTheLaterOfTwinPoints) {
  absl::StatusOr<IntensitySeries> s = IntensitySeries::Parse(
      "# GB, synthetic\n\ntime, gco2_per_kwh\n2026-12-05T00:00:00Z,100\n"
      "2026-12-05T01:00+00:00, 50.5\n2026-12-05T02:00:00.000+01:00,7\n"
      "2026-12-05T00:00:00Z,120\n");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->points().size(), 2u) << "02:00+01:00 is 01:00Z: the later row wins";
  EXPECT_DOUBLE_EQ(s->points()[0].gco2_per_kwh, 120);
  EXPECT_DOUBLE_EQ(s->points()[1].gco2_per_kwh, 7);
}

TEST(IntensitySeriesTest, EachJsonFormatIsRecognisedAndConverted) {
  struct Case {
    std::string text, format;
    double first;
    int64_t first_duration_ms;
  };
  const std::vector<Case> cases = {
      {R"([{"location":"eastus","forecastData":[
          {"location":"eastus","timestamp":"2026-12-05T00:00:00Z","duration":30,"value":400},
          {"location":"eastus","timestamp":"2026-12-05T00:30:00Z","duration":30,"value":300}]}])",
       "carbon-aware-sdk", 400, 30 * 60000},
      {R"([{"location":"eastus","timestamp":"2026-12-05T00:00:00Z","duration":5,"value":12.5}])",
       "carbon-aware-sdk", 12.5, 5 * 60000},
      {R"({"zone":"DE","forecast":[{"carbonIntensity":329,"datetime":"2026-12-05T00:00:00.000Z"},
          {"carbonIntensity":301,"datetime":"2026-12-05T01:00:00.000Z"}],
          "updatedAt":"2026-12-04T23:00:00.000Z"})",
       "electricitymaps", 329, kHour},
      {R"({"meta":{"region":"CAISO_NORTH","signal_type":"co2_moer","units":"lbs_co2_per_mwh",
          "data_point_period_seconds":300},
          "data":[{"point_time":"2026-12-05T00:00:00+00:00","value":1000}]})",
       "watttime", 453.592, 300000},
      {R"({"data":[{"from":"2026-12-05T00:00Z","to":"2026-12-05T00:30Z",
          "intensity":{"forecast":180,"actual":171,"index":"high"}},
          {"from":"2026-12-05T00:30Z","to":"2026-12-05T01:00Z",
          "intensity":{"forecast":172,"actual":null,"index":"high"}}]})",
       "neso", 171, 30 * 60000},
  };
  for (const Case& c : cases) {
    absl::StatusOr<IntensitySeries> s = IntensitySeries::Parse(c.text);
    ASSERT_TRUE(s.ok()) << c.format << ": " << s.status();
    EXPECT_EQ(s->format(), c.format);
    EXPECT_NEAR(s->points()[0].gco2_per_kwh, c.first, 1e-9) << c.format;
    EXPECT_EQ(s->points()[0].duration_ms, c.first_duration_ms) << c.format;
    EXPECT_EQ(s->points()[0].unix_ms, *ParseRfc3339Ms("2026-12-05T00:00:00Z")) << c.format;
  }
  // NESO: the forecast where there is no actual yet.
  absl::StatusOr<IntensitySeries> neso = IntensitySeries::Parse(cases.back().text);
  EXPECT_DOUBLE_EQ(neso->points()[1].gco2_per_kwh, 172);
}

// Malformed input of every kind is one clear error naming the format and where, never a
// crash, never a partial series.
TEST(IntensitySeriesTest, MalformedInputOfEveryKindIsRefusedWithWhereAndWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "no header"},
      {"time,gco2_per_kwh\n", "holds no points"},
      {"when,grams\n1,2\n", "the header is not"},
      {"time,gco2_per_kwh\n1,2,3\n", "line 2: 3 columns"},
      {"time,gco2_per_kwh\nyesterday,2\n", "neither RFC 3339 nor Unix seconds"},
      {"time,gco2_per_kwh\n1800000000,lots\n", "is not a number"},
      {"time,gco2_per_kwh\n1800000000,-1\n", "not a number in [0, 5000]"},
      {"time,gco2_per_kwh\n1800000000,nan\n", "not a number in [0, 5000]"},
      {"time,gco2_per_kwh\n1800000000,1e9\n", "not a number in [0, 5000]"},
      {"time,gco2_per_kwh\n1800000000,inf\n", "not a number in [0, 5000]"},
      {std::string("time,gco2_per_kwh\n1800000000,1\xff\n"), "not UTF-8"},
      {"{\"forecast\": [", "not valid JSON"},
      {"[]", "is empty"},
      {"42", "line 1: 1 columns"},
      {"{\"nothing\": 1}", "no known shape"},
      {"[{\"timestamp\":\"2026-12-05T00:00:00Z\"}]", "has no timestamp and value"},
      {"[{\"timestamp\":\"soon\",\"value\":1}]", "is not RFC 3339"},
      {"[{\"timestamp\":5,\"value\":1}]", "the time is not a string"},
      {"[{\"timestamp\":\"2026-12-05T00:00:00Z\",\"value\":\"1\"}]", "value is not a number"},
      {"[{\"timestamp\":\"2026-12-05T00:00:00Z\",\"value\":1,\"duration\":-5}]",
       "duration is not a number of minutes"},
      {"{\"forecast\": 7}", "is not an array"},
      {"{\"forecast\": [{\"datetime\":\"2026-12-05T00:00:00Z\"}]}", "has no datetime"},
      {"{\"meta\":{\"units\":\"percentile\"},\"data\":[]}", "is not an emission rate"},
      {"{\"meta\":{},\"data\":[]}", "is not an emission rate"},
      {"{\"data\":[{\"from\":\"2026-12-05T01:00Z\",\"to\":\"2026-12-05T00:00Z\","
       "\"intensity\":{\"forecast\":1}}]}",
       "ends before it starts"},
      {"{\"data\":[{\"from\":\"2026-12-05T00:00Z\",\"to\":\"2026-12-05T01:00Z\"}]}",
       "has no from, to and intensity"},
  };
  for (const auto& [text, needle] : cases) {
    absl::StatusOr<IntensitySeries> s = IntensitySeries::Parse(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.status().message().find(needle), std::string::npos)
        << text << " -> " << s.status().message();
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos) << "one line";
  }
  // Too big, too many points.
  EXPECT_FALSE(IntensitySeries::Parse(std::string(kMaxIntensityFileBytes + 1, ' ')).ok());
  std::string many = "time,gco2_per_kwh\n";
  for (size_t i = 0; i <= kMaxIntensityPoints; ++i) absl::StrAppend(&many, 1000 + i, ",1\n");
  absl::StatusOr<IntensitySeries> too_many = IntensitySeries::Parse(many);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("more than"), std::string::npos);
}

TEST(IntensitySeriesTest, AGapBetweenPointsIsNotCovered) {
  absl::StatusOr<IntensitySeries> s = IntensitySeries::Parse(
      R"([{"timestamp":"2026-12-05T00:00:00Z","duration":30,"value":100},
          {"timestamp":"2026-12-05T01:00:00Z","duration":30,"value":100}])");
  ASSERT_TRUE(s.ok()) << s.status();
  const int64_t t = *ParseRfc3339Ms("2026-12-05T00:00:00Z");
  EXPECT_EQ(s->At(t + 45 * 60000), std::nullopt);
  EXPECT_EQ(s->Mean(t, t + 90 * 60000), std::nullopt);
  EXPECT_DOUBLE_EQ(*s->Mean(t, t + 30 * 60000), 100);
}

// Mean by prefix sums against a minute-by-minute sum, on random points of random
// lengths with random gaps: equal where covered, none where a gap or an end cuts in.
TEST(IntensitySeriesTest, MeanAgreesWithAMinuteByMinuteSumAcrossGaps) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> value(0, 900);
  std::uniform_int_distribution<int> minutes(1, 90), gap(0, 3), at(-30, 600), len(0, 400);
  for (int trial = 0; trial < 40; ++trial) {
    std::string json = "[";
    int64_t t = kT0;
    std::map<int64_t, double> by_minute;  // the intensity of each covered minute
    for (int i = 0; i < 12; ++i) {
      if (gap(rng) == 0) t += 60000LL * minutes(rng);
      const int d = minutes(rng);
      const double v = std::round(value(rng));
      absl::StrAppend(
          &json, i > 0 ? "," : "", R"({"timestamp":")",
          absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(t), absl::UTCTimeZone()),
          R"(","duration":)", d, R"(,"value":)", v, "}");
      for (int m = 0; m < d; ++m) by_minute[t + 60000LL * m] = v;
      t += 60000LL * d;
    }
    json += "]";
    absl::StatusOr<IntensitySeries> s = IntensitySeries::Parse(json);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int q = 0; q < 50; ++q) {
      const int64_t from = kT0 + 60000LL * at(rng), to = from + 60000LL * (1 + len(rng));
      double sum = 0;
      bool covered = true;
      for (int64_t m = from; m < to && covered; m += 60000) {
        auto it = by_minute.find(m);
        covered = it != by_minute.end();
        if (covered) sum += it->second;
      }
      const std::optional<double> mean = s->Mean(from, to);
      ASSERT_EQ(mean.has_value(), covered) << "trial " << trial << " from " << from;
      if (covered) {
        EXPECT_NEAR(*mean, sum / static_cast<double>((to - from) / 60000), 1e-6)
            << "trial " << trial;
      }
    }
  }
}

// Times far from now overflow arithmetic on Unix ms: 1970 to 2200 only.
TEST(IntensitySeriesTest, TimesOutsideTheYears1970To2200AreRefused) {
  EXPECT_EQ(ParseRfc3339Ms("9999-12-31T23:59:59Z"), std::nullopt);
  EXPECT_EQ(ParseRfc3339Ms("2201-01-01T00:00:00Z"), std::nullopt);
  EXPECT_EQ(ParseRfc3339Ms("1969-12-31T23:59:59Z"), std::nullopt);
  EXPECT_EQ(ParseRfc3339Ms("2199-12-31T23:00:00Z").value_or(0), kMaxIntensityTimeMs - kHour);
  for (const char* csv :
       {"time,gco2_per_kwh\n9999-01-01T00:00:00Z,100\n", "time,gco2_per_kwh\n99999999999,100\n"}) {
    absl::StatusOr<IntensitySeries> s = IntensitySeries::Parse(csv);
    ASSERT_FALSE(s.ok()) << csv;
    EXPECT_NE(s.status().message().find("line 2"), std::string::npos) << s.status();
  }
}

TEST(PlanGreenestStartTest, TheGreenestWholeRunBeforeTheDeadlineIsChosen) {
  // 300 g/kWh now, 100 for two hours from 03:00, 400 after.
  const IntensitySeries s =
      *IntensitySeries::Parse(HourlyCsv({300, 300, 300, 100, 100, 400, 400, 400}));
  CarbonPlanRequest r = Request(kT0, kT0 + 6 * kHour, 2 * kHour);
  CarbonPlan p = PlanGreenestStart(s, r);
  EXPECT_EQ(p.start_ms, kT0 + 3 * kHour);
  EXPECT_DOUBLE_EQ(*p.planned_gco2_per_kwh, 100);
  EXPECT_DOUBLE_EQ(*p.now_gco2_per_kwh, 300);
  EXPECT_TRUE(p.why_now.empty());
  // A deadline before the green hours: the best start before it (02:00: 300 then 100).
  r.latest_start_ms = kT0 + 2 * kHour;
  p = PlanGreenestStart(s, r);
  EXPECT_EQ(p.start_ms, kT0 + 2 * kHour);
  EXPECT_DOUBLE_EQ(*p.planned_gco2_per_kwh, 200);
  // No slack: now.
  r.latest_start_ms = kT0;
  p = PlanGreenestStart(s, r);
  EXPECT_EQ(p.start_ms, kT0);
  EXPECT_NE(p.why_now.find("no time to wait"), std::string::npos);
  // A run longer than the forecast: now, and why.
  r.latest_start_ms = kT0 + 6 * kHour;
  r.run_ms = 9 * kHour;
  p = PlanGreenestStart(s, r);
  EXPECT_EQ(p.start_ms, kT0);
  EXPECT_NE(p.why_now.find("does not cover"), std::string::npos);
  // A flat forecast: the earliest of equals, now.
  const IntensitySeries flat = *IntensitySeries::Parse(HourlyCsv({200, 200, 200, 200}));
  p = PlanGreenestStart(flat, Request(kT0, kT0 + 2 * kHour, kHour));
  EXPECT_EQ(p.start_ms, kT0);
}

// Random forecasts, deadlines and runs: the start always lies in [now, latest], and no
// start on a one-minute grid (finer than the planner's own 5-minute steps: it must find
// the least where a point begins or ends) has a lower covered mean.
TEST(PlanGreenestStartTest, TheStartKeepsTheDeadlineAndNoMinuteIsGreenerOnRandomForecasts) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<double> value(20, 600);
  std::uniform_int_distribution<int> hours(1, 48), run_min(10, 300), slack_min(0, 1500);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<double> v(hours(rng));
    for (double& x : v) x = value(rng);
    const IntensitySeries s = *IntensitySeries::Parse(HourlyCsv(v));
    const int64_t now = kT0 + 7 * 60000 * (trial % 5);
    const int64_t slack = slack_min(rng) * 60000LL;
    const CarbonPlanRequest r = Request(now, now + slack, run_min(rng) * 60000LL);
    const CarbonPlan p = PlanGreenestStart(s, r);
    ASSERT_GE(p.start_ms, r.now_ms);
    ASSERT_LE(p.start_ms, std::max(r.now_ms, r.latest_start_ms));
    if (!p.why_now.empty()) continue;
    std::vector<int64_t> starts = {r.latest_start_ms};
    for (int64_t t = r.now_ms; t <= r.latest_start_ms; t += 60000) starts.push_back(t);
    for (int64_t t : starts) {
      std::optional<double> m = s.Mean(t, t + r.run_ms);
      if (m) {
        ASSERT_GE(*m, *p.planned_gco2_per_kwh - 1e-6) << "trial " << trial << " t " << t;
      }
    }
  }
}

// With other gangs' reservations: the chosen start leaves room for the gang all through
// its run (counted minute by minute), and no start on a one-minute grid that leaves room
// is greener; where none leaves room the plan says crowded, and none on the grid does.
TEST(PlanGreenestStartTest, TheGangFitsBesideTheReservationsAndNoMinuteThatFitsIsGreener) {
  std::mt19937 rng(47);
  std::uniform_real_distribution<double> value(20, 600);
  std::uniform_int_distribution<int> hours(6, 30), run_min(10, 240), slack_min(0, 900),
      at_min(-120, 1500), len_min(5, 300), workers(1, 4), count(0, 12);
  int crowded = 0, fitted = 0;
  for (int trial = 0; trial < 80; ++trial) {
    std::vector<double> v(hours(rng));
    for (double& x : v) x = value(rng);
    const IntensitySeries s = *IntensitySeries::Parse(HourlyCsv(v));
    const int64_t now = kT0 + 60000LL * (trial % 13);
    const int64_t slack = slack_min(rng) * 60000LL;
    CarbonPlanRequest r = Request(now, now + slack, run_min(rng) * 60000LL);
    r.capacity = 4;
    r.workers = workers(rng);
    for (int i = count(rng); i > 0; --i) {
      const int64_t from = now + at_min(rng) * 60000LL;
      r.reserved.push_back({from, from + len_min(rng) * 60000LL, workers(rng)});
    }
    const auto fits = [&](int64_t start) {
      for (int64_t m = start; m < start + r.run_ms; m += 60000) {
        int held = 0;
        for (const WorkerReservation& w : r.reserved)
          held += w.start_ms <= m && m < w.end_ms ? w.workers : 0;
        if (held + r.workers > r.capacity) return false;
      }
      return true;
    };
    const CarbonPlan p = PlanGreenestStart(s, r);
    ASSERT_GE(p.start_ms, r.now_ms);
    ASSERT_LE(p.start_ms, std::max(r.now_ms, r.latest_start_ms));
    if (!p.why_now.empty()) continue;
    std::vector<int64_t> starts = {r.latest_start_ms};
    for (int64_t t = r.now_ms; t <= r.latest_start_ms; t += 60000) starts.push_back(t);
    if (p.crowded) {
      ++crowded;
      for (int64_t t : starts) {
        ASSERT_FALSE(s.Mean(t, t + r.run_ms) && fits(t)) << "trial " << trial << " t " << t;
      }
      continue;
    }
    ++fitted;
    ASSERT_TRUE(fits(p.start_ms)) << "trial " << trial;
    for (int64_t t : starts) {
      std::optional<double> m = s.Mean(t, t + r.run_ms);
      if (m && fits(t)) {
        ASSERT_GE(*m, *p.planned_gco2_per_kwh - 1e-6) << "trial " << trial << " t " << t;
      }
    }
  }
  EXPECT_GT(crowded, 0) << "the trials should include a full cluster";
  EXPECT_GT(fitted, 40);
}

}  // namespace
}  // namespace joule
