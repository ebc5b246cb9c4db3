// Carbon-aware scheduling (issue 31) with a fake clock and forecast files: the greenest
// start before the deadline is planned and kept, the job waits without blocking others,
// starts when its time comes, is re-planned on a new forecast, starts at once when the
// source fails, keeps its plan across a restart, and gets its CO2 over its run.
#include <gtest/gtest.h>
#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/carbon_source.h"
#include "server/coordinator.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_session_sink.h"
#include "tests/testing/specs.h"
#include "tests/testing/temp_cleanup.h"

namespace joule::server {
namespace {

const auto* const kCarbonCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_carbon_"));

constexpr int64_t kHour = 3'600'000;
constexpr int64_t kT0 = 1'800'000'000'000;  // FakeClock's start, Unix ms

std::string HourlyCsv(const std::vector<double>& values, int64_t from_ms = kT0) {
  std::string csv = "time,gco2_per_kwh\n";
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppend(&csv, (from_ms + static_cast<int64_t>(i) * kHour) / 1000, ",", values[i], "\n");
  }
  return csv;
}

// Writes `text` so that the source sees a change (a new size or modification time).
void WriteForecast(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
}

std::vector<std::string> Strings(const google::protobuf::RepeatedPtrField<std::string>& r) {
  return {r.begin(), r.end()};
}

v1::JobSpec CarbonSpec(int64_t start_before_ms, double run_seconds = 3600) {
  v1::JobSpec s = testing::SmallMlpSpec(1);
  s.set_carbon_aware(true);
  s.set_start_before_unix_ms(start_before_ms);
  s.set_expected_run_seconds(run_seconds);
  return s;
}

class CarbonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("joule_carbon_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    forecast_ = dir_ / "forecast.csv";
    // 400 g/kWh for 2 hours, 100 for 2 hours from 02:00, 500 after.
    WriteForecast(forecast_, HourlyCsv({400, 400, 100, 100, 500, 500, 500, 500}));
    Start();
  }
  // `regions`: more regions' forecast files besides the coordinator's own (forecast_).
  void Start(const std::map<std::string, std::filesystem::path>& regions = {}) {
    c_.reset();
    CoordinatorOptions options;
    options.clock = &clock_;
    options.store = (dir_ / "jobs.db").string();
    source_ = std::make_shared<CarbonIntensitySource>(forecast_.string());
    source_->Refresh(clock_.UnixMs());
    options.carbon[options.region] = source_;
    for (const auto& [region, path] : regions) {
      auto source = std::make_shared<CarbonIntensitySource>(path.string());
      source->Refresh(clock_.UnixMs());
      options.carbon[region] = source;
    }
    auto c = Coordinator::Create(options);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = *std::move(c);
  }
  std::string AddWorker(const std::string& region = "") {
    v1::RegisterWorkerRequest req;
    req.set_host("test");
    req.set_region(region);
    req.set_device_kind(v1::DEVICE_KIND_CPU);
    std::string id = c_->RegisterWorker(req)->worker_id();
    auto sink = std::make_shared<testing::FakeSessionSink>();
    EXPECT_TRUE(c_->OpenSession(id, sink).ok());
    sinks_[id] = sink;
    return id;
  }
  int64_t Submit(const v1::JobSpec& spec) {
    bool existing = false;
    absl::StatusOr<int64_t> id = c_->Submit(spec, "", &existing);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }
  v1::Job Get(int64_t id) { return *c_->GetJob(id); }
  // Rank 0 of attempt 1 of job `id` (a gang of one) reports success.
  static v1::WorkerMessage Succeeded(int64_t id) {
    v1::WorkerMessage done;
    done.mutable_result()->set_job_id(id);
    done.mutable_result()->set_attempt(1);
    done.mutable_result()->mutable_result()->set_ok(true);
    done.mutable_result()->mutable_result()->set_devices(1);
    return done;
  }
  // Waits (the heartbeat thread checks plans every 500 ms) until `pred` holds for the job.
  v1::Job WaitFor(int64_t id, const std::function<bool(const v1::Job&)>& pred,
                  std::chrono::milliseconds within = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + within;
    v1::Job job = Get(id);
    while (!pred(job) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      job = Get(id);
    }
    return job;
  }

  std::filesystem::path dir_, forecast_;
  testing::FakeClock clock_;
  std::shared_ptr<CarbonIntensitySource> source_;
  std::unique_ptr<Coordinator> c_;
  std::map<std::string, std::shared_ptr<testing::FakeSessionSink>> sinks_;
};

