// Integration: a real Prometheus server (Debian's `prometheus`) discovers the workers
// through the coordinator's http_sd endpoint, scrapes a running job, and the test checks
// through Prometheus's HTTP API what a user's dashboard would show.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "joule/v1/job.grpc.pb.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/scratch_dir.h"

namespace joule {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::HttpGet;
using testing::LocalCluster;
using testing::PollUntil;
using testing::RunCommand;
using testing::ScratchDir;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists("/usr/bin/prometheus"))
        << "install Debian's prometheus (scripts/install-deps.sh)";
    ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator());
    ASSERT_FALSE(cluster_.metrics_address().empty()) << "the coordinator serves no metrics";
    cluster_.StartWorkers(2);
    const std::string metrics = cluster_.metrics_address();
    prom_port_ = FreePort();
    std::ofstream(dir_ / "prometheus.yml")
        << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n"
        << "  - job_name: joule-coordinator\n"
        << "    static_configs: [{targets: ['" << metrics << "']}]\n"
        << "  - job_name: joule-workers\n"
        << "    http_sd_configs:\n"
        << "      - url: http://" << metrics << "/http_sd\n"
        << "        refresh_interval: 1s\n";
    prometheus_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/prometheus",
                                 "--config.file=" + (dir_ / "prometheus.yml").string(),
                                 "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
                                 "--web.listen-address=127.0.0.1:" + std::to_string(prom_port_)},
        (dir_ / "prometheus.log").string());
    prom_ = "http://127.0.0.1:" + std::to_string(prom_port_);
    ASSERT_TRUE(PollUntil([&] { return !HttpGet(prom_ + "/-/ready").empty(); }, 60s, 100ms))
        << "prometheus did not start; see " << dir_.path();
  }

  // Runs an instant query; returns the result vector (empty on any error).
  nlohmann::json Query(const std::string& promql) {
    std::string body = HttpGet(prom_ + "/api/v1/query", promql);
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return nlohmann::json::array();
    return j["data"]["result"];
  }

  static double Value(const nlohmann::json& sample) {
    return std::stod(sample["value"][1].get<std::string>());
  }

  // The job's progress series: the last epoch and the accuracy after it, as the report has
  // it (waits for a scrape after the job's end).
  void ExpectProgress(const std::string& job, double accuracy, int epochs) {
    nlohmann::json scraped;
    PollUntil(
        [&] {
          scraped = Query("joule_test_accuracy_ratio{joule_job=\"" + job + "\"}");
          return !scraped.empty() && std::abs(Value(scraped[0]) - accuracy) <= 1e-9;
        },
        20s, 250ms);
    ASSERT_FALSE(scraped.empty());
    for (const auto& r : scraped) EXPECT_NEAR(Value(r), accuracy, 1e-9) << r.dump();
    for (const auto& r : Query("joule_epoch{joule_job=\"" + job + "\"}")) {
      EXPECT_EQ(Value(r), epochs) << r.dump();
    }
  }

  static testing::LocalClusterOptions Options(const ScratchDir& dir) {
    testing::LocalClusterOptions o;
    o.metrics_listen = "127.0.0.1:0";
    // No powercap here, so the workers' energy is `estimated` on any machine.
    o.worker_flags = {"--powercap-root", (dir / "no-powercap").string(), "--perf-power-pmu", ""};
    return o;
  }

  ScratchDir dir_{"prom"};
  LocalCluster cluster_{dir_.path(), Options(dir_)};
  std::string prom_;
  int prom_port_ = 0;
  std::unique_ptr<ChildProcess> prometheus_;  // stopped before the cluster
};

