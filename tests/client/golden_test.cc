// The CLI's outputs for people, each against its golden text in tests/client/golden/: a
// change to what `joule list`, `list -o csv`, `status`, `report`, `watch`, `usage`, the
// sweep table and a sweep's fit print
// shows in review as a change to those files. JOULE_UPDATE_GOLDEN=1 rewrites them (then
// read the diff before committing it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "client/cli.h"
#include "client/job_format.h"
#include "common/fit.h"
#include "common/sweep_format.h"
#include "common/sweep_summary.h"

namespace joule::client {
namespace {

void ExpectGolden(const std::string& name, const std::string& actual) {
  const std::filesystem::path path =
      std::filesystem::path(JOULE_SOURCE_DIR) / "tests/client/golden" / name;
  const char* update = std::getenv("JOULE_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << path << " is missing: run with JOULE_UPDATE_GOLDEN=1 to write it";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(expected.str(), actual)
      << name << " differs from its golden text (JOULE_UPDATE_GOLDEN=1 accepts the new one)";
}

class GoldenTest : public ::testing::Test {
 protected:
  // Times print in local time: the golden texts are UTC's.
  void SetUp() override {
    setenv("TZ", "UTC", 1);
    tzset();
  }
};

// A two-rank mlp that succeeded, with energy by source and a label.
v1::Job Succeeded() {
  v1::Job job;
  job.set_id(42);
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.set_attempt(1);
  job.set_submitted_by("alice");
  job.set_created_unix_ms(1'796'400'000'000);
  job.set_queued_unix_ms(1'796'400'000'000);
  job.set_started_unix_ms(1'796'400'002'000);
  job.set_finished_unix_ms(1'796'400'062'500);
  v1::JobSpec* spec = job.mutable_spec();
  spec->set_name("mlp-baseline");
  spec->set_model("mlp");
  spec->set_dataset("fashion-mnist");
  spec->set_workers(2);
  spec->set_device_kind(v1::DEVICE_KIND_CPU);
  spec->set_global_batch_size(128);
  spec->set_local_batch_size(64);
  spec->set_epochs(2);
  spec->set_seed(7);
  spec->mutable_optimizer()->set_name("sgd");
  spec->mutable_optimizer()->set_lr(0.05);
  spec->mutable_optimizer()->set_momentum(0.9);
  (*spec->mutable_labels())["team"] = "vision";
  v1::JobResult* r = job.mutable_result();
  r->set_test_accuracy(0.8612);
  r->set_test_loss(0.3921);
  r->set_samples(120'000);
  r->set_steps(938);
  r->set_train_seconds(55.2);
  r->set_wall_seconds(60.5);
  r->set_samples_per_second(2174);
  v1::EnergyReport* e = r->mutable_energy();
  e->set_total_joules(1520.5);
  e->set_kwh(1520.5 / 3.6e6);
  e->set_average_watts(1520.5 / 60.5);
  e->set_device_hours(60.5 * 2 / 3600);
  e->set_samples_per_joule(120'000 / 1520.5);
  e->set_co2_grams(1520.5 / 3.6e6 * 460);
  e->set_grid_gco2_per_kwh(460);
  e->set_ranks_reported(2);
  job.mutable_progress()->set_job_energy_joules(1520.5);
  job.mutable_progress()->set_test_accuracy(0.8612);
  job.mutable_progress()->set_epoch(2);
  return job;
}

// A job still waiting, with its reason.
v1::Job Pending() {
  v1::Job job;
  job.set_id(43);
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_submitted_by("bob");
  job.set_created_unix_ms(1'796'400'100'000);
  job.set_queued_unix_ms(1'796'400'100'000);
  job.set_reason("waiting for 4 idle cpu workers: 2 registered, 0 idle");
  v1::JobSpec* spec = job.mutable_spec();
  spec->set_name("cnn, \"wide\"");
  spec->set_model("cnn");
  spec->set_dataset("fashion-mnist");
  spec->set_workers(4);
  spec->set_device_kind(v1::DEVICE_KIND_CPU);
  spec->set_global_batch_size(256);
  spec->set_local_batch_size(64);
  spec->set_epochs(5);
  spec->mutable_optimizer()->set_lr(0.1);
  job.mutable_progress()->set_test_accuracy(-1);
  return job;
}

// A carbon-aware job that waited for a greener start and ran: its plan, and its CO2 at
// the grid's intensity against starting at submit.
v1::Job GreenSucceeded() {
  v1::Job job = Succeeded();
  job.set_id(44);
  job.mutable_spec()->set_name("mlp-green");
  job.mutable_spec()->set_carbon_aware(true);
  job.mutable_spec()->set_start_before_unix_ms(1'796'420'000'000);
  job.mutable_spec()->set_expected_run_seconds(5400);
  job.set_started_unix_ms(1'796'407'200'000);
  job.set_finished_unix_ms(1'796'407'260'500);
  v1::CarbonPlan* p = job.mutable_carbon_plan();
  p->set_planned_unix_ms(1'796'400'000'000);
  p->set_planned_start_unix_ms(1'796'407'200'000);
  p->set_latest_start_unix_ms(1'796'420'000'000);
  p->set_planned_gco2_per_kwh(118);
  p->set_now_gco2_per_kwh(341);
  p->set_source("/etc/joule/forecast.csv (csv)");
  v1::CarbonAccount* c = job.mutable_carbon();
  c->set_source("/etc/joule/forecast.csv (csv)");
  c->set_grams(1520.5 / 3.6e6 * 121);
  c->set_joules_covered(1520.5);
  c->set_mean_gco2_per_kwh(121);
  c->set_grams_at_submit(1520.5 / 3.6e6 * 341);
  return job;
}

TEST_F(GoldenTest, CarbonAwareStatus) {
  ExpectGolden("status_carbon.txt", JobDetails(GreenSucceeded()));
}

TEST_F(GoldenTest, List) {
  ExpectGolden("list.txt",
               JobListHeader() + "\n" + JobLine(Succeeded()) + "\n" + JobLine(Pending()) + "\n");
}

TEST_F(GoldenTest, ListCsv) {
  ExpectGolden("list.csv", JobCsvHeader() + "\n" + JobCsvLine(Succeeded()) + "\n" +
                               JobCsvLine(Pending()) + "\n" + JobCsvLine(GreenSucceeded()) + "\n");
}

TEST_F(GoldenTest, Status) {
  ExpectGolden("status-succeeded.txt", JobDetails(Succeeded()));
  ExpectGolden("status-pending.txt", JobDetails(Pending()));
}

TEST_F(GoldenTest, Usage) {
  v1::UsageResponse r;
  v1::UsageGroup* g = r.add_groups();
  g->set_key("alice");
  g->set_jobs(3);
  g->set_device_hours(0.5);
  g->set_joules(36'000);
  g->set_kwh(0.01);
  g->set_estimated_joules(6'000);
  g->set_co2_grams(4.6);
  g->set_samples(360'000);
  (*g->mutable_joules_by_source())["rapl"] = 30'000;
  (*g->mutable_joules_by_source())["estimated"] = 6'000;
  g = r.add_groups();
  g->set_key("bob");
  g->set_jobs(1);
  g->set_device_hours(0.1);
  g->set_joules(3'600);
  g->set_kwh(0.001);
  g->set_co2_grams(0.46);
  g->set_samples(60'000);
  (*g->mutable_joules_by_source())["nvml"] = 3'600;
  v1::UsageGroup* total = r.mutable_total();
  total->set_key("total");
  total->set_jobs(4);
  total->set_device_hours(0.6);
  total->set_joules(39'600);
  total->set_kwh(0.011);
  total->set_estimated_joules(6'000);
  total->set_co2_grams(5.06);
  total->set_samples(420'000);
  (*total->mutable_joules_by_source())["rapl"] = 30'000;
  (*total->mutable_joules_by_source())["estimated"] = 6'000;
  (*total->mutable_joules_by_source())["nvml"] = 3'600;
  r.set_grid_gco2_per_kwh(460);
  r.set_jobs_scanned(4);
  ExpectGolden("usage.txt", UsageTable(r, "user"));
  ExpectGolden("usage.csv", UsageCsv(r));
}

TEST_F(GoldenTest, FitsOnTooFewAndOnEnoughPoints) {
  absl::StatusOr<LineFit> two = FitLine({1, 2}, {10, 20});
  ASSERT_TRUE(two.ok()) << two.status();
  ExpectGolden("fit-two-points.txt", LineFitText(*two) + "\n");
  absl::StatusOr<LineFit> five = FitLine({1, 2, 3, 4, 5}, {10.2, 19.7, 30.4, 39.8, 50.1});
  ASSERT_TRUE(five.ok()) << five.status();
  ExpectGolden("fit-five-points.txt", LineFitText(*five) + "\n");
}

// What `fn` writes on standard output.
template <typename F>
std::string Stdout(F fn) {
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  fn();
  std::cout.rdbuf(old);
  return captured.str();
}

// The succeeded job with what a report has beyond status: epochs, energy records by rank,
// source and phase, and a target reached.
v1::Job Reported() {
  v1::Job job = Succeeded();
  job.mutable_spec()->set_target_accuracy(0.85);
  v1::JobResult* r = job.mutable_result();
  for (int epoch : {1, 2}) {
    v1::EpochRecord* h = r->add_history();
    h->set_epoch(epoch);
    h->set_step(469 * epoch);
    h->set_samples(60'000 * epoch);
    h->set_elapsed_seconds(27.6 * epoch);
    h->set_train_loss(epoch == 1 ? 0.612 : 0.418);
    h->set_test_accuracy(epoch == 1 ? 0.8231 : 0.8612);
    h->set_test_loss(epoch == 1 ? 0.4987 : 0.3921);
    h->set_joules(760.25 * epoch);
    h->set_attempt(1);
    h->set_lr(0.05);
    h->set_test_top_k_accuracy(-1);
    h->set_train_accuracy(-1);
    h->set_train_eval_loss(-1);
    h->set_train_top_k_accuracy(-1);
  }
  v1::AccuracyTarget* t = r->add_to_accuracy();
  t->set_target(0.85);
  t->set_reached(true);
  t->set_epoch(2);
  t->set_seconds(55.2);
  t->set_joules(1520.5);
  t->set_metric("test_accuracy");
  v1::EnergyReport* e = r->mutable_energy();
  for (int rank : {0, 1}) {
    for (const auto& [phase, joules] : std::vector<std::pair<const char*, double>>{
             {"forward", 250.0}, {"backward", 400.0}, {"communication", 110.25}}) {
      v1::EnergyRecord* rec = e->add_records();
      rec->set_rank(rank);
      rec->set_device("cpu");
      rec->set_source("estimated");
      rec->set_phase(phase);
      rec->set_joules(joules);
      rec->set_attempt(1);
    }
  }
  e->set_estimated(true);
  e->set_ranks_expected(2);
  e->set_devices(2);
  e->set_joules_per_device_hour(e->total_joules() / e->device_hours());
  e->set_updates_per_device_hour(938 / e->device_hours());
  return job;
}

TEST_F(GoldenTest, Report) {
  ExpectGolden("report.txt", Stdout([] { PrintJobReport(Reported()); }));
}

// `joule watch`'s line for a running job (its joules and each rank's watts) and for a
// pending one (its reason).
TEST_F(GoldenTest, WatchLines) {
  v1::Job running = Succeeded();
  running.set_state(v1::JOB_STATE_RUNNING);
  running.clear_finished_unix_ms();
  v1::JobProgress* p = running.mutable_progress();
  p->set_epoch(2);
  p->set_step(700);
  p->set_steps_per_epoch(469);
  p->set_samples_per_second(2150);
  p->set_loss(0.45);
  p->set_job_energy_joules(1200.5);
  p->set_elapsed_seconds(41.2);
  p->set_job_power_watts(24.5);
  p->add_rank_power_watts(12.5);
  p->add_rank_power_watts(12.0);
  ExpectGolden("watch.txt", ProgressLine(running, running.id()) + "\n" +
                                ProgressLine(Pending(), Pending().id()) + "\n");
}

// `joule sweep`'s table of two cells (one and two workers), two repeats each.
TEST_F(GoldenTest, SweepTable) {
  std::vector<v1::Job> jobs;
  int64_t id = 100;
  for (int workers : {1, 2}) {
    for (int repeat : {0, 1}) {
      v1::Job j = Succeeded();
      j.set_id(id++);
      j.mutable_spec()->set_workers(workers);
      j.mutable_spec()->set_global_batch_size(128);
      j.mutable_spec()->set_local_batch_size(128 / workers);
      (*j.mutable_spec()->mutable_labels())["sweep"] = "golden";
      (*j.mutable_spec()->mutable_labels())["cell"] = "workers=" + std::to_string(workers);
      (*j.mutable_spec()->mutable_labels())["series"] = "global_batch_size=128";
      v1::JobResult* r = j.mutable_result();
      r->set_wall_seconds((workers == 1 ? 60.0 : 34.0) + repeat);
      r->set_test_accuracy(0.86 - 0.002 * workers + 0.001 * repeat);
      v1::EnergyReport* e = r->mutable_energy();
      e->set_total_joules((workers == 1 ? 1500.0 : 1700.0) + 10 * repeat);
      e->set_device_hours(r->wall_seconds() * workers / 3600);
      e->set_joules_per_device_hour(e->total_joules() / e->device_hours());
      e->set_samples_per_joule(r->samples() / e->total_joules());
      jobs.push_back(j);
    }
  }
  ExpectGolden("sweep.txt", SweepTable(AnalyseSweep(jobs).rows));
}

}  // namespace
}  // namespace joule::client