TEST_F(CarbonTest, AJobWaitsForTheGreenestStartWithoutBlockingOthersAndStartsThen) {
  const std::string w = AddWorker();
  const int64_t green = Submit(CarbonSpec(kT0 + 5 * kHour));
  v1::Job job = Get(green);
  ASSERT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.carbon_plan().planned_start_unix_ms(), kT0 + 2 * kHour);
  EXPECT_DOUBLE_EQ(job.carbon_plan().planned_gco2_per_kwh(), 100);
  EXPECT_DOUBLE_EQ(job.carbon_plan().now_gco2_per_kwh(), 400);
  EXPECT_EQ(job.carbon_plan().latest_start_unix_ms(), kT0 + 5 * kHour);
  EXPECT_NE(job.reason().find("carbon-aware: waiting for "), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("forecast 100 g/kWh against 400 now"), std::string::npos)
      << job.reason();
  EXPECT_NE(job.reason().find("forecast.csv (csv)"), std::string::npos) << job.reason();
  // A job that is not carbon-aware takes the idle worker at once.
  const int64_t plain = Submit(testing::SmallMlpSpec(1));
  EXPECT_EQ(Get(plain).state(), v1::JOB_STATE_RUNNING);
  // It ends; the worker is idle; the carbon-aware job still waits for 02:00.
  c_->OnWorkerMessage(w, Succeeded(plain));
  ASSERT_EQ(Get(plain).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Get(green).state(), v1::JOB_STATE_PENDING);
  // 02:00: it starts, by the heartbeat thread's check.
  clock_.Step(std::chrono::milliseconds(2 * kHour));
  job = WaitFor(green, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_RUNNING; });
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_GE(job.started_unix_ms(), kT0 + 2 * kHour);
  EXPECT_LE(job.started_unix_ms(), job.carbon_plan().latest_start_unix_ms());
}

// Plans see each other: on one worker, two hour-long jobs share the two green hours
// instead of both waiting for the first (and one missing its deadline in the queue);
// a third, with no green hour left, starts now (400 g/kWh, the best that fits).
TEST_F(CarbonTest, PlansLeaveRoomForEachOthersGangs) {
  AddWorker();
  const int64_t first = Submit(CarbonSpec(kT0 + 5 * kHour));
  const int64_t second = Submit(CarbonSpec(kT0 + 5 * kHour));
  EXPECT_EQ(Get(first).carbon_plan().planned_start_unix_ms(), kT0 + 2 * kHour);
  EXPECT_EQ(Get(second).carbon_plan().planned_start_unix_ms(), kT0 + 3 * kHour);
  EXPECT_DOUBLE_EQ(Get(second).carbon_plan().planned_gco2_per_kwh(), 100);
  const int64_t third = Submit(CarbonSpec(kT0 + 5 * kHour));
  EXPECT_EQ(Get(third).carbon_plan().planned_start_unix_ms(), kT0);
  EXPECT_EQ(Get(third).state(), v1::JOB_STATE_RUNNING) << Get(third).reason();
  // A new forecast re-plans them one by one, each beside the ones before: the green
  // hours move to 03:00-05:00.
  WriteForecast(forecast_, HourlyCsv({400, 400, 300, 100, 100, 500, 500, 500}));
  const v1::Job a = WaitFor(first, [](const v1::Job& j) {
    return j.carbon_plan().planned_start_unix_ms() == kT0 + 3 * kHour;
  });
  EXPECT_EQ(a.carbon_plan().planned_start_unix_ms(), kT0 + 3 * kHour);
  const v1::Job b = WaitFor(second, [](const v1::Job& j) {
    return j.carbon_plan().planned_start_unix_ms() == kT0 + 4 * kHour;
  });
  EXPECT_EQ(b.carbon_plan().planned_start_unix_ms(), kT0 + 4 * kHour);
}

// A job that waited and is still queued when its latest start comes goes ahead of the
// queue then, by the heartbeat thread's pass (no other event): here a bigger job of
// higher priority blocks the head of the queue with a worker idle.
TEST_F(CarbonTest, AJobThatWaitedGoesAheadWhenItsLatestStartComes) {
  AddWorker();
  AddWorker();
  const int64_t running = Submit(testing::SmallMlpSpec(1));
  ASSERT_EQ(Get(running).state(), v1::JOB_STATE_RUNNING);
  const int64_t green = Submit(CarbonSpec(kT0 + 5 * kHour));
  ASSERT_EQ(Get(green).carbon_plan().planned_start_unix_ms(), kT0 + 2 * kHour);
  v1::JobSpec big = testing::SmallMlpSpec(2);
  big.set_priority(10);
  const int64_t blocker = Submit(big);
  ASSERT_EQ(Get(blocker).state(), v1::JOB_STATE_PENDING);
  // 02:00: its start has come, but it queues behind the bigger job (no backfill).
  clock_.Step(std::chrono::milliseconds(2 * kHour + 60'000));
  v1::Job job = WaitFor(green, [](const v1::Job& j) {
    return j.reason().find("queued behind job") != std::string::npos;
  });
  ASSERT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find("queued behind job"), std::string::npos) << job.reason();
  // 05:00, its latest start: it goes ahead and takes the idle worker.
  clock_.Step(std::chrono::milliseconds(3 * kHour));
  job = WaitFor(green, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_RUNNING; });
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(Get(blocker).state(), v1::JOB_STATE_PENDING);
}

