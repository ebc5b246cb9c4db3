// Carbon-aware jobs, sweeps and searches end to end (issue 31): a coordinator reading a
// forecast file whose green hours lie ahead, and the real CLI's --carbon-aware flags.
// The jobs wait PENDING with the plan as their reason (no worker is needed to see it).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "joule/v1/job.grpc.pb.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/scratch_dir.h"

namespace joule {
namespace {

using testing::ChildProcess;
using testing::LocalCluster;
using testing::ProgramPath;
using testing::ScratchDir;
using namespace std::chrono_literals;

constexpr int64_t kHourMs = 3'600'000;

// Hourly from the hour before now: 500 g/kWh, but 100 from 3 to 5 hours after that hour.
std::string Forecast(int64_t* green_ms) {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t from = now / kHourMs * kHourMs - kHourMs;
  *green_ms = from + 3 * kHourMs;
  std::string csv = "time,gco2_per_kwh\n";
  for (int h = 0; h < 24; ++h) {
    absl::StrAppend(&csv, (from + h * kHourMs) / 1000, ",", h == 3 || h == 4 ? 100 : 500, "\n");
  }
  return csv;
}

class CarbonClusterTest : public ::testing::Test {
 protected:
  static testing::LocalClusterOptions Options(const ScratchDir& dir, int64_t* green_ms) {
    std::ofstream(dir / "forecast.csv") << Forecast(green_ms);
    testing::LocalClusterOptions o;
    o.data_roots = {dir.path().string(), "/usr/share/datasets"};
    o.coordinator_flags = {"--carbon-intensity", (dir / "forecast.csv").string(), "--web-ui"};
    o.metrics_listen = "127.0.0.1:0";
    return o;
  }
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator());
    cluster_.StartWorkers(1);  // idle throughout: every job waits for its plan
    ASSERT_TRUE(cluster_.WaitIdleWorkers(1, 30s));
  }

  std::vector<v1::Job> Labelled(const std::string& key, const std::string& value) {
    v1::ListJobsRequest req;
    (*req.mutable_labels())[key] = value;
    grpc::ClientContext ctx;
    v1::ListJobsResponse resp;
    EXPECT_TRUE(cluster_.stub().ListJobs(&ctx, req, &resp).ok());
    return {resp.jobs().begin(), resp.jobs().end()};
  }
  void ExpectWaitingForTheGreenHours(const v1::Job& job) {
    EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING) << job.reason();
    EXPECT_NE(job.reason().find("carbon-aware: waiting for "), std::string::npos) << job.reason();
    EXPECT_NE(job.reason().find("forecast 100 g/kWh against 500 now"), std::string::npos)
        << job.reason();
    EXPECT_GE(job.carbon_plan().planned_start_unix_ms(), green_ms_);
    EXPECT_LT(job.carbon_plan().planned_start_unix_ms(), green_ms_ + 2 * kHourMs);
  }

  ScratchDir dir_{"carbon"};
  int64_t green_ms_ = 0;
  LocalCluster cluster_{dir_.path(), Options(dir_, &green_ms_)};
};

