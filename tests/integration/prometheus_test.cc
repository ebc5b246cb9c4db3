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
#include "tests/testing/process.h"

namespace joule {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::RunCommand;

const std::string kBin = JOULE_BIN_DIR;

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

std::string HttpGet(const std::string& url, const std::string& query = "") {
  std::vector<std::string> argv = {"/usr/bin/curl", "-sf", "--max-time", "5", url};
  if (!query.empty()) {
    argv.insert(argv.end(), {"-G", "--data-urlencode", "query=" + query});
  }
  std::string out;
  if (RunCommand(argv, &out) != 0) return "";
  return out;
}

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists("/usr/bin/prometheus"))
        << "install Debian's prometheus (scripts/install-deps.sh)";
    dir_ = fs::temp_directory_path() / ("joule_prom_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    coordinator_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{kBin + "/joule-coordinator", "--listen", "127.0.0.1:0",
                                 "--metrics-listen", "127.0.0.1:0", "--db",
                                 (dir_ / "jobs.db").string(), "--address-file",
                                 (dir_ / "addr").string(), "--insecure"},
        (dir_ / "coordinator.log").string());
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (metrics_.empty() && std::chrono::steady_clock::now() < deadline) {
      std::ifstream f(dir_ / "addr");
      f >> address_ >> metrics_;
      if (metrics_.empty()) std::this_thread::sleep_for(20ms);
    }
    ASSERT_FALSE(metrics_.empty()) << "coordinator did not start";
    for (int i = 0; i < 2; ++i) {
      // No powercap here, so the energy is `estimated` on any machine.
      workers_.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{kBin + "/joule-worker", "--coordinator", address_,
                                   "--threads", "1", "--powercap-root",
                                   (dir_ / "no-powercap").string(), "--insecure"},
          (dir_ / ("worker-" + std::to_string(i) + ".log")).string()));
    }
    prom_port_ = FreePort();
    std::ofstream(dir_ / "prometheus.yml")
        << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n"
        << "  - job_name: joule-coordinator\n"
        << "    static_configs: [{targets: ['" << metrics_ << "']}]\n"
        << "  - job_name: joule-workers\n"
        << "    http_sd_configs:\n"
        << "      - url: http://" << metrics_ << "/http_sd\n"
        << "        refresh_interval: 1s\n";
    prometheus_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/prometheus",
                                 "--config.file=" + (dir_ / "prometheus.yml").string(),
                                 "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
                                 "--web.listen-address=127.0.0.1:" + std::to_string(prom_port_)},
        (dir_ / "prometheus.log").string());
    prom_ = "http://127.0.0.1:" + std::to_string(prom_port_);
    deadline = std::chrono::steady_clock::now() + 60s;
    while (HttpGet(prom_ + "/-/ready").empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(100ms);
    }
    ASSERT_FALSE(HttpGet(prom_ + "/-/ready").empty()) << "prometheus did not start; see " << dir_;
    stub_ = v1::JobService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    prometheus_.reset();
    workers_.clear();
    coordinator_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
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

  v1::Job Get(int64_t id) {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    EXPECT_TRUE(stub_->GetJob(&ctx, req, &job).ok());
    return job;
  }

  fs::path dir_;
  std::string address_, metrics_, prom_;
  int prom_port_ = 0;
  std::unique_ptr<ChildProcess> coordinator_, prometheus_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(PrometheusTest, ScrapesEveryRankAndTheReportMatchesTheCounters) {
  // Wait until Prometheus has discovered both workers through http_sd.
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (Query("up{job=\"joule-workers\"} == 1").size() < 2 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_EQ(Query("up{job=\"joule-workers\"} == 1").size(), 2u)
      << "http_sd: " << HttpGet("http://" + metrics_ + "/http_sd");

  v1::SubmitJobRequest req;
  v1::JobSpec* s = req.mutable_spec();
  s->set_model("mlp");
  s->set_dataset("fashion-mnist");
  s->set_workers(2);
  s->set_global_batch_size(128);
  s->set_epochs(2);
  s->mutable_optimizer()->set_lr(0.05);
  s->mutable_optimizer()->set_momentum(0.9);
  v1::SubmitJobResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SubmitJob(&ctx, req, &resp).ok());
  }
  const std::string job = std::to_string(resp.job_id());

  // While it runs: power for both workers, energy for both ranks.
  deadline = std::chrono::steady_clock::now() + 60s;
  while (Query("joule_energy_joules_total{joule_job=\"" + job + "\"}").empty() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(200ms);
  }
  nlohmann::json power = Query("joule_power_watts");
  EXPECT_EQ(power.size(), 2u) << power.dump();
  for (const auto& p : power) {
    EXPECT_GE(Value(p), 0.0);
    EXPECT_LT(Value(p), 10000.0);
    EXPECT_EQ(p["metric"]["source"], "estimated");  // --powercap-root names nothing
  }

  v1::Job done;
  deadline = std::chrono::steady_clock::now() + 120s;
  do {
    std::this_thread::sleep_for(200ms);
    done = Get(resp.job_id());
  } while (done.state() == v1::JOB_STATE_RUNNING && std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.reason();
  const double report_joules = done.result().energy().total_joules();
  ASSERT_GT(report_joules, 0.0);
  EXPECT_TRUE(done.result().energy().estimated());

  // After the last scrapes, Prometheus's counters sum to the report, rank by rank.
  const std::string sum_query = "sum(joule_energy_joules_total{joule_job=\"" + job + "\"})";
  double scraped = 0;
  deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    nlohmann::json r = Query(sum_query);
    scraped = r.empty() ? 0 : Value(r[0]);
    if (std::abs(scraped - report_joules) <= 1e-6 * report_joules) break;
    std::this_thread::sleep_for(250ms);
  }
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

  // Samples and steps per rank: 2 epochs x 468 steps x 64 samples.
  for (const auto& r : Query("joule_samples_total{joule_job=\"" + job + "\"}")) {
    EXPECT_DOUBLE_EQ(Value(r), 2 * 468 * 64) << r.dump();
  }
  nlohmann::json steps = Query("joule_step_duration_seconds_count{joule_job=\"" + job + "\"}");
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& r : steps) EXPECT_DOUBLE_EQ(Value(r), 2 * 468);
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
  deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    coord = Query(coord_query);
    if (coord.size() == 1 && std::abs(Value(coord[0]) - report_joules) <= 1e-6 * report_joules) {
      break;
    }
    std::this_thread::sleep_for(250ms);
  }
  ASSERT_EQ(coord.size(), 1u);
  EXPECT_NEAR(Value(coord[0]), report_joules, 1e-6 * report_joules);
  nlohmann::json idle = Query("joule_workers{state=\"idle\",device_kind=\"cpu\"}");
  ASSERT_EQ(idle.size(), 1u);
}

}  // namespace
}  // namespace joule