TEST_F(CarbonTest, ANewForecastReplansAndAFailedSourceStartsTheJobAtOnce) {
  AddWorker();
  const int64_t id = Submit(CarbonSpec(kT0 + 5 * kHour));
  ASSERT_EQ(Get(id).carbon_plan().planned_start_unix_ms(), kT0 + 2 * kHour);
  // The green hours move to 04:00-05:00 (a run of an hour).
  WriteForecast(forecast_, HourlyCsv({400, 400, 300, 300, 50, 500, 500, 500}));
  v1::Job job = WaitFor(id, [](const v1::Job& j) {
    return j.carbon_plan().planned_start_unix_ms() == kT0 + 4 * kHour;
  });
  EXPECT_EQ(job.carbon_plan().planned_start_unix_ms(), kT0 + 4 * kHour);
  EXPECT_DOUBLE_EQ(job.carbon_plan().planned_gco2_per_kwh(), 50);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  // The source serves garbage: the last good forecast is kept a while (a bad write is
  // often fixed by the next), then the job starts at once, and says why.
  WriteForecast(forecast_, "time,gco2_per_kwh\n1800000000,lots\n");
  const auto failed = [this] { return !source_->Get().error.empty(); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!failed() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(failed());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(id).carbon_plan().planned_start_unix_ms(), kT0 + 4 * kHour);
  clock_.Step(std::chrono::milliseconds(CarbonIntensitySource::kKeepLastGoodMs));
  job = WaitFor(id, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_RUNNING; });
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_NE(job.carbon_plan().note().find("the carbon intensity source failed"), std::string::npos)
      << job.carbon_plan().note();
  EXPECT_NE(job.carbon_plan().note().find("is not a number"), std::string::npos);
}

TEST_F(CarbonTest, APlanSurvivesARestartAndADeadlineTooCloseToWaitForStartsAtOnce) {
  int64_t id = 0;
  {
    AddWorker();
    id = Submit(CarbonSpec(kT0 + 5 * kHour));
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_PENDING);
  }
  clock_.Step(std::chrono::milliseconds(kHour / 2));
  Start();  // the same store and forecast: the stored plan stands
  sinks_.clear();
  AddWorker();
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.carbon_plan().planned_start_unix_ms(), kT0 + 2 * kHour);
  EXPECT_EQ(job.carbon_plan().planned_unix_ms(), kT0) << "not re-planned";
  // A deadline a minute away: no greener start before it, so at once.
  const int64_t soon = Submit(CarbonSpec(clock_.UnixMs() + 60000));
  EXPECT_EQ(Get(soon).carbon_plan().planned_start_unix_ms(), clock_.UnixMs());
  EXPECT_EQ(Get(soon).state(), v1::JOB_STATE_RUNNING);
}

// A list taken while submits are under way (a search's client submits its rung while the
// user lists) shows each waiting job with its plan as its reason, also a job stored but
// not yet in memory: the row is inserted with its reason (a plain job's says it is queued).
TEST_F(CarbonTest, AListDuringSubmitsShowsEveryWaitingJobsPlan) {
  constexpr int kJobs = 40;
  std::atomic<bool> done{false};
  std::thread submitter([&] {
    for (int i = 0; i < kJobs; ++i) {
      Submit(i % 4 == 3 ? testing::SmallMlpSpec(1) : CarbonSpec(kT0 + 5 * kHour, 600));
    }
    done = true;
  });
  int seen = 0;
  std::string bare;
  for (bool last = false; !last;) {
    last = done;  // read before the list: once every submit has returned, it holds them all
    absl::StatusOr<v1::ListJobsResponse> page = c_->ListJobs(v1::ListJobsRequest());
    ASSERT_TRUE(page.ok()) << page.status();
    seen = page->jobs_size();
    for (const v1::Job& job : page->jobs()) {
      const bool explained = job.spec().carbon_aware()
                                 ? job.reason().find("carbon-aware: waiting for ") == 0
                                 : !job.reason().empty();
      if (!explained && bare.empty()) {
        bare = absl::StrCat("job ", job.id(), " ", v1::JobState_Name(job.state()),
                            " with reason \"", job.reason(), "\"");
      }
    }
  }
  submitter.join();
  EXPECT_EQ(seen, kJobs);
  EXPECT_EQ(bare, "") << "a listed job without its plan";
}