TEST_F(CarbonClusterTest, SubmitSweepAndTuneFlagsMakeEveryJobWaitForTheGreenHours) {
  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << "name: green\nmodel: logreg\nepochs: 1\nglobal_batch_size: 64\n"
                        "max_train_samples: 2000\n";
  std::string out;
  ASSERT_EQ(cluster_.Cli({"submit", "-f", job, "--carbon-aware", "--start-before", "+8h",
                          "--expected-duration", "30m"},
                         &out),
            0)
      << out;
  const int64_t id = std::stoll(out);
  ExpectWaitingForTheGreenHours(cluster_.Get(id));
  // Its page in the web UI says when it starts, against what.
  const std::vector<std::string> browse = {
      "/usr/bin/python3",
      std::string(JOULE_SOURCE_DIR) + "/tests/testing/browse.py",
      "http://" + cluster_.metrics_address() + "/ui/job?id=" + std::to_string(id),
      "--wait-js",
      "document.getElementById('facts').textContent.includes('carbon-aware start')",
      "--eval-js",
      "document.getElementById('facts').textContent"};
  const int rc = testing::RunCommand(browse, &out);
  if (rc != 77) {  // 77: no chromium
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("(forecast 100 g/kWh against 500 at submit)"), std::string::npos) << out;
  }

  // A sweep: every cell carbon-aware, with one deadline (+8h counted once).
  const std::string sweep = (dir_ / "sweep.yaml").string();
  std::ofstream(sweep) << "name: green-sweep\n"
                          "base: {model: logreg, epochs: 1, max_train_samples: 2000}\n"
                          "grid:\n  global_batch_size: [64, 128, 256]\n";
  EXPECT_EQ(cluster_.Cli({"sweep", "run", sweep, "--carbon-aware", "--start-before", "+8h",
                          "--expected-duration", "10m", "--timeout", "2"},
                         &out),
            1)
      << out;
  std::vector<v1::Job> cells = Labelled("sweep", "green-sweep");
  ASSERT_EQ(cells.size(), 3u) << out;
  std::set<int64_t> deadlines;
  for (const v1::Job& j : cells) {
    ExpectWaitingForTheGreenHours(j);
    EXPECT_DOUBLE_EQ(j.spec().expected_run_seconds(), 600);
    deadlines.insert(j.spec().start_before_unix_ms());
  }
  EXPECT_EQ(deadlines.size(), 1u) << "one deadline for every cell";

  // --finish-by with neither a length nor an estimate: refused before anything is sent.
  EXPECT_EQ(cluster_.Cli({"sweep", "run", sweep, "--set", "name=other", "--carbon-aware",
                          "--finish-by", "+8h"},
                         &out),
            2)
      << out;
  EXPECT_NE(out.find("--finish-by needs the run's length"), std::string::npos) << out;
  EXPECT_TRUE(Labelled("sweep", "other").empty());
  // A deadline that does not parse names its flag.
  EXPECT_EQ(cluster_.Cli({"sweep", "run", sweep, "--carbon-aware", "--start-before", "soon"}, &out),
            2)
      << out;
  EXPECT_NE(out.find("--start-before: \"soon\" is neither an RFC 3339 time"), std::string::npos)
      << out;

  // A search: its first rung's jobs wait too (the client is stopped once they are in).
  const std::string tune = (dir_ / "tune.yaml").string();
  std::ofstream(tune) << "name: green-tune\n"
                         "base: {model: logreg, epochs: 2, max_train_samples: 2000,\n"
                         "       global_batch_size: 64}\n"
                         "grid:\n  workers: [1]\n  intra_op_threads: [1, 2]\n"
                         "target_accuracy: 0.7\n";
  ChildProcess client(
      {ProgramPath("joule"), "--coordinator", cluster_.address(), "--insecure", "tune", "run", tune,
       "--carbon-aware", "--start-before", "+8h", "--expected-duration", "10m"},
      (dir_ / "tune.log").string());
  std::vector<v1::Job> rung;
  const auto by = std::chrono::steady_clock::now() + 60s;
  while (rung.size() < 2 && std::chrono::steady_clock::now() < by) {
    std::this_thread::sleep_for(50ms);
    rung = Labelled("tune", "green-tune");
  }
  client.Signal(SIGKILL);
  ASSERT_EQ(rung.size(), 2u) << testing::Slurp(dir_ / "tune.log");
  for (const v1::Job& j : rung) ExpectWaitingForTheGreenHours(j);
}