TEST_F(PrometheusTest, ScrapesEveryRankAndTheReportMatchesTheCounters) {
  // Wait until Prometheus has discovered both workers through http_sd.
  PollUntil([&] { return Query("up{job=\"joule-workers\"} == 1").size() >= 2; }, 60s, 200ms);
  ASSERT_EQ(Query("up{job=\"joule-workers\"} == 1").size(), 2u)
      << "http_sd: " << HttpGet("http://" + cluster_.metrics_address() + "/http_sd");

  // Two epochs (the counters carry across an epoch's end) of kStepsPerEpoch steps: what
  // the checks below need, and no more.
  constexpr int kEpochs = 2, kGlobalBatch = 128, kLocalBatch = kGlobalBatch / 2;
  constexpr int kStepsPerEpoch = 100;
  v1::JobSpec s;
  s.set_model("mlp");
  s.set_dataset("fashion-mnist");
  s.set_workers(2);
  s.set_global_batch_size(kGlobalBatch);
  s.set_epochs(kEpochs);
  s.set_max_train_samples(kStepsPerEpoch * kGlobalBatch);
  s.set_max_test_samples(2000);
  s.mutable_optimizer()->set_lr(0.05);
  s.mutable_optimizer()->set_momentum(0.9);
  const int64_t id = cluster_.Submit(s);
  ASSERT_GT(id, 0);
  const std::string job = std::to_string(id);

  // Once a scrape has the job: power for both workers, energy for both ranks.
  PollUntil([&] { return !Query("joule_energy_joules_total{joule_job=\"" + job + "\"}").empty(); },
            60s, 200ms);
  nlohmann::json power = Query("joule_power_watts");
  EXPECT_EQ(power.size(), 2u) << power.dump();
  for (const auto& p : power) {
    EXPECT_GE(Value(p), 0.0);
    EXPECT_LT(Value(p), 10000.0);
    EXPECT_EQ(p["metric"]["source"], "estimated");  // no powercap, no perf PMU
  }

  const v1::Job done = cluster_.WaitDone(id, 120s);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.reason();
  const double report_joules = done.result().energy().total_joules();
  ASSERT_GT(report_joules, 0.0);
  EXPECT_TRUE(done.result().energy().estimated());

  // After the last scrapes, Prometheus's counters sum to the report, rank by rank.
  const std::string sum_query = "sum(joule_energy_joules_total{joule_job=\"" + job + "\"})";
  double scraped = 0;
  PollUntil(
      [&] {
        nlohmann::json r = Query(sum_query);
        scraped = r.empty() ? 0 : Value(r[0]);
        return std::abs(scraped - report_joules) <= 1e-6 * report_joules;
      },
      20s, 250ms);
  EXPECT_NEAR(scraped, report_joules, 1e-6 * report_joules);

  std::set<std::string> ranks;
  for (const auto& r : Query("sum by (joule_rank) (joule_energy_joules_total{joule_job=\"" + job + "\"})")) {
    ranks.insert(r["metric"]["joule_rank"]);
    EXPECT_GT(Value(r), 0.0);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
  std::set<std::string> phases;
  for (const auto& r : Query("sum by (phase) (joule_energy_joules_total{joule_job=\"" + job + "\"})")) {
    phases.insert(r["metric"]["phase"]);
  }
  for (const char* phase : {"forward", "backward", "communication", "optimizer"}) {
    EXPECT_TRUE(phases.contains(phase)) << phase;
  }

  // Samples and steps per rank: epochs x steps per epoch (x the local batch).
  for (const auto& r : Query("joule_samples_total{joule_job=\"" + job + "\"}")) {
    EXPECT_DOUBLE_EQ(Value(r), kEpochs * kStepsPerEpoch * kLocalBatch) << r.dump();
  }
  nlohmann::json steps = Query("joule_step_duration_seconds_count{joule_job=\"" + job + "\"}");
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& r : steps) EXPECT_DOUBLE_EQ(Value(r), kEpochs * kStepsPerEpoch);
  nlohmann::json mean_step = Query(
      "sum(joule_step_duration_seconds_sum{joule_job=\"" + job + "\"}) / "
      "sum(joule_step_duration_seconds_count{joule_job=\"" + job + "\"})");
  ASSERT_EQ(mean_step.size(), 1u);
  EXPECT_GT(Value(mean_step[0]), 0.0);
  EXPECT_LT(Value(mean_step[0]), 1.0);

  // The coordinator's own series: the job's energy (created at 0 when the job started, so
  // wait for a scrape after its end) and its workers.
  const std::string coord_query = "joule_job_energy_joules_total{joule_job=\"" + job + "\"}";
  nlohmann::json coord;
  PollUntil(
      [&] {
        coord = Query(coord_query);
        return coord.size() == 1 &&
               std::abs(Value(coord[0]) - report_joules) <= 1e-6 * report_joules;
      },
      20s, 250ms);
  ASSERT_EQ(coord.size(), 1u);
  EXPECT_NEAR(Value(coord[0]), report_joules, 1e-6 * report_joules);
  ExpectProgress(job, done.result().test_accuracy(), kEpochs);
  nlohmann::json idle = Query("joule_workers{state=\"idle\",device_kind=\"cpu\"}");
  ASSERT_EQ(idle.size(), 1u);
}

}  // namespace
}  // namespace joule