// Regions: a job goes where and when the forecast is greenest among the regions whose
// workers can hold its gang, runs on that region's workers, and says so.
TEST_F(CarbonTest, AJobRunsInTheRegionWhoseForecastIsGreenestOnThatRegionsWorkers) {
  // FR: 300 g/kWh but 50 from 01:00 for an hour; the coordinator's ("default"): 100 from
  // 02:00. NL: greener still (10), but it has no worker.
  WriteForecast(dir_ / "fr.csv", HourlyCsv({300, 50, 300, 300, 300, 300}));
  WriteForecast(dir_ / "nl.csv", HourlyCsv({10, 10, 10, 10, 10, 10}));
  Start({{"FR", dir_ / "fr.csv"}, {"NL", dir_ / "nl.csv"}});
  const std::string here = AddWorker();
  const std::string fr = AddWorker("FR");
  const int64_t id = Submit(CarbonSpec(kT0 + 5 * kHour));
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_PENDING) << job.reason();
  EXPECT_EQ(job.carbon_plan().region(), "FR");
  EXPECT_EQ(job.carbon_plan().planned_start_unix_ms(), kT0 + kHour);
  EXPECT_DOUBLE_EQ(job.carbon_plan().planned_gco2_per_kwh(), 50);
  EXPECT_DOUBLE_EQ(job.carbon_plan().now_gco2_per_kwh(), 300) << "FR's now";
  EXPECT_NE(job.reason().find(" in FR, forecast 50 g/kWh against 300 now"), std::string::npos)
      << job.reason();
  EXPECT_NE(job.reason().find("fr.csv (csv)"), std::string::npos) << job.reason();
  // 01:00: it starts on FR's worker, though the coordinator's is idle too.
  clock_.Step(std::chrono::milliseconds(kHour));
  job = WaitFor(id, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_RUNNING; });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(Strings(job.worker_ids()), (std::vector<std::string>{fr}));
  EXPECT_EQ(Strings(job.worker_regions()), (std::vector<std::string>{"FR"}));
  // Its attempt keeps where each rank ran: its CO2 is counted at FR's intensity (1 kWh in
  // its first half hour at 50 g/kWh), in its report and its counter.
  v1::WorkerMessage done = Succeeded(id);
  v1::PowerSample* sample = done.mutable_result()->mutable_result()->add_power();
  sample->set_elapsed_seconds(1800);
  sample->set_joules(3.6e6);
  c_->OnWorkerMessage(fr, done);
  job = Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  ASSERT_EQ(job.result().attempts_size(), 1);
  EXPECT_EQ(Strings(job.result().attempts(0).rank_regions()), (std::vector<std::string>{"FR"}));
  EXPECT_NEAR(job.carbon().grams(), 50, 1e-6);
  EXPECT_NE(job.carbon().source().find("FR: "), std::string::npos) << job.carbon().source();
  const std::string metrics = prometheus::TextSerializer().Serialize(c_->registry()->Collect());
  EXPECT_NE(metrics.find(absl::StrCat("joule_job_co2_grams_total{joule_job=\"", id, "\"} 50")),
            std::string::npos)
      << metrics.substr(0, 3000);
  // A plain job takes any idle worker; the coordinator's own stays in "default".
  const int64_t plain = Submit(testing::SmallMlpSpec(2));
  job = Get(plain);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(std::set<std::string>(job.worker_regions().begin(), job.worker_regions().end()),
            (std::set<std::string>{"default", "FR"}));
  EXPECT_NE(std::find(job.worker_ids().begin(), job.worker_ids().end(), here),
            job.worker_ids().end());
}

// A job planned in a region whose workers are still busy when its latest start comes runs
// on another region's: the deadline comes before the region.
TEST_F(CarbonTest, AtItsLatestStartARegionalJobRunsWhereverItsGangIsFree) {
  WriteForecast(dir_ / "fr.csv", HourlyCsv({300, 50, 300, 300, 300, 300}));
  Start({{"FR", dir_ / "fr.csv"}});
  const std::string fr = AddWorker("FR");
  const int64_t plain = Submit(testing::SmallMlpSpec(1));  // FR's only worker, for good
  ASSERT_EQ(Get(plain).state(), v1::JOB_STATE_RUNNING);
  const std::string here = AddWorker();
  const int64_t id = Submit(CarbonSpec(kT0 + 2 * kHour, 1800));
  v1::Job job = Get(id);
  ASSERT_EQ(job.carbon_plan().region(), "FR") << job.reason();
  EXPECT_EQ(job.carbon_plan().planned_start_unix_ms(), kT0 + kHour);
  // 01:00: FR's worker is busy; the job waits for it, not taking the idle one elsewhere.
  clock_.Step(std::chrono::milliseconds(kHour));
  job = WaitFor(id, [](const v1::Job& j) {
    return j.state() != v1::JOB_STATE_PENDING || j.reason().find("region FR") != std::string::npos;
  });
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find("in region FR"), std::string::npos) << job.reason();
  // 02:00, its latest start: it runs on the idle worker outside FR.
  clock_.Step(std::chrono::milliseconds(kHour));
  job = WaitFor(id, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_RUNNING; });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(Strings(job.worker_ids()), (std::vector<std::string>{here}));
  EXPECT_EQ(Strings(job.worker_regions()), (std::vector<std::string>{"default"}));
}