// Two grid regions: the coordinator's (DE, the forecast above) and FR, whose green hour
// is greener; a worker in each. A carbon-aware job is planned in FR, and
// `joule workers`, `joule status` and /metrics say where.
class CarbonRegionsTest : public ::testing::Test {
 protected:
  static testing::LocalClusterOptions Options(const ScratchDir& dir, int64_t* green_ms) {
    std::ofstream(dir / "de.csv") << Forecast(green_ms);
    // FR: 300 g/kWh, 50 in DE's first green hour (2 hours after now's: a run from now
    // never reaches it, so "now" is 300 whatever the minute).
    std::string fr = "time,gco2_per_kwh\n";
    for (int h = 0; h < 24; ++h) {
      absl::StrAppend(&fr, (*green_ms - 3 * kHourMs + h * kHourMs) / 1000, ",", h == 3 ? 50 : 300,
                      "\n");
    }
    std::ofstream(dir / "fr.csv") << fr;
    testing::LocalClusterOptions o;
    o.data_roots = {dir.path().string(), "/usr/share/datasets"};
    o.coordinator_flags = {"--region",           "DE",
                           "--carbon-intensity", (dir / "de.csv").string(),
                           "--carbon-intensity", "FR=" + (dir / "fr.csv").string()};
    o.metrics_listen = "127.0.0.1:0";
    return o;
  }
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator());
    cluster_.StartWorkers(1);
    cluster_.StartWorkers(1, {"--region", "FR"});
    ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  }

  ScratchDir dir_{"carbon_regions"};
  int64_t green_ms_ = 0;  // DE's green hours; FR's is the first of them
  LocalCluster cluster_{dir_.path(), Options(dir_, &green_ms_)};
};

TEST_F(CarbonRegionsTest, AJobWaitsForTheGreenerRegionAndEveryViewSaysWhere) {
  std::string out;
  ASSERT_EQ(cluster_.Cli({"workers"}, &out), 0) << out;
  EXPECT_NE(out.find("REGION"), std::string::npos) << out;
  EXPECT_NE(out.find(" DE "), std::string::npos) << out;
  EXPECT_NE(out.find(" FR "), std::string::npos) << out;

  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << "name: green\nmodel: logreg\nepochs: 1\nglobal_batch_size: 64\n"
                        "max_train_samples: 2000\n";
  ASSERT_EQ(cluster_.Cli({"submit", "-f", job, "--carbon-aware", "--start-before", "+8h",
                          "--expected-duration", "30m"},
                         &out),
            0)
      << out;
  const v1::Job j = cluster_.Get(std::stoll(out));
  EXPECT_EQ(j.state(), v1::JOB_STATE_PENDING) << j.reason();
  EXPECT_EQ(j.carbon_plan().region(), "FR");
  EXPECT_GE(j.carbon_plan().planned_start_unix_ms(), green_ms_);
  EXPECT_LT(j.carbon_plan().planned_start_unix_ms(), green_ms_ + kHourMs);
  EXPECT_NE(j.reason().find(" in FR, forecast 50 g/kWh against 300 now"), std::string::npos)
      << j.reason();
  ASSERT_EQ(cluster_.Cli({"status", std::to_string(j.id())}, &out), 0) << out;
  EXPECT_NE(out.find(" in region FR"), std::string::npos) << out;

  // Each region's intensity now, by its label (set by the heartbeat thread's pass).
  const auto by = std::chrono::steady_clock::now() + 30s;
  std::string metrics;
  while (std::chrono::steady_clock::now() < by) {
    metrics = testing::HttpGet("http://" + cluster_.metrics_address() + "/metrics");
    if (metrics.find("joule_grid_carbon_intensity_gco2_per_kwh{region=\"FR\"} 300") !=
            std::string::npos &&
        metrics.find("joule_grid_carbon_intensity_gco2_per_kwh{region=\"DE\"} 500") !=
            std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_NE(metrics.find("joule_grid_carbon_intensity_gco2_per_kwh{region=\"FR\"} 300"),
            std::string::npos)
      << metrics.substr(0, 4000);
  EXPECT_NE(metrics.find("joule_grid_carbon_intensity_gco2_per_kwh{region=\"DE\"} 500"),
            std::string::npos);
}

}  // namespace
}  // namespace joule
