// `joule usage`'s pieces: its time forms, its table and its CSV.
#include <gtest/gtest.h>

#include "absl/time/time.h"
#include "client/cli.h"
#include "common/text.h"

namespace joule::client {
namespace {

TEST(UsageCliTest, TimesAreDatesRfc3339OrSpansBackFromNow) {
  const absl::Time now = absl::FromUnixSeconds(1'796'400'000);  // 2026-12-04 ...
  const auto at = [&](const std::string& t) {
    absl::StatusOr<int64_t> ms = ParseUsageTime(t, now);
    EXPECT_TRUE(ms.ok()) << t << ": " << ms.status();
    return ms.ok() ? *ms : -1;
  };
  EXPECT_EQ(at("2026-12-01"),
            absl::ToUnixMillis(absl::FromCivil(absl::CivilDay(2026, 12, 1), absl::UTCTimeZone())));
  EXPECT_EQ(at("2026-12-01T06:30:00Z"), at("2026-12-01") + 6.5 * 3600 * 1000);
  EXPECT_EQ(at("2026-12-01T08:30:00+02:00"), at("2026-12-01T06:30:00Z"));
  EXPECT_EQ(at(" 2026-12-01 06:30 "), at("2026-12-01T06:30:00Z"));
  EXPECT_EQ(at("7d"), absl::ToUnixMillis(now) - 7 * 24 * 3600 * 1000LL);
  EXPECT_EQ(at("2w"), absl::ToUnixMillis(now) - 14 * 24 * 3600 * 1000LL);
  EXPECT_EQ(at("90m"), absl::ToUnixMillis(now) - 90 * 60 * 1000LL);
  for (const char* bad : {"", "yesterday", "7", "d", "-3d", "2026-13-01", "2026-12-01T25:00:00Z",
                          "1e9d", "\xff\xfe", "1960-01-01", "1970-01-01"}) {
    absl::StatusOr<int64_t> ms = ParseUsageTime(bad, now);
    EXPECT_EQ(ms.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(std::string(ms.status().message()).find("YYYY-MM-DD"), std::string::npos);
  }
}

v1::UsageResponse TwoGroups() {
  v1::UsageResponse r;
  v1::UsageGroup* g = r.add_groups();
  g->set_key("=cmd|' /C calc'!A0");  // a hostile label value
  g->set_jobs(2);
  g->set_device_hours(0.25);
  g->set_joules(7200);
  g->set_kwh(0.002);
  g->set_estimated_joules(1800);
  g->set_co2_grams(0.8);
  g->set_samples(3600);
  (*g->mutable_joules_by_source())["rapl"] = 5400;
  (*g->mutable_joules_by_source())["estimated"] = 1800;
  g = r.add_groups();
  g->set_key("b,\"c\"");
  g->set_jobs(1);
  g->set_joules(100);
  (*g->mutable_joules_by_source())["nvml"] = 100;
  *r.mutable_total() = r.groups(0);
  r.mutable_total()->set_key("total");
  r.mutable_total()->set_jobs(3);
  (*r.mutable_total()->mutable_joules_by_source())["nvml"] = 100;
  r.set_grid_gco2_per_kwh(400);
  r.set_jobs_scanned(5);
  return r;
}

TEST(UsageCliTest, TheCsvHasAColumnPerSourceAndQuotesAndDefusesKeys) {
  EXPECT_EQ(UsageCsv(TwoGroups()),
            "group,period,jobs,device_hours,joules,kwh,estimated_joules,co2_grams,samples,"
            "co2_grid_grams,grid_covered_kwh,co2_saved_grams,"
            "joules_estimated,joules_nvml,joules_rapl\n"
            "'=cmd|' /C calc'!A0,,2,0.250000,7200.000,0.002000,1800.000,0.800,3600,"
            "0.000,0.000000,0.000,1800.000,0.000,5400.000\n"
            "\"b,\"\"c\"\"\",,1,0.000000,100.000,0.000000,0.000,0.000,0,"
            "0.000,0.000000,0.000,0.000,100.000,0.000\n"
            "total,,3,0.250000,7200.000,0.002000,1800.000,0.800,3600,"
            "0.000,0.000000,0.000,1800.000,100.000,5400.000\n");
}

// --per: a group's periods follow it, in the table indented, in CSV with their period.
TEST(UsageCliTest, PeriodsFollowTheirGroupInTheTableAndTheCsv) {
  v1::UsageResponse r = TwoGroups();
  v1::UsageGroup* p = r.mutable_groups(1)->add_periods();
  p->set_key("2026-11-30");
  p->set_jobs(1);
  p->set_joules(100);
  p = r.mutable_total()->add_periods();
  p->set_key("2026-11-30");
  p->set_jobs(3);
  p->set_joules(7200);
  const std::string csv = UsageCsv(r);
  EXPECT_NE(csv.find("\n\"b,\"\"c\"\"\",2026-11-30,1,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\ntotal,2026-11-30,3,"), std::string::npos) << csv;
  const std::string table = UsageTable(r, "user");
  const size_t group = table.find("b,\"c\"");
  const size_t period = table.find("  2026-11-30");
  ASSERT_NE(group, std::string::npos) << table;
  ASSERT_NE(period, std::string::npos) << table;
  EXPECT_LT(group, period) << table;
  EXPECT_LT(period, table.find("total")) << table;
}

TEST(UsageCliTest, TheTableGivesEachGroupItsShareBySourceAndTheTotal) {
  const std::string t = UsageTable(TwoGroups(), "user");
  EXPECT_EQ(t.substr(0, t.find('\n')).find("USER"), 0u) << t;
  EXPECT_NE(t.find("rapl 75%, estimated 25%"), std::string::npos) << t;
  EXPECT_NE(t.find(" 25.0 "), std::string::npos) << t;    // estimated share, %
  EXPECT_NE(t.find("2000.000"), std::string::npos) << t;  // mJ per sample
  EXPECT_NE(t.find("\ntotal "), std::string::npos) << t;
  EXPECT_NE(t.find("(5 jobs read; CO2 at a constant 400 g/kWh)"), std::string::npos) << t;
  EXPECT_EQ(t.find("GRID CO2"), std::string::npos) << "no job has a grid figure:\n" << t;
}

// Where jobs have CO2 at the grid's intensity (a --carbon-intensity source), the table
// gives it and the saving beside the constant's figure, and says what it covers.
TEST(UsageCliTest, TheGridsCo2StandsBesideTheConstantsWhereJobsHaveIt) {
  v1::UsageResponse r = TwoGroups();
  for (v1::UsageGroup* g : {r.mutable_groups(0), r.mutable_total()}) {
    g->set_co2_grid_grams(0.31);
    g->set_grid_covered_kwh(0.0015);
    g->set_co2_saved_grams(0.12);
  }
  const std::string t = UsageTable(r, "user");
  EXPECT_NE(t.find("GRID CO2 g    SAVED g"), std::string::npos) << t;
  EXPECT_NE(t.find("      0.80       0.31       0.12 "), std::string::npos) << t;
  EXPECT_NE(t.find("GRID CO2 at the grid's intensity over the runs, for 0.0015 of the 0.0020 kWh"),
            std::string::npos)
      << t;
  EXPECT_NE(UsageCsv(r).find(",3600,0.310,0.001500,0.120,"), std::string::npos) << UsageCsv(r);
}

TEST(CsvFieldTest, QuotesWhatNeedsItAndDefusesFormulas) {
  EXPECT_EQ(CsvField("plain"), "plain");
  EXPECT_EQ(CsvField("a,b"), "\"a,b\"");
  EXPECT_EQ(CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(CsvField("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(CsvField("=1+1"), "'=1+1");
  EXPECT_EQ(CsvField("@SUM(A1)"), "'@SUM(A1)");
  EXPECT_EQ(CsvField("+cmd"), "'+cmd");
  EXPECT_EQ(CsvField("-5.5"), "-5.5");  // a number keeps its sign
  EXPECT_EQ(CsvField("-1e3"), "-1e3");
  EXPECT_EQ(CsvField("-"), "'-");
  EXPECT_EQ(CsvField("-1+2"), "'-1+2");  // arithmetic is a formula
  EXPECT_EQ(CsvField("+1-1"), "'+1-1");
  EXPECT_EQ(CsvField("\tcmd"), "'\tcmd");
  EXPECT_EQ(CsvField("\rcmd"), "\"'\rcmd\"");
}

}  // namespace
}  // namespace joule::client