// A held job whose region loses the workers for its gang is planned again where another
// region's forecast and workers are; the regions seen stay (no re-plan on a reconnect).
TEST_F(CarbonTest, AHeldJobWhoseRegionLosesItsWorkersIsPlannedAgainElsewhere) {
  WriteForecast(dir_ / "fr.csv", HourlyCsv({300, 50, 300, 300, 300, 300}));
  Start({{"FR", dir_ / "fr.csv"}});
  const std::string fr = AddWorker("FR");
  const std::string here = AddWorker();
  const int64_t id = Submit(CarbonSpec(kT0 + 5 * kHour));
  ASSERT_EQ(Get(id).carbon_plan().region(), "FR");
  c_->CloseSession(fr, sinks_[fr].get(), "test: FR's worker leaves");
  // A new forecast meanwhile re-plans it, in FR still: its worker may be back in a moment.
  const std::string before = Get(id).carbon_plan().forecast_digest();
  WriteForecast(forecast_, HourlyCsv({400, 400, 90, 100, 500, 500, 500, 500}));
  v1::Job job =
      WaitFor(id, [&](const v1::Job& j) { return j.carbon_plan().forecast_digest() != before; });
  ASSERT_NE(job.carbon_plan().forecast_digest(), before) << "not re-planned";
  EXPECT_EQ(job.carbon_plan().region(), "FR") << job.reason();
  // Moved once FR has lacked it for the heartbeat timeout (10 s: a reconnect moves
  // nothing): time passes a second at a time until it is.
  for (int s = 0; s < 120 && job.carbon_plan().region() == "FR"; ++s) {
    clock_.Step(std::chrono::seconds(1));
    job = WaitFor(
        id, [](const v1::Job& j) { return j.carbon_plan().region() != "FR"; },
        std::chrono::milliseconds(100));
  }
  EXPECT_GE(job.carbon_plan().planned_unix_ms(), kT0 + 10'000) << "not before the timeout";
  EXPECT_EQ(job.carbon_plan().region(), "default") << job.reason();
  EXPECT_EQ(job.carbon_plan().planned_start_unix_ms(), kT0 + 2 * kHour) << "default's green hour";
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find(" in default, forecast 90 g/kWh"), std::string::npos) << job.reason();
}

// A region name from the wire ends up in labels, logs and rows: anything but a short
// [A-Za-z0-9._-] name is refused, and nothing is registered.
TEST_F(CarbonTest, AWorkerWithAMalformedRegionIsRefused) {
  for (const std::string& bad :
       {std::string(65, 'a'), std::string("DE FR"), std::string("DE\n"), std::string("\xff\xfe"),
        std::string("a/b"), std::string("de{x=\"1\"}"), std::string("\0x", 2)}) {
    v1::RegisterWorkerRequest req;
    req.set_host("test");
    req.set_region(bad);
    absl::StatusOr<v1::RegisterWorkerResponse> r = c_->RegisterWorker(req);
    ASSERT_FALSE(r.ok()) << "accepted region of " << bad.size() << " bytes";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("is not a region name"), std::string::npos) << r.status();
  }
  EXPECT_TRUE(c_->ListWorkers().empty());
  v1::RegisterWorkerRequest ok;
  ok.set_host("test");
  ok.set_region("US-CAL-CISO.2_a");
  ASSERT_TRUE(c_->RegisterWorker(ok).ok());
}

TEST(RegionalSourceTest, ARegionIsTheNameBeforeTheFirstEqualsSignWhenItIsOne) {
  using Named = std::pair<std::string, std::string>;
  EXPECT_EQ(*ParseRegionalSource("f.csv", "DE"), (Named{"DE", "f.csv"}));
  EXPECT_EQ(*ParseRegionalSource("FR=f.csv", "DE"), (Named{"FR", "f.csv"}));
  EXPECT_EQ(*ParseRegionalSource("FR=https://h/x?zone=FR", "DE"),
            (Named{"FR", "https://h/x?zone=FR"}));
  EXPECT_EQ(*ParseRegionalSource("https://h/x?zone=FR", "DE"),
            (Named{"DE", "https://h/x?zone=FR"}));
  EXPECT_EQ(*ParseRegionalSource("./a=b.csv", "DE"), (Named{"DE", "./a=b.csv"}));
  EXPECT_EQ(*ParseRegionalSource("/data/a=b.csv", "DE"), (Named{"DE", "/data/a=b.csv"}));
  EXPECT_FALSE(ParseRegionalSource("FR=", "DE").ok());
  EXPECT_FALSE(ParseRegionalSource("", "DE").ok());
  // Endpoints told apart by scheme, host and port (a token goes to one only).
  EXPECT_EQ(UrlOrigin("https://user:pw@API.example.com:8443/v3/x?zone=DE"),
            "https://api.example.com:8443");
  EXPECT_EQ(UrlOrigin("http://api.example.com?zone=FR"), "http://api.example.com");
  EXPECT_EQ(UrlOrigin("https://api.example.com:443/x"), UrlOrigin("https://api.example.com/y"));
  EXPECT_EQ(UrlOrigin("http://[::1]:80/x"), "http://[::1]");
  EXPECT_EQ(UrlOrigin("http://[::1]:8080/x"), "http://[::1]:8080");
  EXPECT_NE(UrlOrigin("http://api.example.com/x"), UrlOrigin("https://api.example.com/x"));
  EXPECT_TRUE(IsUrlSource("https://h/x"));
  EXPECT_FALSE(IsUrlSource("./https.csv"));
}

