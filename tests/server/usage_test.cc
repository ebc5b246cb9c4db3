#include "server/usage.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/time/time.h"

namespace joule::server {
namespace {

// 2026-12-02 (a Wednesday) 10:00 UTC.
const int64_t kWednesday = absl::ToUnixMillis(
    absl::FromCivil(absl::CivilSecond(2026, 12, 2, 10, 0, 0), absl::UTCTimeZone()));
constexpr int64_t kDay = 24 * 3600 * 1000;

v1::Job EndedJob(const std::string& user, const std::string& model, int64_t created, double joules,
                 double estimated_share) {
  v1::Job j;
  j.set_state(v1::JOB_STATE_SUCCEEDED);
  j.set_submitted_by(user);
  j.set_created_unix_ms(created);
  j.mutable_spec()->set_model(model);
  j.mutable_spec()->set_workers(2);
  (*j.mutable_spec()->mutable_labels())["team"] = user == "ann" ? "vision" : "nlp";
  v1::EnergyReport* e = j.mutable_result()->mutable_energy();
  e->set_total_joules(joules);
  e->set_device_hours(0.5);
  v1::EnergyRecord* r = e->add_records();
  r->set_source("rapl");
  r->set_joules(joules * (1 - estimated_share));
  r = e->add_records();
  r->set_source("estimated");
  r->set_joules(joules * estimated_share);
  j.mutable_result()->set_samples(1000);
  return j;
}

TEST(UsageTallyTest, GroupsSumTheJobsAndTheTotalSumsThemAll) {
  v1::UsageRequest req;
  req.set_group_by("user");
  UsageTally tally(req, 400);
  tally.Add(EndedJob("ann", "mlp", kWednesday, 3.6e6, 0.25));  // 1 kWh
  tally.Add(EndedJob("ann", "cnn", kWednesday + 1, 3.6e6, 0));
  tally.Add(EndedJob("bob", "mlp", kWednesday + 2, 7.2e6, 1));
  v1::UsageResponse r = tally.Finish();
  ASSERT_EQ(r.groups_size(), 2);
  const v1::UsageGroup& ann = r.groups(0);
  EXPECT_EQ(ann.key(), "ann");
  EXPECT_EQ(ann.jobs(), 2);
  EXPECT_DOUBLE_EQ(ann.device_hours(), 1.0);
  ASSERT_EQ(ann.jobs_by_state().size(), 1u);
  EXPECT_EQ(ann.jobs_by_state().at("succeeded"), 2);
  EXPECT_DOUBLE_EQ(ann.kwh(), 2.0);
  EXPECT_DOUBLE_EQ(ann.co2_grams(), 800.0);
  EXPECT_DOUBLE_EQ(ann.estimated_joules(), 0.9e6);
  EXPECT_DOUBLE_EQ(ann.joules_by_source().at("rapl"), 6.3e6);
  EXPECT_EQ(ann.samples(), 2000);
  EXPECT_EQ(r.groups(1).key(), "bob");
  EXPECT_EQ(r.total().jobs(), 3);
  EXPECT_DOUBLE_EQ(r.total().joules(), 14.4e6);
  EXPECT_DOUBLE_EQ(r.total().estimated_joules(), 0.9e6 + 7.2e6);
  EXPECT_EQ(r.jobs_scanned(), 3);
}

// Jobs with CO2 at the grid's intensity (Job.carbon) add it, the energy it covers and a
// carbon-aware job's saving; jobs without add none of the three (the constant's figure
// stays for all).
TEST(UsageTallyTest, TheGridsCo2AddsUpWhereJobsHaveIt) {
  v1::UsageRequest req;
  UsageTally tally(req, 400);
  v1::Job aware = EndedJob("ann", "mlp", kWednesday, 3.6e6, 0);
  aware.mutable_spec()->set_carbon_aware(true);
  aware.mutable_carbon()->set_source("f.csv (csv)");
  aware.mutable_carbon()->set_grams(120);
  aware.mutable_carbon()->set_joules_covered(3.6e6);
  aware.mutable_carbon()->set_grams_at_submit(300);
  v1::Job plain = EndedJob("ann", "mlp", kWednesday + 1, 7.2e6, 0);
  plain.mutable_carbon()->set_source("f.csv (csv)");
  plain.mutable_carbon()->set_grams(500);
  plain.mutable_carbon()->set_joules_covered(3.6e6);  // half its energy covered
  plain.mutable_carbon()->set_grams_at_submit(700);   // not carbon-aware: no saving
  v1::Job none = EndedJob("bob", "mlp", kWednesday + 2, 3.6e6, 0);
  tally.Add(aware);
  tally.Add(plain);
  tally.Add(none);
  const v1::UsageGroup t = tally.Finish().total();
  EXPECT_DOUBLE_EQ(t.co2_grams(), 4 * 400.0);
  EXPECT_DOUBLE_EQ(t.co2_grid_grams(), 620);
  EXPECT_DOUBLE_EQ(t.grid_covered_kwh(), 2);
  EXPECT_DOUBLE_EQ(t.co2_saved_grams(), 180);
}

TEST(UsageTallyTest, KeysByLabelSweepModelDeviceKindDayAndWeek) {
  v1::Job j = EndedJob("ann", "mlp", kWednesday, 1, 0);
  (*j.mutable_spec()->mutable_labels())["sweep"] = "scaling";
  j.mutable_spec()->set_device_kind(v1::DEVICE_KIND_GPU);
  EXPECT_EQ(UsageTally::KeyOf(j, "label:team"), "vision");
  EXPECT_EQ(UsageTally::KeyOf(j, "label:missing"), "");
  EXPECT_EQ(UsageTally::KeyOf(j, "sweep"), "scaling");
  EXPECT_EQ(UsageTally::KeyOf(j, "model"), "mlp");
  EXPECT_EQ(UsageTally::KeyOf(j, "device_kind"), "gpu");
  EXPECT_EQ(UsageTally::KeyOf(j, "day"), "2026-12-02");
  EXPECT_EQ(UsageTally::KeyOf(j, "week"), "2026-11-30");  // its Monday
  j.set_created_unix_ms(kWednesday + 5 * kDay);           // Monday the 7th
  EXPECT_EQ(UsageTally::KeyOf(j, "week"), "2026-12-07");
  j.set_created_unix_ms(kWednesday + 4 * kDay);  // Sunday the 6th
  EXPECT_EQ(UsageTally::KeyOf(j, "week"), "2026-11-30");
}

TEST(UsageTallyTest, TheWindowAndTheStatesChooseTheJobs) {
  v1::UsageRequest req;
  req.set_since_unix_ms(kWednesday);
  req.set_until_unix_ms(kWednesday + kDay);
  req.add_states(v1::JOB_STATE_SUCCEEDED);
  UsageTally tally(req, 400);
  tally.Add(EndedJob("ann", "mlp", kWednesday - 1, 1, 0));       // before
  tally.Add(EndedJob("ann", "mlp", kWednesday, 10, 0));          // in
  tally.Add(EndedJob("ann", "mlp", kWednesday + kDay, 100, 0));  // at until: out
  v1::Job failed = EndedJob("ann", "mlp", kWednesday + 5, 1000, 0);
  failed.set_state(v1::JOB_STATE_FAILED);
  tally.Add(failed);
  v1::UsageResponse r = tally.Finish();
  EXPECT_EQ(r.total().jobs(), 1);
  EXPECT_DOUBLE_EQ(r.total().joules(), 10.0);
  EXPECT_EQ(r.groups_size(), 0);  // no group_by: the total only
}

// A running job: its energy so far (not yet in any record: "unreported"), and the time
// it has trained x its workers.
TEST(UsageTallyTest, ARunningJobCountsWhatItSpentSoFar) {
  v1::Job j;
  j.set_state(v1::JOB_STATE_RUNNING);
  j.mutable_spec()->set_workers(4);
  j.mutable_progress()->set_job_energy_joules(500);
  j.mutable_progress()->set_elapsed_seconds(900);
  UsageTally tally(v1::UsageRequest(), 400);
  tally.Add(j);
  v1::UsageResponse r = tally.Finish();
  EXPECT_DOUBLE_EQ(r.total().joules(), 500.0);
  EXPECT_DOUBLE_EQ(r.total().device_hours(), 1.0);
  EXPECT_DOUBLE_EQ(r.total().joules_by_source().at("unreported"), 500.0);
}

TEST(UsageTallyTest, BadRequestsAreRefusedInOneLine) {
  const auto refused = [](const std::string& by, int64_t since, int64_t until, int state) {
    v1::UsageRequest r;
    r.set_group_by(by);
    r.set_since_unix_ms(since);
    r.set_until_unix_ms(until);
    if (state >= 0) r.add_states(static_cast<v1::JobState>(state));  // -1: none
    absl::Status s = UsageTally::Validate(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << by;
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << s;
    return std::string(s.message());
  };
  EXPECT_NE(refused("colour", 0, 0, -1).find("one of user, label:KEY"), std::string::npos);
  refused("label:", 0, 0, -1);
  refused("label:" + std::string(64, 'k'), 0, 0, -1);
  refused("user\xff\n", 0, 0, -1);
  refused("user", 10, 10, -1);
  refused("user", 0, -5, -1);  // before 1970: not "unbounded"
  refused("user", -5, 0, -1);
  refused("user", 0, 0, 99);
  refused("user", 0, 0, v1::JOB_STATE_UNSPECIFIED);
  for (const char* ok :
       {"", "user", "label:team", "sweep", "model", "device_kind", "day", "week"}) {
    v1::UsageRequest r;
    r.set_group_by(ok);
    EXPECT_TRUE(UsageTally::Validate(r).ok()) << ok;
  }
}

// With a period, each group and the total also hold their figures per day or week, in
// time order; the periods' sums are the group's; periods count toward the group limit.
TEST(UsageTallyTest, PeriodsSplitEachGroupAndTheTotalOverTime) {
  v1::UsageRequest req;
  req.set_group_by("user");
  req.set_period("day");
  ASSERT_TRUE(UsageTally::Validate(req).ok());
  UsageTally tally(req, 400);
  tally.Add(EndedJob("ann", "mlp", kWednesday + kDay, 30, 0));  // Thursday first: order
  tally.Add(EndedJob("ann", "mlp", kWednesday, 10, 0));
  tally.Add(EndedJob("ann", "mlp", kWednesday + 1, 20, 0));
  tally.Add(EndedJob("bob", "mlp", kWednesday + 2 * kDay, 5, 0));
  v1::UsageResponse r = tally.Finish();
  ASSERT_EQ(r.groups_size(), 2);
  const v1::UsageGroup& ann = r.groups(0);
  ASSERT_EQ(ann.periods_size(), 2);
  EXPECT_EQ(ann.periods(0).key(), "2026-12-02");
  EXPECT_EQ(ann.periods(0).jobs(), 2);
  EXPECT_DOUBLE_EQ(ann.periods(0).joules(), 30);
  EXPECT_EQ(ann.periods(1).key(), "2026-12-03");
  EXPECT_DOUBLE_EQ(ann.periods(1).joules(), 30);
  EXPECT_EQ(ann.periods(0).periods_size(), 0);
  ASSERT_EQ(r.groups(1).periods_size(), 1);
  EXPECT_EQ(r.groups(1).periods(0).key(), "2026-12-04");
  ASSERT_EQ(r.total().periods_size(), 3);
  double sum = 0;
  for (const v1::UsageGroup& p : r.total().periods()) sum += p.joules();
  EXPECT_DOUBLE_EQ(sum, r.total().joules());
  EXPECT_FALSE(r.truncated());

  // Weeks from Monday; without group_by only the total has periods.
  req.set_group_by("");
  req.set_period("week");
  UsageTally weeks(req, 400);
  weeks.Add(EndedJob("ann", "mlp", kWednesday, 1, 0));
  weeks.Add(EndedJob("ann", "mlp", kWednesday + 5 * kDay, 1, 0));  // the next Monday
  r = weeks.Finish();
  EXPECT_EQ(r.groups_size(), 0);
  ASSERT_EQ(r.total().periods_size(), 2);
  EXPECT_EQ(r.total().periods(0).key(), "2026-11-30");
  EXPECT_EQ(r.total().periods(1).key(), "2026-12-07");

  // The limit holds groups and periods together: the rest are in the total only.
  req.set_group_by("label:n");
  req.set_period("day");
  UsageTally many(req, 400);
  for (size_t i = 0; i < UsageTally::kMaxGroups; ++i) {
    v1::Job j = EndedJob("ann", "mlp", kWednesday, 1, 0);
    (*j.mutable_spec()->mutable_labels())["n"] = std::to_string(i);
    many.Add(j);
  }
  r = many.Finish();
  EXPECT_TRUE(r.truncated());
  EXPECT_EQ(r.total().jobs(), static_cast<int64_t>(UsageTally::kMaxGroups));
  size_t cells = r.total().periods_size();
  for (const v1::UsageGroup& g : r.groups()) cells += 1 + g.periods_size();
  EXPECT_LE(cells, UsageTally::kMaxGroups);

  for (const char* bad : {"month", "Day", "day\n"}) {
    v1::UsageRequest b;
    b.set_period(bad);
    EXPECT_EQ(UsageTally::Validate(b).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// The charts: a bar a group; with periods, a stacked bar a (period, group); the unit
// follows the total.
TEST(UsageTallyTest, UsageChartsDrawGroupsAndPeriods) {
  v1::UsageRequest req;
  req.set_group_by("user");
  req.set_period("day");
  UsageTally tally(req, 400);
  tally.Add(EndedJob("ann", "mlp", kWednesday, 7.2e6, 0));
  tally.Add(EndedJob("bob", "mlp", kWednesday + kDay, 3.6e6, 0));
  const std::vector<Chart> charts = UsageCharts(tally.Finish(), "user");
  ASSERT_EQ(charts.size(), 2u);
  EXPECT_EQ(charts[0].id, "energy-by-group");
  EXPECT_EQ(charts[0].spec["data"]["values"].size(), 2u);
  EXPECT_EQ(charts[0].spec["data"]["values"][0]["energy"], 2.0);  // kWh: 10.8e6 J in all
  EXPECT_EQ(charts[0].spec["encoding"]["x"]["title"], "energy (kWh)");
  EXPECT_EQ(charts[1].id, "energy-over-time");
  EXPECT_EQ(charts[1].spec["data"]["values"].size(), 2u);
  // Nothing selected: no charts.
  EXPECT_TRUE(UsageCharts(v1::UsageResponse(), "user").empty());
  // Past 20 groups the smallest are one bar, "other (N groups)", in both charts.
  req.set_group_by("label:n");
  UsageTally many(req, 400);
  for (int i = 0; i < 25; ++i) {
    v1::Job j = EndedJob("ann", "mlp", kWednesday, 100 + i, 0);
    (*j.mutable_spec()->mutable_labels())["n"] = std::to_string(i);
    many.Add(j);
  }
  const std::vector<Chart> folded = UsageCharts(many.Finish(), "label:n");
  ASSERT_EQ(folded.size(), 2u);
  const auto& bars = folded[0].spec["data"]["values"];
  ASSERT_EQ(bars.size(), 21u);
  EXPECT_EQ(bars[20]["group"], "other (5 groups)");
  EXPECT_EQ(bars[20]["jobs"], 5);
  EXPECT_DOUBLE_EQ(bars[20]["energy"].get<double>(), 100 + 101 + 102 + 103 + 104);
  std::set<std::string> colours;
  for (const auto& v : folded[1].spec["data"]["values"]) colours.insert(v["group"]);
  EXPECT_EQ(colours.size(), 21u);
}

}  // namespace
}  // namespace joule::server