TEST_F(CarbonTest, ADeadlineInThePastOrNoneIsRefused) {
  bool existing = false;
  absl::StatusOr<int64_t> past = c_->Submit(CarbonSpec(kT0 - 1000), "", &existing);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("has passed"), std::string::npos) << past.status();
  v1::JobSpec none = CarbonSpec(0);
  EXPECT_EQ(c_->Submit(none, "", &existing).status().code(), absl::StatusCode::kInvalidArgument);
  v1::JobSpec both = CarbonSpec(kT0 + kHour);
  both.set_finish_by_unix_ms(kT0 + 2 * kHour);
  EXPECT_EQ(c_->Submit(both, "", &existing).status().code(), absl::StatusCode::kInvalidArgument);
  v1::JobSpec not_aware = testing::SmallMlpSpec(1);
  not_aware.set_finish_by_unix_ms(kT0 + 2 * kHour);
  absl::StatusOr<int64_t> refused = c_->Submit(not_aware, "", &existing);
  EXPECT_NE(refused.status().message().find("set carbon_aware"), std::string::npos)
      << refused.status();
}

// The source reads a change only once two looks see it unchanged (not a file half
// written), keeps its last good forecast for a while after a bad one, then has none.
TEST(CarbonSourceTest, AChangeIsReadWhenItHoldsStillAndABadFileKeepsTheLastGoodForAWhile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("joule_carbon_", getpid(), "_source");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / "forecast.csv";
  CarbonIntensitySource missing((dir / "none.csv").string());
  EXPECT_TRUE(missing.Refresh(kT0));
  EXPECT_NE(missing.Get().error.find("No such file"), std::string::npos) << missing.Get().error;
  WriteForecast(path, HourlyCsv({400, 100}));
  CarbonIntensitySource source(path.string());
  ASSERT_TRUE(source.Refresh(kT0)) << "the first look reads at once";
  const std::string first = source.Get().digest;
  ASSERT_FALSE(first.empty()) << source.Get().error;
  // Half written (a value cut short), then whole: only the whole file is read.
  const std::string whole = HourlyCsv({300, 200, 123});
  WriteForecast(path, whole.substr(0, whole.size() - 3));
  EXPECT_FALSE(source.Refresh(kT0));
  EXPECT_EQ(source.Get().digest, first);
  WriteForecast(path, whole);
  EXPECT_FALSE(source.Refresh(kT0)) << "changed again since the last look";
  EXPECT_TRUE(source.Refresh(kT0));
  ASSERT_NE(source.Get().series, nullptr);
  EXPECT_DOUBLE_EQ(source.Get().series->At(kT0 + 2 * kHour).value_or(0), 123);
  const std::string second = source.Get().digest;
  // Garbage: the last good forecast stays, with the error, for kKeepLastGoodMs.
  WriteForecast(path, "time,gco2_per_kwh\nsoon,1\n");
  EXPECT_FALSE(source.Refresh(kT0));
  EXPECT_TRUE(source.Refresh(kT0));
  EXPECT_EQ(source.Get().digest, second);
  EXPECT_NE(source.Get().series, nullptr);
  EXPECT_NE(source.Get().error.find("line 2"), std::string::npos) << source.Get().error;
  EXPECT_FALSE(source.Refresh(kT0 + CarbonIntensitySource::kKeepLastGoodMs - 1));
  EXPECT_TRUE(source.Refresh(kT0 + CarbonIntensitySource::kKeepLastGoodMs));
  EXPECT_EQ(source.Get().series, nullptr);
  EXPECT_TRUE(source.Get().digest.empty());
  EXPECT_FALSE(source.Get().error.empty());
  // A good one again.
  WriteForecast(path, HourlyCsv({250, 250, 250, 250}));
  EXPECT_FALSE(source.Refresh(kT0 + kHour));
  EXPECT_TRUE(source.Refresh(kT0 + kHour));
  EXPECT_NE(source.Get().series, nullptr);
  EXPECT_TRUE(source.Get().error.empty());
  std::filesystem::remove_all(dir);
}

// An HTTP source: polled on its own thread with the token from its file; its name and
// errors hold neither the URL's query nor the token; a refused token, an endpoint too slow
// for the timeout, garbage and an answer too large fail it, and the last good forecast is
// kept for kKeepLastGoodMs, then dropped; a good answer brings it back.
TEST(CarbonSourceTest, AUrlIsPolledWithItsTokenAndAnOutageKeepsTheLastGoodForAWhile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("joule_carbon_", getpid(), "_url");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path token = dir / "token";
  std::ofstream(token) << "tok-123\n";
  std::mutex mu;
  std::string body = HourlyCsv({400, 100});
  int delay_ms = 0;
  httplib::Server server;
  server.Get("/forecast", [&](const httplib::Request& req, httplib::Response& res) {
    if (req.get_header_value("Authorization") != "Bearer tok-123" ||
        req.get_param_value("key") != "s3cret") {
      res.status = 401;
      return;
    }
    std::string answer;
    int delay = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      answer = body;
      delay = delay_ms;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    res.set_content(answer, "text/csv");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  const auto set = [&](std::string text, int delay) {
    std::lock_guard<std::mutex> lock(mu);
    body = std::move(text);
    delay_ms = delay;
  };
  {
    CarbonSourceOptions options;
    options.poll = std::chrono::milliseconds(50);
    options.timeout = std::chrono::milliseconds(300);
    options.token_file = token.string();
    CarbonIntensitySource source(absl::StrCat("http://127.0.0.1:", port, "/forecast?key=s3cret"),
                                 options);
    ASSERT_TRUE(source.is_url());
    ASSERT_TRUE(source.Refresh(kT0)) << "the first call waits for the first answer";
    ASSERT_NE(source.Get().series, nullptr) << source.Get().error;
    EXPECT_EQ(source.Get().name, absl::StrCat("http://127.0.0.1:", port, "/forecast (csv)"));
    const std::string first = source.Get().digest;
    // Waits (polls every 50 ms) until Refresh sees `pred`.
    const auto until = [&](const std::function<bool(const CarbonSnapshot&)>& pred, int64_t now) {
      const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!pred(source.Get()) && std::chrono::steady_clock::now() < by) {
        source.Refresh(now);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return pred(source.Get());
    };
    set(HourlyCsv({300, 50, 50}), 0);
    ASSERT_TRUE(until([&](const CarbonSnapshot& s) { return s.digest != first; }, kT0));
    EXPECT_DOUBLE_EQ(source.Get().series->At(kT0 + 2 * kHour).value_or(0), 50);
    const std::string second = source.Get().digest;
    const auto failed = [](const std::string& why) {
      return [why](const CarbonSnapshot& s) { return s.error.find(why) != std::string::npos; };
    };
    const auto keeps = [&] {
      EXPECT_EQ(source.Get().digest, second);
      EXPECT_NE(source.Get().series, nullptr);
      EXPECT_EQ(source.Get().error.find("s3cret"), std::string::npos) << source.Get().error;
      EXPECT_EQ(source.Get().error.find("tok-123"), std::string::npos) << source.Get().error;
    };
    // A token the endpoint refuses.
    std::ofstream(token) << "tok-999\n";
    ASSERT_TRUE(until(failed("HTTP 401"), kT0)) << source.Get().error;
    keeps();
    std::ofstream(token) << "tok-123\n";
    // Garbage; then an answer slower than the timeout; then one too large.
    set("time,gco2_per_kwh\n1800000000,lots\n", 0);
    ASSERT_TRUE(until(failed("is not a number"), kT0)) << source.Get().error;
    keeps();
    set(HourlyCsv({300, 50, 50}), 1000);
    ASSERT_TRUE(until(failed("within 300 ms"), kT0)) << source.Get().error;
    keeps();
    set(std::string(kMaxIntensityFileBytes + 1, '1'), 0);
    ASSERT_TRUE(until(failed("the answer is over"), kT0)) << source.Get().error;
    keeps();
    // The keeping ends.
    EXPECT_TRUE(source.Refresh(kT0 + CarbonIntensitySource::kKeepLastGoodMs));
    EXPECT_EQ(source.Get().series, nullptr);
    // A good answer again.
    set(HourlyCsv({200, 200, 200, 200}), 0);
    ASSERT_TRUE(until([](const CarbonSnapshot& s) { return s.series != nullptr; },
                      kT0 + CarbonIntensitySource::kKeepLastGoodMs));
    EXPECT_TRUE(source.Get().error.empty()) << source.Get().error;
  }
  {
    // Credentials in the URL stay out of its name and errors.
    CarbonSourceOptions options;
    options.timeout = std::chrono::milliseconds(300);
    CarbonIntensitySource source(absl::StrCat("http://joule:pw-9@127.0.0.1:", port, "/forecast"),
                                 options);
    source.Refresh(kT0);
    const CarbonSnapshot got = source.Get();
    EXPECT_EQ(got.name.find("pw-9"), std::string::npos) << got.name;
    EXPECT_EQ(got.error.find("pw-9"), std::string::npos) << got.error;
  }
  server.stop();
  serving.join();
  std::filesystem::remove_all(dir);
}

TEST(AccountCarbonTest, EachIntervalsEnergyAtItsIntensity) {
  const IntensitySeries s = *IntensitySeries::Parse(HourlyCsv({100, 300}));
  v1::Job job;
  job.set_created_unix_ms(kT0);
  v1::AttemptSummary* a = job.mutable_result()->add_attempts();
  a->set_started_unix_ms(kT0 + kHour / 2);
  v1::RankPower* p = a->add_power();
  // 3.6 MJ (1 kWh) in the first half hour (at 100), 7.2 MJ in the next (at 300).
  v1::PowerSample* s1 = p->add_samples();
  s1->set_elapsed_seconds(1800);
  s1->set_joules(3.6e6);
  v1::PowerSample* s2 = p->add_samples();
  s2->set_elapsed_seconds(3600);
  s2->set_joules(10.8e6);
  v1::PowerSample* s3 = p->add_samples();  // past the forecast: not counted
  s3->set_elapsed_seconds(7200);
  s3->set_joules(14.4e6);
  const v1::CarbonAccount c = AccountCarbon(job, s, "f");
  EXPECT_NEAR(c.grams(), 100 + 2 * 300, 1e-9);
  EXPECT_NEAR(c.joules_covered(), 10.8e6, 1e-6);
  EXPECT_NEAR(c.mean_gco2_per_kwh(), 700 / 3.0, 1e-9);
  EXPECT_NEAR(c.grams_at_submit(), 3 * 100, 1e-9);
  EXPECT_EQ(c.source(), "f");
  // Once it has run (90 minutes from its first start to its end), the comparison is the
  // mean over 90 minutes from submit: (100 x 60 + 300 x 30) / 90; a garbled elapsed time
  // is not counted (nor overflows).
  job.set_started_unix_ms(kT0 + kHour / 2);
  job.set_finished_unix_ms(kT0 + 2 * kHour);
  v1::PowerSample* garbled = p->add_samples();
  garbled->set_elapsed_seconds(1e300);
  garbled->set_joules(20e6);
  const v1::CarbonAccount ran = AccountCarbon(job, s, "f");
  EXPECT_NEAR(ran.grams(), 100 + 2 * 300, 1e-9);
  EXPECT_NEAR(ran.grams_at_submit(), 3 * (100 * 60 + 300 * 30) / 90.0, 1e-9);
}

// Two ranks in two regions: each one's energy at its own region's intensity, and at
// submit in its own region; a rank in a region with no forecast is not counted; an attempt
// from before regions (no rank_regions) counts in the coordinator's.
TEST(AccountCarbonTest, EachRanksEnergyAtItsRegionsIntensity) {
  RegionalForecast forecast;
  forecast.several_regions = true;
  forecast.by_region["DE"].series =
      std::make_shared<IntensitySeries>(*IntensitySeries::Parse(HourlyCsv({400, 400})));
  forecast.by_region["DE"].name = "de.csv (csv)";
  forecast.by_region["FR"].series =
      std::make_shared<IntensitySeries>(*IntensitySeries::Parse(HourlyCsv({50, 50})));
  forecast.by_region["FR"].name = "fr.csv (csv)";
  v1::Job job;
  job.set_created_unix_ms(kT0);
  v1::AttemptSummary* a = job.mutable_result()->add_attempts();
  a->set_started_unix_ms(kT0);
  for (const char* region : {"DE", "FR", "NL"}) a->add_rank_regions(region);
  for (int rank = 0; rank < 3; ++rank) {
    v1::RankPower* p = a->add_power();
    p->set_rank(rank);
    v1::PowerSample* s = p->add_samples();
    s->set_elapsed_seconds(1800);
    s->set_joules(3.6e6);  // 1 kWh each
  }
  std::optional<v1::CarbonAccount> c = AccountCarbonInRegions(job, forecast, "DE");
  ASSERT_TRUE(c.has_value());
  EXPECT_NEAR(c->grams(), 400 + 50, 1e-9);
  EXPECT_NEAR(c->joules_covered(), 7.2e6, 1e-6);
  EXPECT_NEAR(c->grams_at_submit(), 400 + 50, 1e-9);
  EXPECT_EQ(c->source(), "DE: de.csv (csv); FR: fr.csv (csv)");
  // No rank_regions: every rank in the coordinator's region.
  a->clear_rank_regions();
  c = AccountCarbonInRegions(job, forecast, "FR");
  ASSERT_TRUE(c.has_value());
  EXPECT_NEAR(c->grams(), 3 * 50, 1e-9);
  EXPECT_EQ(c->source(), "FR: fr.csv (csv)");
  // Only regions without a forecast: no account.
  EXPECT_FALSE(AccountCarbonInRegions(job, forecast, "NL").has_value());
  // A region whose forecast does not cover the submit time: no figure at submit (half of
  // the energy compared with all of it would show a loss).
  forecast.by_region["FR"].series = std::make_shared<IntensitySeries>(
      *IntensitySeries::Parse(HourlyCsv({50, 50}, kT0 + kHour / 4)));
  for (int rank = 0; rank < 3; ++rank) {
    a->add_rank_regions(rank == 0 ? "DE" : "FR");
    a->mutable_power(rank)->mutable_samples(0)->set_elapsed_seconds(2400);
  }
  c = AccountCarbonInRegions(job, forecast, "DE");
  ASSERT_TRUE(c.has_value());
  EXPECT_NEAR(c->grams(), 400 + 2 * 50, 1e-9);
  EXPECT_EQ(c->grams_at_submit(), 0) << "FR's series begins after the submit";
}

}  // namespace
}  // namespace joule::server
