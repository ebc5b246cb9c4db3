// Integration: the real joule-coordinator and joule-worker processes on 127.0.0.1 with
// ephemeral ports, real Fashion-MNIST, driven over gRPC and through the `joule` CLI.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "joule/v1/job.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_bmc.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/scratch_dir.h"

namespace joule {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::LocalCluster;
using testing::ProgramPath;
using testing::ScratchDir;
using testing::Slurp;
using namespace std::chrono_literals;

// The coordinator declares a silent worker lost after this; the workers give up on a
// collective (a peer gone) after that. Waits for what either timeout causes are bounded by
// them.
constexpr std::chrono::milliseconds kHeartbeatTimeout = 4s;
constexpr std::chrono::milliseconds kCollectiveTimeout = 30s;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator()); }

  void FrozenWorkerIsDeclaredDeadAndTheJobResumes(const std::string& transport);

  // A 2-rank job of one full epoch (468 steps) with a checkpoint every 50 steps: the tests
  // that interrupt it wait for its first checkpoint on disk, then strike.
  v1::JobSpec CheckpointedSpec() {
    v1::JobSpec s = ShortSpec(2);
    s.clear_max_train_samples();
    s.set_global_batch_size(128);
    s.set_epochs(1);
    s.set_checkpoint_every_steps(50);
    return s;
  }

  v1::JobSpec ShortSpec(int workers) {
    v1::JobSpec s;
    s.set_name("short");
    s.set_model("mlp");
    s.set_dataset("fashion-mnist");
    s.set_workers(workers);
    s.set_global_batch_size(32 * workers);
    s.set_epochs(1);
    s.mutable_optimizer()->set_lr(0.05);
    s.mutable_optimizer()->set_momentum(0.9);
    s.set_max_train_samples(6000);
    s.set_max_test_samples(2000);
    return s;
  }

  static testing::LocalClusterOptions Options(const ScratchDir& dir) {
    testing::LocalClusterOptions o;
    o.heartbeat_timeout = kHeartbeatTimeout;
    o.data_roots = {dir.path().string(), "/usr/share/datasets"};
    o.collective_timeout = kCollectiveTimeout;
    o.checkpoint_root = (dir / "checkpoints").string();
    return o;
  }

  ScratchDir dir_{"it"};
  LocalCluster cluster_{dir_.path(), Options(dir_)};
};

TEST_F(ClusterTest, ShortJobSucceedsWithIdenticalParametersOnEveryRank) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec spec = ShortSpec(2);
  spec.set_epochs(2);
  spec.set_checkpoint_every_epochs(1);  // a checkpoint after epoch 1, in the job's log
  int64_t id = cluster_.Submit(spec);
  v1::Job job = cluster_.WaitDone(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  ASSERT_EQ(job.result().ranks_size(), 2);
  EXPECT_GT(job.result().test_accuracy(), 0.65);  // chance is 0.10
  EXPECT_EQ(job.result().ranks(0).parameter_hash(), job.result().ranks(1).parameter_hash());
  EXPECT_EQ(job.result().samples(), 2 * (6000 / 64) * 64);
  EXPECT_GT(job.result().samples_per_second(), 0);
  {
    // The workers heartbeat over UDP (the coordinator's default), every beat genuine: the
    // first beats come an interval (1 s) after registration, which may be after the job.
    auto value = [](const std::string& metrics, const std::string& series) {
      const size_t at = metrics.find(series + " ");
      return at == std::string::npos ? -1.0 : std::stod(metrics.substr(at + series.size() + 1));
    };
    const std::string taken = "joule_coordinator_liveness_datagrams_total{outcome=\"taken\"}";
    const std::string refused = "joule_coordinator_liveness_datagrams_total{outcome=\"refused\"}";
    std::string metrics;
    for (const auto deadline = std::chrono::steady_clock::now() + 30s;;) {
      metrics = testing::HttpGet("http://" + cluster_.metrics_address() + "/metrics");
      if (value(metrics, taken) >= 2 || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_GE(value(metrics, taken), 2) << metrics;
    EXPECT_EQ(value(metrics, refused), 0) << metrics;
  }

  std::string out;
  EXPECT_EQ(cluster_.Cli({"status", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("succeeded"), std::string::npos) << out;
  EXPECT_NE(out.find(job.result().ranks(0).parameter_hash()), std::string::npos) << out;
  EXPECT_EQ(cluster_.Cli({"watch", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;
  EXPECT_EQ(cluster_.Cli({"list"}, &out), 0) << out;
  EXPECT_NE(out.find("succeeded"), std::string::npos) << out;
  EXPECT_NE(out.find("ENERGY J"), std::string::npos) << out;

  // The ranks' own log lines, through the coordinator; -f ends with the job.
  ASSERT_EQ(cluster_.Cli({"logs", std::to_string(id), "-f"}, &out), 0) << out;
  EXPECT_NE(out.find("[rank 0] "), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1] "), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 done: accuracy"), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 2/2 test accuracy"), std::string::npos) << out;
  // Issue 23: the checkpoint is in the log, and the ranks' lines are merged by time.
  EXPECT_NE(out.find("checkpoint at step"), std::string::npos) << out;
  {
    ASSERT_EQ(cluster_.Cli({"logs", std::to_string(id), "-o", "json"}, &out), 0) << out;
    std::istringstream lines(out);
    std::string line;
    int64_t previous = 0;
    std::set<int> ranks;
    while (std::getline(lines, line)) {
      const nlohmann::json l = nlohmann::json::parse(line, nullptr, false);
      if (l.is_discarded() || !l.contains("unix_ms")) continue;
      EXPECT_GE(l.at("unix_ms").get<int64_t>(), previous) << line;
      previous = l.at("unix_ms").get<int64_t>();
      ranks.insert(l.at("rank").get<int>());
    }
    EXPECT_EQ(ranks.size(), 2u) << out;
  }
  ASSERT_EQ(cluster_.Cli({"logs", std::to_string(id), "--rank", "1"}, &out), 0) << out;
  EXPECT_EQ(out.find("[rank 0] "), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1] "), std::string::npos) << out;
  ASSERT_EQ(cluster_.Cli({"logs", std::to_string(id), "--tail", "1", "-o", "json"}, &out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("\"seq\":"), std::string::npos) << out;
  EXPECT_EQ(cluster_.Cli({"logs", "999"}, &out), 1) << out;

  // -o json: every field, numbers as numbers, states lower-case, RFC 3339 times, rank 0.
  ASSERT_EQ(cluster_.Cli({"status", std::to_string(id), "-o", "json"}, &out), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j.at("id"), id);
  EXPECT_EQ(j.at("state"), "succeeded");
  EXPECT_EQ(j.at("spec").at("device_kind"), "cpu");
  EXPECT_TRUE(j.at("created_unix_ms").is_number()) << j.at("created_unix_ms");
  EXPECT_TRUE(j.at("created_time").get<std::string>().ends_with("Z")) << j.at("created_time");
  EXPECT_EQ(j.at("result").at("ranks").at(0).at("rank"), 0);
  EXPECT_TRUE(j.at("result").at("samples").is_number());
  EXPECT_TRUE(j.at("result").at("energy").at("total_joules").get<double>() > 0);
  EXPECT_EQ(j.at("spec").at("energy_budget_joules"), 0);  // present though unset
  ASSERT_EQ(cluster_.Cli({"list", "-o", "json", "--state", "succeeded,failed"}, &out), 0) << out;
  j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j.at("jobs").size(), 1u) << out;
  ASSERT_EQ(cluster_.Cli({"list", "--state", "running,pending"}, &out), 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;  // the header alone
  ASSERT_EQ(cluster_.Cli({"list", "--label", "nobody=here"}, &out), 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_EQ(cluster_.Cli({"list", "--state", "done"}, &out), 2) << out;
  ASSERT_EQ(cluster_.Cli({"workers", "-o", "json"}, &out), 0) << out;
  j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_EQ(j.at("workers").size(), 2u) << out;
  EXPECT_EQ(j.at("workers").at(0).at("state"), "idle");
  // Each worker registered the BLAS its GEMMs run on (worker/blas): named in JSON, in the
  // table, and on each rank of the job's report.
  const std::string blas_library = j.at("workers").at(0).at("blas").at("library");
  EXPECT_FALSE(blas_library.empty()) << out;
  EXPECT_FALSE(j.at("workers").at(0).at("blas").at("choice").get<std::string>().empty()) << out;
  ASSERT_EQ(cluster_.Cli({"workers"}, &out), 0) << out;
  EXPECT_NE(out.find("BLAS"), std::string::npos) << out;
  EXPECT_NE(out.find(blas_library), std::string::npos) << out;
  ASSERT_EQ(cluster_.Cli({"report", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("  blas: " + blas_library), std::string::npos) << out;
  EXPECT_NE(out.find("on ranks 0,1"), std::string::npos) << out;
  ASSERT_EQ(cluster_.Cli({"report", std::to_string(id), "-o", "json"}, &out), 0) << out;
  EXPECT_NE(out.find("\"history\""), std::string::npos) << out;
  {
    // The report's job fields are the status's: none zeroed (attempt, times, submitter, gang).
    nlohmann::json report = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
    ASSERT_FALSE(report.is_discarded()) << out;
    ASSERT_EQ(cluster_.Cli({"status", std::to_string(id), "-o", "json"}, &out), 0) << out;
    nlohmann::json status = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
    for (const char* key :
         {"attempt", "created_unix_ms", "started_unix_ms", "finished_unix_ms", "started_time",
          "finished_time", "submitted_by", "worker_ids", "uid", "queued_unix_ms"}) {
      EXPECT_EQ(report.at(key), status.at(key)) << key;
    }
    EXPECT_EQ(report.at("attempt"), 1);
    EXPECT_EQ(report.at("worker_ids").size(), 2u);
    EXPECT_FALSE(report.at("submitted_by").get<std::string>().empty());
    EXPECT_TRUE(report.at("finished_time").is_string());
    EXPECT_EQ(report.at("result"), status.at("result"));
  }

  // A job that cannot run with the workers there are: accepted, with a warning.
  ASSERT_EQ(cluster_.Cli({"submit", "--model", "mlp", "--workers", "3", "--global-batch-size", "96",
                          "--label", "team=a"},
                         &out),
            0)
      << out;
  EXPECT_NE(out.find("warning: the job needs 3 cpu workers and only 2 are registered"),
            std::string::npos)
      << out;
  ASSERT_EQ(cluster_.Cli({"list", "--label", "team=a", "-o", "json"}, &out), 0) << out;
  j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_EQ(j.at("jobs").size(), 1u) << out;
  EXPECT_EQ(j.at("jobs").at(0).at("state"), "pending");
  ASSERT_EQ(
      cluster_.Cli({"status", std::to_string(j.at("jobs").at(0).at("id").get<int64_t>())}, &out), 0)
      << out;
  EXPECT_NE(out.find("labels team=a"), std::string::npos) << out;
  EXPECT_NE(out.find("waiting for 3 idle cpu workers"), std::string::npos) << out;
}

TEST_F(ClusterTest, CliSubmitWatchReportsFailureAndBadSpecs) {
  cluster_.StartWorkers(1);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(1, 30s));
  std::string out;
  EXPECT_EQ(cluster_.Cli(
                {"submit", "--model", "mlp", "--workers", "3", "--global-batch-size", "100"}, &out),
            2)
      << out;
  EXPECT_NE(out.find("global_batch_size 100 is not divisible by workers 3"), std::string::npos)
      << out;
  EXPECT_EQ(cluster_.Cli({"submit", "--model", "logreg", "--global-batch-size", "64",
                          "--max-train-samples", "2000", "--max-test-samples", "500", "--watch"},
                         &out),
            0)
      << out;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;
  EXPECT_EQ(cluster_.Cli({"status", "999"}, &out), 1);
  EXPECT_NE(out.find("job 999 does not exist"), std::string::npos) << out;
}

// `submit --watch` into a pipe: a line per milestone (state, epoch, phase, accuracy), not
// one per progress report; a running line gives the job's joules and power and each rank's
// watts.
TEST_F(ClusterTest, WatchIntoAPipeWritesALinePerMilestoneWithEachRanksWatts) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  std::string out;
  ASSERT_EQ(cluster_.Cli({"submit", "--model", "mlp", "--workers", "2", "--global-batch-size", "64",
                          "--epochs", "3", "--max-train-samples", "6000", "--max-test-samples",
                          "1000", "--watch"},
                         &out),
            0)
      << out;
  std::istringstream lines(out);
  std::string line;
  int running = 0;
  bool ranks_watts = false;
  std::set<std::string> seen;
  while (std::getline(lines, line)) {
    if (line.find(" running: ") == std::string::npos) continue;
    ++running;
    // "... 1234 J, 56 W (ranks 28+28) ...": the job's joules and watts (each rank's once
    // both have reported, which a line may come before: CoordinatorTest covers those).
    ranks_watts |= line.find(" J, ") != std::string::npos && line.find(" W") != std::string::npos;
    const size_t epoch = line.find("epoch ");
    seen.insert(line.substr(epoch, line.find(' ', epoch + 6) - epoch));
  }
  EXPECT_TRUE(ranks_watts) << out;
  EXPECT_GE(seen.size(), 2u) << out;  // epochs go by, each shown (the first may pass unseen)
  // Per epoch its training, evaluation, accuracy and checkpoint milestones at most, and a
  // line a minute between (a slow machine).
  EXPECT_LE(running, 3 * 6) << out;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;

  // Accounting (issue 29): `usage` tallies it as `list` shows it, by any grouping.
  const v1::Job job = cluster_.Get(1);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(cluster_.Cli({"usage", "--by", "model", "--since", "1h", "-o", "json"}, &out), 0)
      << out;
  nlohmann::json usage = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(usage.is_discarded()) << out;
  ASSERT_EQ(usage.at("groups").size(), 1u) << out;
  EXPECT_EQ(usage.at("groups").at(0).at("key"), "mlp");
  EXPECT_EQ(usage.at("total").at("jobs"), 1);
  EXPECT_NEAR(usage.at("total").at("joules").get<double>(),
              job.result().energy().total_joules(), 1e-6);
  EXPECT_NEAR(usage.at("total").at("device_hours").get<double>(),
              job.result().energy().device_hours(), 1e-9);
  ASSERT_EQ(cluster_.Cli({"usage", "--by", "day", "--until", "2000-01-01"}, &out), 0) << out;
  std::istringstream rows(out);
  std::string total_row;
  while (std::getline(rows, total_row) && total_row.rfind("total ", 0) != 0) {
  }
  std::istringstream total_fields(total_row.substr(6));
  int total_jobs = -1;
  total_fields >> total_jobs;
  EXPECT_EQ(total_jobs, 0) << out;  // none so old
  EXPECT_EQ(cluster_.Cli({"usage", "--by", "colour"}, &out), 2) << out;
  EXPECT_NE(out.find("cannot group by \"colour\""), std::string::npos) << out;
  ASSERT_EQ(cluster_.Cli({"list", "-o", "csv"}, &out), 0) << out;
  EXPECT_EQ(out.rfind("id,state,name,model,", 0), 0u) << out;
  EXPECT_NE(out.find("\n1,succeeded,"), std::string::npos) << out;
}

// `joule sweep run`: a grid of 1 and 2 workers x two global batches, each cell a job through
// the coordinator, then the table and the energy fit; a second run, after the coordinator
// was killed and restarted, finds every job there (idempotent request ids) and submits
// none; `sweep status` tabulates the same jobs.
TEST_F(ClusterTest, SweepRunsEveryCellOnceAndTabulatesAndFitsThem) {
  cluster_.StartWorkers(2);
  const std::string file = (dir_ / "sweep.yaml").string();
  {
    std::ofstream f(file);
    f << "name: it-sweep\n"
         "base: {model: logreg, dataset: fashion-mnist, epochs: 1, max_train_samples: 2000,\n"
         "       max_test_samples: 500, optimizer: {lr: 0.1}}\n"
         "grid:\n"
         "  workers: [1, 2]\n"
         "  global_batch_size: [64, 128]\n";
  }
  std::string out;
  ASSERT_EQ(cluster_.Cli({"sweep", "run", file}, &out), 0) << out;
  EXPECT_NE(out.find("4 jobs (4 submitted, 0 already there)"), std::string::npos) << out;
  for (const char* cell : {"workers=1,global_batch_size=64", "workers=1,global_batch_size=128",
                           "workers=2,global_batch_size=64", "workers=2,global_batch_size=128"}) {
    EXPECT_NE(out.find(cell), std::string::npos) << cell << "\n" << out;
  }
  EXPECT_NE(out.find("energy vs device-hours: "), std::string::npos) << out;
  EXPECT_NE(out.find("(n=4, 95% intervals)"), std::string::npos) << out;
  EXPECT_NE(out.find("the fit tests the estimator"), std::string::npos) << out;

  // Again after the coordinator was killed and restarted on its database: still nothing new.
  const std::string listen = cluster_.address();
  cluster_.coordinator().Signal(SIGKILL);
  cluster_.coordinator().Wait(10s);
  ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator(listen));
  std::string again;
  ASSERT_EQ(cluster_.Cli({"sweep", "run", file}, &again), 0) << again;
  EXPECT_NE(again.find("4 jobs (0 submitted, 4 already there)"), std::string::npos) << again;
  std::string list;
  ASSERT_EQ(cluster_.Cli({"list"}, &list), 0);
  EXPECT_EQ(std::count(list.begin(), list.end(), '\n'), 5) << list;  // a header + 4 jobs

  const std::string json_file = (dir_ / "sweep.json").string();
  ASSERT_EQ(cluster_.Cli({"sweep", "status", "it-sweep", "-o", "json", "--out", json_file}, &out),
            0)
      << out;
  EXPECT_NE(out.find("4 jobs: 4 succeeded"), std::string::npos) << out;
  std::ifstream in(json_file);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json parsed = nlohmann::json::parse(json, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << json;
  ASSERT_TRUE(parsed.contains("cells") && parsed.contains("energy_vs_device_hours") &&
              parsed.contains("joules_per_device_hour_model"))
      << json;
  EXPECT_EQ(parsed.at("cells").size(), 4u) << json;
  EXPECT_EQ(parsed.at("energy_vs_device_hours").at("n"), 4) << json;
  EXPECT_GT(parsed.at("energy_vs_device_hours").at("slope_joules_per_device_hour").get<double>(),
            0);
  EXPECT_EQ(parsed.at("joules_per_device_hour_model").at("n"), 4) << json;

  // concurrency: 1 runs the cells one after another although two workers could run two
  // 1-worker jobs at once: no two jobs' [start, end] overlap, and all succeed.
  {
    std::ofstream f(dir_ / "seq.yaml");
    f << "name: it-seq\nconcurrency: 1\n"
         "base: {model: logreg, dataset: fashion-mnist, epochs: 1, max_train_samples: 2000,\n"
         "       max_test_samples: 500, workers: 1, optimizer: {lr: 0.1}}\n"
         "grid:\n  global_batch_size: [32, 64, 128]\n";
  }
  ASSERT_EQ(cluster_.Cli({"sweep", "run", (dir_ / "seq.yaml").string()}, &out), 0) << out;
  EXPECT_NE(out.find("3 jobs, 1 at a time"), std::string::npos) << out;
  std::string seq_json;
  ASSERT_EQ(cluster_.Cli({"list", "--label", "sweep=it-seq", "-o", "json"}, &seq_json), 0);
  const nlohmann::json listed =
      nlohmann::json::parse(seq_json.substr(seq_json.find('{')), nullptr, false);
  ASSERT_FALSE(listed.is_discarded()) << seq_json;
  const nlohmann::json& seq = listed.at("jobs");
  ASSERT_EQ(seq.size(), 3u) << seq_json;
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& j : seq) {
    EXPECT_EQ(j.value("state", ""), "succeeded") << j.dump();
    spans.emplace_back(j.value("started_unix_ms", int64_t{0}),
                       j.value("finished_unix_ms", int64_t{0}));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    EXPECT_GE(spans[i].first, spans[i - 1].second)
        << "job " << i << " started before the previous ended";
  }

  // Issue 23: a cell two workers can never run (8 workers) is reported and left out; the rest
  // runs and tabulates and the client ends (it waited for ever). The dry run says so too and
  // shows the batch sizes each cell runs with (not "global batch 0").
  {
    std::ofstream f(dir_ / "big.yaml");
    f << "name: it-big\n"
         "base: {model: logreg, dataset: fashion-mnist, epochs: 1, max_train_samples: 2000,\n"
         "       max_test_samples: 500, local_batch_size: 32, optimizer: {lr: 0.1}}\n"
         "grid:\n  workers: [1, 8]\n";
  }
  ASSERT_EQ(cluster_.Cli({"sweep", "run", (dir_ / "big.yaml").string(), "--dry-run"}, &out), 0)
      << out;
  EXPECT_NE(out.find("(workers 1, global batch 32, local batch 32)"), std::string::npos) << out;
  EXPECT_NE(out.find("(workers 8, global batch 256, local batch 32)  cannot run: needs 8 cpu "
                     "workers and only 2 are registered"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("batch 0"), std::string::npos) << out;
  EXPECT_EQ(cluster_.Cli({"sweep", "run", (dir_ / "big.yaml").string(), "--timeout", "120",
                          "--wait-workers", "2"},
                         &out),
            1)
      << out;
  EXPECT_NE(out.find("2 jobs (1 submitted, 0 already there, 1 not run)"), std::string::npos) << out;
  EXPECT_NE(out.find("cell workers=8 (repeat 0): not run: needs 8 cpu workers"), std::string::npos)
      << out;
  EXPECT_NE(out.find("workers=1 "), std::string::npos) << out;  // its row in the table
  EXPECT_EQ(out.find("not ended after --timeout"), std::string::npos) << out;

  // A sweep file that does not parse: exit 2, one line.
  { std::ofstream(dir_ / "bad.yaml") << "name: it\nbase: {model: mlp}\ngrid: {workers: 2}\n"; }
  EXPECT_EQ(cluster_.Cli({"sweep", "run", (dir_ / "bad.yaml").string()}, &out), 2);
  EXPECT_NE(out.find("grid.workers: a non-empty list"), std::string::npos) << out;
  EXPECT_EQ(cluster_.Cli({"sweep", "status", "no-such-sweep"}, &out), 1) << out;
}

// `--energy-budget`: with the estimated source (no RAPL here) the job's energy passes the
// budget within seconds; the coordinator ends it BUDGET_EXCEEDED, the ranks stop at an
// agreed step after rank 0's checkpoint, and their late results keep the partial report.
TEST_F(ClusterTest, AnEnergyBudgetStopsTheJobAfterACheckpointAndKeepsItsReport) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  std::string out;
  ASSERT_EQ(cluster_.Cli({"submit", "--model", "mlp", "--workers", "2", "--global-batch-size", "64",
                          "--epochs", "50", "--max-train-samples", "6000", "--max-test-samples",
                          "500", "--energy-budget", "40J"},
                         &out),
            0)
      << out;
  const int64_t id = std::stoll(out);
  v1::Job job = cluster_.WaitDone(id, 120s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_BUDGET_EXCEEDED) << job.reason();
  EXPECT_NE(job.reason().find("energy budget reached"), std::string::npos) << job.reason();
  EXPECT_TRUE(job.progress().budget_warning());
  // Stopped when the spend plus what the stop costs reached the budget (issue 23: a 30 J
  // budget ended at 40.7 J): it ends near the budget, not far past it.
  EXPECT_GE(job.progress().job_energy_joules(), 40 * 0.5);
  // Both ranks report after their stop: the workers are freed, the energy is counted.
  job = cluster_.WaitFor(
      id, [](const v1::Job& j) { return j.result().energy().ranks_reported() == 2; }, 60s);
  ASSERT_EQ(job.result().energy().ranks_reported(), 2) << job.DebugString();
  const double spent = job.result().energy().total_joules();
  EXPECT_LE(spent, 40 * 1.1) << "the overshoot is bounded";
  EXPECT_GE(spent, 40 * 0.5);
  // One figure, derived once: the job's progress, its report, the CLI, /metrics.
  EXPECT_DOUBLE_EQ(job.progress().job_energy_joules(), spent);
  EXPECT_DOUBLE_EQ(job.progress().energy_budget_used(), spent / 40);
  EXPECT_GT(job.result().samples(), 0);
  EXPECT_FALSE(cluster_.WaitForCheckpoint(1s).empty()) << "no checkpoint after the stop";
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 15s));
  EXPECT_EQ(cluster_.Cli({"status", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("budget_exceeded"), std::string::npos) << out;
  EXPECT_NE(out.find("stopped at its budget, after a checkpoint"), std::string::npos) << out;
  EXPECT_NE(
      out.find(absl::StrFormat("energy budget 40 J: %.1f J, %.1f%% used", spent, 100 * spent / 40)),
      std::string::npos)
      << out;
  EXPECT_EQ(cluster_.Cli({"report", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("device-hours"), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrFormat("spent %.1f J, %.1f%%", spent, 100 * spent / 40)),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("gradient updates"), std::string::npos) << out;
  EXPECT_EQ(out.find(absl::StrFormat("%-19s %10d\n", "gradient updates", 0)), std::string::npos)
      << out;
  EXPECT_EQ(cluster_.Cli({"list", "--state", "budget_exceeded"}, &out), 0) << out;
  EXPECT_NE(out.find("budget_exceeded"), std::string::npos) << out;
  // A budget that is not an amount of energy: exit 2, one line.
  EXPECT_EQ(cluster_.Cli({"submit", "--model", "mlp", "--energy-budget", "lots"}, &out), 2);
  EXPECT_NE(out.find("--energy-budget: energy \"lots\" is not"), std::string::npos) << out;
}

// Issue 28: workers on a node whose BMC serves Redfish (a service of the test's own, the
// DMTF schema's fields at a steady 300 W, read at 10 Hz) report the node's (wall) energy beside the
// components', and what no component accounts for, in the stored report and the CLI's.
TEST_F(ClusterTest, ANodeWithABmcReportsWallEnergyBesideTheComponents) {
  testing::FakeBmc bmc;
  testing::ServeChassisPower(bmc, "300");
  cluster_.StartWorkers(2, {"--redfish-url", bmc.url(), "--redfish-period-ms", "100",
                            "--node-power-dir", (cluster_.dir() / "node-power").string()});
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec s = ShortSpec(2);
  s.set_epochs(2);  // a second or two: several readings at 10 Hz
  const int64_t id = cluster_.Submit(s);
  const v1::Job job = cluster_.WaitFor(
      id, [](const v1::Job& j) { return j.result().energy().ranks_reported() == 2; }, 120s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const v1::EnergyReport& e = job.result().energy();
  EXPECT_EQ(e.node_ranks(), 2) << e.DebugString();
  EXPECT_GT(e.node_joules(), 0);
  EXPECT_GT(e.node_component_joules(), 0);
  EXPECT_LE(e.node_component_joules(), e.total_joules() * (1 + 1e-9));
  // The two ranks' shares of one node's 300 W never exceed it over the job's wall time
  // (plus a reading's period at each end).
  EXPECT_LE(e.node_joules(), 300 * (job.result().wall_seconds() + 0.2)) << e.DebugString();
  EXPECT_EQ(e.node_source(), "redfish " + bmc.url() + "/redfish/v1/Chassis/1U/Power");
  EXPECT_GE(bmc.requests(), 3);
  // One worker of the host polls the BMC, the other reads what it wrote.
  int polling = 0;
  for (int i = 0; i < 2; ++i) {
    polling +=
        Slurp(cluster_.worker_log(i)).find("reads redfish " + bmc.url()) != std::string::npos;
  }
  EXPECT_EQ(polling, 1);
  std::string out;
  EXPECT_EQ(cluster_.Cli({"report", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("whole node (BMC), 2 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("node, not in any component"), std::string::npos) << out;
  // By component energy where the host measures it (RAPL, perf, NVML), else by CPU time
  // (this CI's VMs: only estimates).
  EXPECT_TRUE(e.node_split() == "component energy" || e.node_split() == "cpu time" ||
              e.node_split() == "component energy and cpu time")
      << e.node_split();
  EXPECT_NE(out.find("split between the host's workers by " + e.node_split()), std::string::npos)
      << out;
}

// The HTML reports of a job and of a sweep, opened in headless chromium
// (tests/testing/render_html.py): no console error, every plot rendered as SVG with its
// series, the screenshot not blank.
TEST_F(ClusterTest, HtmlReportsOfAJobAndASweepRenderInABrowser) {
  cluster_.StartWorkers(2);
  const std::string file = (dir_ / "html-sweep.yaml").string();
  {
    std::ofstream f(file);
    f << "name: html-sweep\n"
         "base: {model: mlp, hidden_sizes: [64], dataset: fashion-mnist, epochs: 3,\n"
         "       max_train_samples: 4000, max_test_samples: 500, target_accuracy: 0.5,\n"
         "       optimizer: {lr: 0.1}}\n"
         "grid:\n"
         "  workers: [1, 2]\n"
         "  global_batch_size: [64, 128]\n";
  }
  const std::string sweep_html = (dir_ / "sweep.html").string();
  std::string out;
  ASSERT_EQ(cluster_.Cli({"sweep", "run", file, "--html", sweep_html}, &out), 0) << out;
  EXPECT_NE(out.find("to target (Zeus TTA/ETA)"), std::string::npos) << out;
  // Now the family has history: a dry run predicts each cell's cost.
  ASSERT_EQ(cluster_.Cli({"sweep", "run", file, "--dry-run"}, &out), 0) << out;
  EXPECT_NE(out.find("4 jobs; predicted for 4 of them (joule estimate)"), std::string::npos) << out;
  std::string list;
  ASSERT_EQ(cluster_.Cli({"list", "--state", "succeeded"}, &list), 0) << list;
  // The 2-worker job: the newest.
  const int64_t id = std::stoll(list.substr(list.find('\n') + 1));
  const v1::Job job = cluster_.Get(id);
  ASSERT_EQ(job.spec().workers(), 2);
  ASSERT_EQ(job.result().history_size(), 3) << job.result().DebugString();
  EXPECT_EQ(job.result().history(2).epoch(), 3);
  EXPECT_GT(job.result().history(2).joules(), job.result().history(0).joules());
  ASSERT_FALSE(job.result().to_accuracy().empty());
  EXPECT_TRUE(job.result().to_accuracy(0).reached()) << "0.5 is reached by any mlp here";
  ASSERT_EQ(job.result().attempts(0).power_size(), 2);
  EXPECT_EQ(cluster_.Cli({"report", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("by epoch:"), std::string::npos) << out;
  EXPECT_NE(out.find("test_accuracy >= 0.5"), std::string::npos) << out;
  const std::string job_html = (dir_ / "job.html").string();
  ASSERT_EQ(cluster_.Cli({"report", std::to_string(id), "--html", job_html}, &out), 0) << out;

  const auto check = [&](const std::string& page, const nlohmann::json& expect) {
    const std::string expect_file = page + ".expect.json";
    std::ofstream(expect_file) << expect.dump();
    std::string log;
    const int rc = testing::RunCommand(
        {"/usr/bin/python3", std::string(JOULE_SOURCE_DIR) + "/tests/testing/render_html.py", page,
         "--expect", expect_file, "--screenshot", page + ".png", "-v"},
        &log);
    return std::make_pair(rc, log);
  };
  const nlohmann::json job_expect = {
      {"plots",
       {{"power-by-rank", {{"min_marks", 2}, {"series", {"rank 0", "rank 1"}}}},
        {"energy-by-phase", {{"min_marks", 3}, {"texts", {"energy (J)"}}}},
        {"loss-by-epoch", {{"min_marks", 2}, {"series", {"train loss", "test loss"}}}},
        {"accuracy-by-epoch", {{"min_marks", 1}, {"texts", {"test accuracy"}}}}}}};
  auto [rc, log] = check(job_html, job_expect);
  if (rc == 77) GTEST_SKIP() << "no chromium: " << log;
  EXPECT_EQ(rc, 0) << log;
  const nlohmann::json sweep_expect = {
      {"plots",
       {{"energy-vs-device-hours", {{"min_marks", 2}, {"series", {"jobs", "least-squares fit"}}}},
        // An ideal line per series (their least parallel cells differ).
        {"speedup",
         {{"min_marks", 2},
          {"series", {"ideal: global_batch_size=64", "ideal", "processes"}},
          {"texts", {"speedup"}}}},
        {"efficiency", {{"min_marks", 2}, {"series", {"ideal: global_batch_size=128"}}}},
        {"accuracy-vs-global-batch", {{"min_marks", 1}}},
        {"energy-per-sample", {{"min_marks", 1}, {"texts", {"energy per sample (mJ)"}}}},
        {"power-vs-parallelism", {{"min_marks", 1}, {"texts", {"average power (W)"}}}}}}};
  std::tie(rc, log) = check(sweep_html, sweep_expect);
  EXPECT_EQ(rc, 0) << log;
  // The checker itself fails on a series the page does not have.
  const nlohmann::json wrong = {{"plots", {{"speedup", {{"series", {"no such series"}}}}}}};
  std::tie(rc, log) = check(sweep_html, wrong);
  EXPECT_EQ(rc, 1) << log;
}

// `joule estimate`: with no history it refuses (unless --calibrate, which runs two short
// labelled jobs and then predicts); after them, a plain estimate and `submit --estimate`
// answer; a budgeted submit whose estimate is confidently above its budget is refused
// unless --force.
TEST_F(ClusterTest, EstimateCalibratesThenPredictsAndGuardsBudgets) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  const std::vector<std::string> job = {
      "--model",  "mlp", "--hidden",           "64", "--workers", "2", "--global-batch-size", "64",
      "--epochs", "2",   "--max-test-samples", "500"};
  auto with = [&](std::vector<std::string> head, std::vector<std::string> tail = {}) {
    head.insert(head.end(), job.begin(), job.end());
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  std::string out;
  EXPECT_EQ(cluster_.Cli(with({"estimate"}), &out), 1) << out;
  EXPECT_NE(out.find("no finished job of mlp [64] on fashion-mnist, cpu"), std::string::npos)
      << out;
  ASSERT_EQ(cluster_.Cli(with({"estimate", "--calibrate"}), &out), 0) << out;
  EXPECT_NE(out.find("running 2 calibration jobs"), std::string::npos) << out;
  EXPECT_NE(out.find("calibration runs: rough"), std::string::npos) << out;
  EXPECT_NE(out.find("wall time"), std::string::npos) << out;
  std::string list;
  ASSERT_EQ(cluster_.Cli({"list", "--state", "succeeded"}, &list), 0);
  EXPECT_NE(list.find("calibrate-small"), std::string::npos) << list;
  EXPECT_NE(list.find("calibrate-large"), std::string::npos) << list;
  // Now from history; the whole dataset's size came from the 1/16 run: 2 epochs of ~60000.
  ASSERT_EQ(cluster_.Cli(with({"submit", "--estimate"}), &out), 0) << out;
  EXPECT_NE(out.find("from 2 finished job(s)"), std::string::npos) << out;
  const size_t at = out.find(" samples, ");
  ASSERT_NE(at, std::string::npos) << out;
  const int64_t samples = std::stoll(out.substr(out.rfind('(', at) + 1));
  EXPECT_NEAR(static_cast<double>(samples), 2 * 60000, 2 * 16 * 64) << out;
  // A budget far below the estimate: refused, nothing submitted; --force submits.
  EXPECT_EQ(cluster_.Cli(with({"submit"}, {"--energy-budget", "0.001J"}), &out), 1) << out;
  EXPECT_NE(out.find("is above the energy budget of 0.0 J"), std::string::npos) << out;
  ASSERT_EQ(cluster_.Cli({"list"}, &list), 0);
  EXPECT_EQ(std::count(list.begin(), list.end(), '\n'), 3) << list;  // header + calibrations
  ASSERT_EQ(cluster_.Cli(with({"submit"}, {"--energy-budget", "0.001J", "--force"}), &out), 0)
      << out;
  const v1::Job forced = cluster_.WaitDone(std::stoll(out), 60s);
  EXPECT_EQ(forced.state(), v1::JOB_STATE_BUDGET_EXCEEDED) << forced.reason();
  // The estimator's own check: the newest job predicted from the older ones.
  ASSERT_EQ(cluster_.Cli(with({"estimate"}, {"--holdout", "1"}), &out), 0) << out;
  EXPECT_NE(out.find("mean absolute error over 1 held-out jobs"), std::string::npos) << out;
}

// `joule export`: a job submitted with --keep-model leaves a final checkpoint, which the CLI
// writes as a NumPy .npz state dict; PyTorch's equivalent mlp loads it (strict names and
// shapes) and predicts the test split exactly as Joule did.
TEST_F(ClusterTest, AnExportedModelPredictsInPyTorchAsItDidInJoule) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  std::string out;
  ASSERT_EQ(cluster_.Cli({"submit", "--model", "mlp", "--hidden", "64", "32", "--workers", "2",
                          "--global-batch-size", "64", "--epochs", "2", "--max-train-samples",
                          "6000", "--max-test-samples", "1000", "--keep-model"},
                         &out),
            0)
      << out;
  const int64_t id = std::stoll(out);
  const v1::Job job = cluster_.WaitDone(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const std::string model = (dir_ / "model.npz").string();
  const std::string root = (dir_ / "checkpoints").string();
  ASSERT_EQ(
      cluster_.Cli({"export", std::to_string(id), "-o", model, "--checkpoint-root", root}, &out), 0)
      << out;
  EXPECT_NE(out.find("6 tensors"), std::string::npos) << out;
  const std::string check = std::string(JOULE_SOURCE_DIR) + "/tests/client/check_export.py";
  const std::string accuracy = absl::StrFormat("%.6f", job.result().test_accuracy());
  int rc = testing::RunCommand({"/usr/bin/python3", check, model, "64,32", "1000", accuracy}, &out);
  if (rc == 77) GTEST_SKIP() << out;
  EXPECT_EQ(rc, 0) << out;
  // The check can fail: another accuracy, or another architecture.
  EXPECT_EQ(testing::RunCommand({"/usr/bin/python3", check, model, "64,32", "1000", "0.01"}, &out),
            1)
      << out;
  EXPECT_NE(testing::RunCommand({"/usr/bin/python3", check, model, "64", "1000", accuracy}, &out),
            0)
      << out;
  // TorchScript: torch.jit.load runs it as it is.
  const std::string script = (dir_ / "model.pt").string();
  ASSERT_EQ(cluster_.Cli({"export", std::to_string(id), "--format", "torchscript", "-o", script,
                          "--checkpoint-root", root},
                         &out),
            0)
      << out;
  EXPECT_EQ(testing::RunCommand({"/usr/bin/python3", check, script, "-", "1000", accuracy}, &out),
            0)
      << out;
  // Issue 23: -o through a symlink replaces the link, never the file it points to, in both
  // formats; -o - and -o DIR are refused in one line and leave nothing behind.
  const std::filesystem::path victim = dir_ / "victim.txt";
  for (const char* format : {"npz", "torchscript"}) {
    SCOPED_TRACE(format);
    std::ofstream(victim) << "precious";
    const std::filesystem::path link = dir_ / (std::string("link-") + format);
    std::filesystem::create_symlink(victim, link);
    ASSERT_EQ(cluster_.Cli({"export", std::to_string(id), "--format", format, "-o", link.string(),
                            "--checkpoint-root", root},
                           &out),
              0)
        << out;
    std::ifstream in(victim);
    std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(kept, "precious");
    EXPECT_FALSE(std::filesystem::is_symlink(link));
    EXPECT_GT(std::filesystem::file_size(link), 100u);
    for (const std::string& bad : {std::string("-"), (dir_ / "checkpoints").string()}) {
      EXPECT_EQ(cluster_.Cli({"export", std::to_string(id), "--format", format, "-o", bad,
                              "--checkpoint-root", root},
                             &out),
                2)
          << out;
      EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    }
  }
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {  // no temporary left
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
    EXPECT_NE(name.rfind(".link-", 0), 0u) << name;
    EXPECT_NE(name.rfind(".checkpoints", 0), 0u) << name;
  }
  // A job that kept nothing: a clear error.
  const v1::Job plain = cluster_.WaitDone(cluster_.Submit(ShortSpec(1)));
  ASSERT_EQ(plain.state(), v1::JOB_STATE_SUCCEEDED) << plain.reason();
  EXPECT_EQ(cluster_.Cli({"export", std::to_string(plain.id()), "-o", model + "2",
                          "--checkpoint-root", root},
                         &out),
            1)
      << out;
  EXPECT_NE(out.find("has no checkpoint"), std::string::npos) << out;
}

// A `ga` job (issue 15's first slice) from a job file through the CLI: two islands evolve
// logreg weights on Fashion-MNIST, migrate, and end with one model; its report splits the
// energy into the GA's phases (fitness = forward, variation = optimizer, migration =
// communication).
TEST_F(ClusterTest, AGeneticAlgorithmJobRunsFromTheCliWithItsEnergyReport) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  std::ofstream(dir_ / "ga.yaml")
      << "name: ga-logreg\nmodel: logreg\nalgorithm: ga\nworkers: 2\nglobal_batch_size: 64\n"
         "max_test_samples: 2000\n"
         "ga: {population: 32, generations: 60, mutation_rate: 0.05, mutation_scale: 0.05,\n"
         "     crossover_rate: 0.5, elite: 2, migration_interval: 10, migration_size: 2,\n"
         "     fitness_batch: 256}\n";
  std::string out;
  ASSERT_EQ(cluster_.Cli({"submit", "-f", (dir_ / "ga.yaml").string(), "--watch"}, &out), 0) << out;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;
  // Described as a GA (issue 29): generations, no learning rate.
  EXPECT_NE(out.find(" generations; train "), std::string::npos) << out;
  EXPECT_EQ(out.find(" lr "), std::string::npos) << out;
  EXPECT_EQ(out.find(" steps;"), std::string::npos) << out;
  std::string list;
  ASSERT_EQ(cluster_.Cli({"list", "--state", "succeeded", "-o", "json"}, &list), 0) << list;
  const nlohmann::json jobs = nlohmann::json::parse(list.substr(list.find('{')), nullptr, false);
  ASSERT_EQ(jobs.at("jobs").size(), 1u) << list;
  const int64_t id = jobs.at("jobs").at(0).at("id").get<int64_t>();
  const v1::Job job = cluster_.Get(id);
  EXPECT_GT(job.result().test_accuracy(), 0.3) << "chance is 0.1";
  EXPECT_EQ(job.result().steps(), 60);
  ASSERT_EQ(cluster_.Cli({"report", std::to_string(id)}, &out), 0) << out;
  for (const char* phase : {"forward", "optimizer", "communication", "evaluation"}) {
    EXPECT_NE(out.find("    " + std::string(phase) + " "), std::string::npos) << phase << "\n"
                                                                              << out;
  }
  // keep_model: the winner is the job's model, exported and checked in PyTorch (an mlp
  // genome: Linear, ReLU, Linear) to predict as the job's report says.
  std::ofstream(dir_ / "ga-keep.yaml")
      << "name: ga-keep\nmodel: mlp\nhidden_sizes: [16]\nalgorithm: ga\nworkers: 2\n"
         "global_batch_size: 64\nmax_test_samples: 1000\nkeep_model: true\n"
         "ga: {population: 32, generations: 40, elite: 2, migration_interval: 10,\n"
         "     migration_size: 2, fitness_batch: 256}\n";
  ASSERT_EQ(cluster_.Cli({"submit", "-f", (dir_ / "ga-keep.yaml").string()}, &out), 0) << out;
  const v1::Job kept = cluster_.WaitDone(std::stoll(out));
  ASSERT_EQ(kept.state(), v1::JOB_STATE_SUCCEEDED) << kept.reason();
  const std::string model = (dir_ / "ga.npz").string();
  ASSERT_EQ(cluster_.Cli({"export", std::to_string(kept.id()), "-o", model, "--checkpoint-root",
                          (dir_ / "checkpoints").string()},
                         &out),
            0)
      << out;
  const std::string check = std::string(JOULE_SOURCE_DIR) + "/tests/client/check_export.py";
  const std::string accuracy = absl::StrFormat("%.6f", kept.result().test_accuracy());
  const int rc =
      testing::RunCommand({"/usr/bin/python3", check, model, "16", "1000", accuracy}, &out);
  if (rc != 77) {
    EXPECT_EQ(rc, 0) << out;
  }
  // An energy budget ends a ga job budget_exceeded at an agreed generation, after the
  // islands' checkpoint, with both ranks' partial reports. 60 J: loading the data and
  // connecting cost ~15 J here (2 ranks at ~5 W for ~1.5 s; more on a slower CPU), and
  // the job must train before its budget is reached.
  std::ofstream(dir_ / "ga-budget.yaml")
      << "name: ga-budget\nmodel: logreg\nalgorithm: ga\nworkers: 2\nglobal_batch_size: 64\n"
         "energy_budget_joules: 60\nga: {population: 64, generations: 1000000, elite: 2,\n"
         "     migration_interval: 10, migration_size: 2, fitness_batch: 256}\n";
  ASSERT_EQ(cluster_.Cli({"submit", "-f", (dir_ / "ga-budget.yaml").string(), "--force"}, &out), 0)
      << out;
  const int64_t budget_id = std::stoll(out);
  v1::Job budgeted = cluster_.WaitDone(budget_id, 120s);
  ASSERT_EQ(budgeted.state(), v1::JOB_STATE_BUDGET_EXCEEDED) << budgeted.reason();
  budgeted = cluster_.WaitFor(
      budget_id, [](const v1::Job& j) { return j.result().energy().ranks_reported() == 2; }, 60s);
  // Stopped when the spend plus what stopping costs reached the budget: near it, on either
  // side, and the one figure everywhere.
  EXPECT_GE(budgeted.result().energy().total_joules(), 60 * 0.5);
  EXPECT_LE(budgeted.result().energy().total_joules(), 60 * 1.5);
  EXPECT_DOUBLE_EQ(budgeted.progress().job_energy_joules(),
                   budgeted.result().energy().total_joules());
  EXPECT_GT(budgeted.result().samples(), 0);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 15s));
  // Its checkpoint holds the islands, which are not a model: export says so.
  EXPECT_EQ(
      cluster_.Cli({"export", std::to_string(budget_id), "-o", (dir_ / "islands.npz").string(),
                    "--checkpoint-root", (dir_ / "checkpoints").string()},
                   &out),
      1)
      << out;
  EXPECT_NE(out.find("a genetic algorithm's islands, not a model"), std::string::npos) << out;
  // A budget that loading the data alone passes: the ranks' energy-only reports reach the
  // coordinator before any step, and the ranks stop at once (nothing to checkpoint).
  std::ofstream(dir_ / "ga-tiny.yaml")
      << "name: ga-tiny\nmodel: logreg\nalgorithm: ga\nworkers: 2\nglobal_batch_size: 64\n"
         "energy_budget_joules: 1\nga: {population: 64, generations: 1000000, elite: 2,\n"
         "     migration_interval: 10, migration_size: 2, fitness_batch: 256}\n";
  ASSERT_EQ(cluster_.Cli({"submit", "-f", (dir_ / "ga-tiny.yaml").string(), "--force"}, &out), 0)
      << out;
  const int64_t tiny_id = std::stoll(out);
  v1::Job tiny = cluster_.WaitDone(tiny_id, 120s);
  ASSERT_EQ(tiny.state(), v1::JOB_STATE_BUDGET_EXCEEDED) << tiny.reason();
  EXPECT_NE(tiny.reason().find("energy budget reached"), std::string::npos) << tiny.reason();
  tiny = cluster_.WaitFor(
      tiny_id, [](const v1::Job& j) { return j.result().energy().ranks_reported() == 2; }, 60s);
  EXPECT_EQ(tiny.result().samples(), 0) << "stopped before its first generation";
  EXPECT_GT(tiny.result().energy().total_joules(), 0);
  EXPECT_DOUBLE_EQ(tiny.progress().job_energy_joules(), tiny.result().energy().total_joules());
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 15s));
  // A GA spec the coordinator refuses: one line naming the field.
  std::ofstream(dir_ / "bad-ga.yaml") << "model: cnn\nalgorithm: ga\nglobal_batch_size: 64\n";
  EXPECT_EQ(cluster_.Cli({"submit", "-f", (dir_ / "bad-ga.yaml").string()}, &out), 2) << out;
  EXPECT_NE(out.find("algorithm ga evolves logreg or mlp weights"), std::string::npos) << out;
  std::ofstream(dir_ / "odd-ga.yaml") << "model: logreg\nalgorithm: ga\nworkers: 2\n"
                                         "global_batch_size: 64\nga: {population: 33}\n";
  EXPECT_EQ(cluster_.Cli({"submit", "-f", (dir_ / "odd-ga.yaml").string()}, &out), 2) << out;
  EXPECT_NE(out.find("ga.population 33 does not split"), std::string::npos) << out;
}

TEST_F(ClusterTest, CancelStopsARunningJobAndFreesItsWorkers) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec long_job = ShortSpec(2);
  long_job.clear_max_train_samples();
  long_job.set_epochs(50);
  int64_t id = cluster_.Submit(long_job);
  v1::Job job = cluster_.WaitFor(
      id, [](const v1::Job& j) { return j.progress().step() > 0; }, 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();

  // While it runs: how its ranks synchronise, the time left, the whole job's energy.
  std::string out;
  EXPECT_EQ(job.progress().transport(), "shm");  // one host: shared memory
  EXPECT_EQ(cluster_.Cli({"status", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("synchronising over shared memory"), std::string::npos) << out;
  EXPECT_NE(out.find(" s left"), std::string::npos) << out;
  EXPECT_NE(out.find("every rank and attempt"), std::string::npos) << out;
  EXPECT_EQ(cluster_.Cli({"cancel", std::to_string(id)}, &out), 0) << out;
  EXPECT_EQ(cluster_.Get(id).state(), v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 15s)) << "workers were not freed after cancel";
  v1::Job next = cluster_.WaitDone(cluster_.Submit(ShortSpec(2)));
  EXPECT_EQ(next.state(), v1::JOB_STATE_SUCCEEDED) << next.reason();
}

TEST_F(ClusterTest, GangWaitsForAThirdWorkerThenRuns) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  int64_t id = cluster_.Submit(ShortSpec(3));
  // It must stay pending, with the reason, for as long as only two workers exist.
  auto until = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < until) {
    v1::Job job = cluster_.Get(id);
    ASSERT_EQ(job.state(), v1::JOB_STATE_PENDING);
    EXPECT_EQ(job.reason(), "waiting for 3 idle cpu workers: 2 registered, 2 idle");
    std::this_thread::sleep_for(100ms);
  }
  std::string out;
  EXPECT_EQ(cluster_.Cli({"status", std::to_string(id)}, &out), 0);
  EXPECT_NE(out.find("waiting for 3 idle cpu workers"), std::string::npos) << out;
  cluster_.StartWorkers(1);
  v1::Job job = cluster_.WaitDone(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.result().ranks_size(), 3);
}

TEST_F(ClusterTest, CorruptDataFailsTheJobWithTheReasonAndWorkersRecover) {
  fs::path data = dir_ / "bad-data";
  fs::create_directories(data);
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    fs::copy_file(fs::path("/usr/share/datasets/fashion-mnist") / f, data / f);
  }
  fs::resize_file(data / "train-images-idx3-ubyte.gz", 50000);
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec spec = ShortSpec(2);
  spec.set_dataset("idx:" + data.string());
  v1::Job job = cluster_.WaitDone(cluster_.Submit(spec), 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find("train-images-idx3-ubyte.gz"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("truncated"), std::string::npos) << job.reason();
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 15s));
  EXPECT_EQ(cluster_.WaitDone(cluster_.Submit(ShortSpec(2))).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(ClusterTest, ACsvCellThatIsNotUtf8FailsTheJobWithItsReasonNotAsALostWorker) {
  // A cell cut inside a character where the message quotes it, then bytes that are no
  // UTF-8 at all: the worker's result must still parse at the coordinator.
  std::string csv = "x,label\n";
  for (int i = 0; i < 40; ++i) csv += std::to_string(i) + "," + std::to_string(i % 2) + "\n";
  csv += std::string(39, '7') + "\xC3\xA9\xFF\xFE,1\n";
  std::ofstream(dir_ / "bad.csv", std::ios::binary) << csv;
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec spec = ShortSpec(2);
  spec.set_model("logreg");
  spec.clear_max_train_samples();
  spec.clear_max_test_samples();
  spec.set_global_batch_size(4);
  spec.set_dataset("csv:" + (dir_ / "bad.csv").string());
  v1::Job job = cluster_.WaitDone(cluster_.Submit(spec), 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find("bad.csv:42"), std::string::npos) << job.reason();
  EXPECT_EQ(job.reason().find("lost"), std::string::npos) << job.reason();
  EXPECT_EQ(job.result().failed_attempts_size(), 0);  // bad data is not retried
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 15s));      // both sessions survived
}

// Kills (SIGKILL) or freezes (SIGSTOP) one rank mid-epoch. The coordinator notices (the
// session breaks, or the heartbeats stop), aborts the attempt on the other rank, which
// leaves its allreduce, and re-queues the job; the next attempt, on the survivor and a
// spare worker, resumes from the newest checkpoint and succeeds.
TEST_F(ClusterTest, AKilledWorkerIsSurvivedFromTheLastCheckpoint) {
  cluster_.StartWorkers(3);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(3, 30s));
  v1::JobSpec spec = CheckpointedSpec();
  spec.set_epochs(2);  // 936 steps, and an accuracy past 0.8
  int64_t id = cluster_.Submit(spec);
  v1::Job job = cluster_.WaitFor(
      id, [](const v1::Job& j) { return j.progress().step() >= 120; }, 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ChildProcess* victim = cluster_.WorkerRunning(id, 1);
  ASSERT_NE(victim, nullptr);
  const int64_t step_at_kill = cluster_.Get(id).progress().step();
  victim->Signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  job = cluster_.WaitFor(
      id, [](const v1::Job& j) { return j.attempt() >= 2; }, kCollectiveTimeout);
  ASSERT_GE(job.attempt(), 2) << job.reason();
  // The survivor was released and the spare joined well inside the collective timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 15s);
  job = cluster_.WaitDone(id, 120s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempt(), 2);
  ASSERT_EQ(job.result().failed_attempts_size(), 1);
  // Either the coordinator saw the session break first, or the survivor saw its peer go.
  const std::string& why = job.result().failed_attempts(0);
  EXPECT_TRUE(why.find("lost") != std::string::npos || why.find("gloo") != std::string::npos)
      << why;
  // At most one checkpoint interval of work was repeated.
  EXPECT_GT(job.result().resumed_from_step(), 0);
  EXPECT_GE(job.result().resumed_from_step(), step_at_kill - 50);
  EXPECT_EQ(job.result().steps(), 936);
  EXPECT_EQ(job.result().ranks(0).parameter_hash(), job.result().ranks(1).parameter_hash());
  EXPECT_GT(job.result().test_accuracy(), 0.8);
  EXPECT_GT(job.result().energy().earlier_attempts_joules(), 0.0);
}

// A job that starts from an ended job's checkpoint (spec.resume_from_job, how `joule tune`
// promotes a cell) trains only the epochs after it, and ends where training from scratch
// for all of them does; a source that is missing, running or of another shape is refused
// at submit.
TEST_F(ClusterTest, AJobStartsFromAnEndedJobsCheckpointAndTrainsOnlyTheEpochsAfterIt) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec first = ShortSpec(2);
  first.set_keep_model(true);  // a checkpoint after its last epoch
  const v1::Job a = cluster_.WaitDone(cluster_.Submit(first));
  ASSERT_EQ(a.state(), v1::JOB_STATE_SUCCEEDED) << a.reason();
  v1::JobSpec two = ShortSpec(2);
  two.set_epochs(2);
  const v1::Job scratch = cluster_.WaitDone(cluster_.Submit(two));
  ASSERT_EQ(scratch.state(), v1::JOB_STATE_SUCCEEDED) << scratch.reason();
  two.set_resume_from_job(a.id());
  const v1::Job b = cluster_.WaitDone(cluster_.Submit(two));
  ASSERT_EQ(b.state(), v1::JOB_STATE_SUCCEEDED) << b.reason();
  EXPECT_EQ(b.result().resumed_from_step(), a.result().steps());
  EXPECT_EQ(b.result().steps(), 2 * a.result().steps());  // the job's steps, from its start
  ASSERT_EQ(b.result().history_size(), 1);
  EXPECT_EQ(b.result().history(0).epoch(), 2);
  EXPECT_EQ(b.result().ranks(0).parameter_hash(), scratch.result().ranks(0).parameter_hash());
  EXPECT_DOUBLE_EQ(b.result().test_accuracy(), scratch.result().test_accuracy());

  const auto refused = [&](const v1::JobSpec& spec) {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitJobResponse resp;
    const grpc::Status s = cluster_.stub().SubmitJob(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    return s.error_message();
  };
  v1::JobSpec missing = two;
  missing.set_resume_from_job(999999);
  EXPECT_NE(refused(missing).find("resume_from_job 999999"), std::string::npos);
  v1::JobSpec other = two;
  other.set_global_batch_size(128);
  EXPECT_NE(refused(other).find("global_batch_size 64 against 128"), std::string::npos)
      << refused(other);
  v1::JobSpec negative = two;
  negative.set_resume_from_job(-1);
  refused(negative);
  v1::JobSpec long_one = ShortSpec(2);
  long_one.set_epochs(50);
  long_one.clear_max_train_samples();
  const int64_t running = cluster_.Submit(long_one);
  ASSERT_EQ(cluster_.WaitFor(running, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_RUNNING; },
                             60s)
                .state(),
            v1::JOB_STATE_RUNNING);
  v1::JobSpec from_running = long_one;
  from_running.set_resume_from_job(running);
  EXPECT_NE(refused(from_running).find("is running"), std::string::npos);
}

// `joule tune`: rung by rung, each promoted cell's next rung starts from its last one's
// checkpoint; the client killed mid-search and run again submits nothing twice and ends
// with a choice, a job file that `joule submit -f` runs.
TEST_F(ClusterTest, TuneSurvivesItsClientKilledAndChoosesACellThatReachedTheTarget) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  const std::string file = (dir_ / "tune.yaml").string();
  {
    std::ofstream f(file);
    f << "name: it-tune\n"
         "base: {model: mlp, dataset: fashion-mnist, epochs: 8, max_train_samples: 6000,\n"
         "       max_test_samples: 1000, optimizer: {lr: 0.05, momentum: 0.9}}\n"
         "grid:\n"
         "  workers: [1, 2]\n"
         "  global_batch_size: [64, 256]\n"
         "target_accuracy: 0.8\n";
  }
  // The first client: killed once the first rung's jobs are in.
  {
    ChildProcess client({ProgramPath("joule"), "--coordinator", cluster_.address(), "--insecure",
                         "tune", "run", file, "--choice", (dir_ / "first.yaml").string()},
                        (dir_ / "tune-first.log").string());
    const auto by = std::chrono::steady_clock::now() + 60s;
    size_t submitted = 0;
    while (std::chrono::steady_clock::now() < by && submitted < 4) {
      v1::ListJobsRequest req;
      (*req.mutable_labels())["tune"] = "it-tune";
      grpc::ClientContext ctx;
      v1::ListJobsResponse resp;
      if (cluster_.stub().ListJobs(&ctx, req, &resp).ok()) submitted = resp.jobs_size();
      std::this_thread::sleep_for(50ms);
    }
    ASSERT_GE(submitted, 4u);
    client.Signal(SIGKILL);
  }
  std::string out;
  const std::string choice = (dir_ / "choice.yaml").string();
  ASSERT_EQ(cluster_.Cli({"tune", "run", file, "--choice", choice}, &out), 0) << out;
  EXPECT_NE(out.find("chosen: workers="), std::string::npos) << out;
  EXPECT_NE(out.find("rung 1 (4 epochs)"), std::string::npos) << out;
  // One job per cell and rung, each later rung started from the one before.
  v1::ListJobsRequest req;
  (*req.mutable_labels())["tune"] = "it-tune";
  grpc::ClientContext ctx;
  v1::ListJobsResponse resp;
  ASSERT_TRUE(cluster_.stub().ListJobs(&ctx, req, &resp).ok());
  std::map<std::pair<std::string, std::string>, int64_t> by_rung;
  for (const v1::Job& j : resp.jobs()) {
    const auto key = std::make_pair(j.spec().labels().at("cell"), j.spec().labels().at("rung"));
    EXPECT_EQ(by_rung.count(key), 0u) << key.first << " rung " << key.second << " twice";
    by_rung[key] = j.id();
  }
  int resumed = 0;
  for (const v1::Job& j : resp.jobs()) {
    if (j.spec().labels().at("rung") == "0") {
      EXPECT_EQ(j.spec().resume_from_job(), 0);
      continue;
    }
    ++resumed;
    const std::string before = std::to_string(std::stoi(j.spec().labels().at("rung")) - 1);
    const int64_t previous = by_rung[std::make_pair(j.spec().labels().at("cell"), before)];
    EXPECT_EQ(j.spec().resume_from_job(), previous);
    EXPECT_GT(j.result().resumed_from_step(), 0) << j.id();
  }
  EXPECT_GE(resumed, 1);
  // Again: nothing new, the same choice.
  std::string again;
  ASSERT_EQ(cluster_.Cli({"tune", "run", file, "--choice", choice}, &again), 0) << again;
  EXPECT_EQ(again.find("submitted"), std::string::npos) << again;
  EXPECT_EQ(again.substr(again.find("chosen:")), out.substr(out.find("chosen:")));
  // The choice is a job file that runs and reaches the target.
  ASSERT_EQ(cluster_.Cli({"submit", "-f", choice}, &out), 0) << out;
  const int64_t id = std::stoll(out);
  const v1::Job chosen = cluster_.WaitDone(id);
  ASSERT_EQ(chosen.state(), v1::JOB_STATE_SUCCEEDED) << chosen.reason();
  EXPECT_GE(chosen.result().test_accuracy(), 0.8);
}

// `joule tune` outlives a coordinator killed mid-search: the client waits for it (the
// coordinator restarted on its port and database re-queues the running rung jobs), then
// ends the search itself, every cell's rung run once. Its jobs are then history: the
// estimator orders a new search's first rung and skips the cells that cannot meet its
// max_wall_time.
TEST_F(ClusterTest, TuneRidesOutACoordinatorRestartAndItsEstimatorSkipsHopelessCells) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  const auto tune_file = [&](const std::string& name, const std::string& extra) {
    const std::string file = (dir_ / (name + ".yaml")).string();
    std::ofstream f(file);
    f << "name: " << name
      << "\n"
         "base: {model: mlp, dataset: fashion-mnist, epochs: 4, max_train_samples: 6000,\n"
         "       max_test_samples: 1000, optimizer: {lr: 0.05, momentum: 0.9}}\n"
         "grid:\n"
         "  workers: [1, 2]\n"
         "  global_batch_size: [64, 256]\n"
         "target_accuracy: 0.8\n"
      << extra;
    return file;
  };
  const std::string file = tune_file("it-tune-restart", "");
  ChildProcess client(
      {ProgramPath("joule"), "--coordinator", cluster_.address(), "--insecure", "tune", "run", file,
       "--poll-ms", "200", "--choice", (dir_ / "choice.yaml").string()},
      (dir_ / "tune.log").string());
  // The coordinator killed while a rung job runs.
  const auto by = std::chrono::steady_clock::now() + 60s;
  bool running = false;
  while (std::chrono::steady_clock::now() < by && !running) {
    v1::ListJobsRequest req;
    (*req.mutable_labels())["tune"] = "it-tune-restart";
    grpc::ClientContext ctx;
    v1::ListJobsResponse resp;
    if (cluster_.stub().ListJobs(&ctx, req, &resp).ok()) {
      for (const v1::Job& j : resp.jobs()) running |= j.state() == v1::JOB_STATE_RUNNING;
    }
    if (!running) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(running) << Slurp(dir_ / "tune.log");
  const std::string listen = cluster_.address();
  cluster_.coordinator().Signal(SIGKILL);
  cluster_.coordinator().Wait(10s);
  // Down until the client has found it so.
  const auto noticed_by = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < noticed_by &&
         Slurp(dir_ / "tune.log").find("the coordinator cannot be reached") == std::string::npos) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator(listen));
  const int status = client.Wait(300s);
  const std::string log = Slurp(dir_ / "tune.log");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << log;
  EXPECT_NE(log.find("the coordinator cannot be reached"), std::string::npos) << log;
  EXPECT_NE(log.find("chosen: workers="), std::string::npos) << log;
  v1::ListJobsRequest req;
  (*req.mutable_labels())["tune"] = "it-tune-restart";
  grpc::ClientContext ctx;
  v1::ListJobsResponse resp;
  ASSERT_TRUE(cluster_.stub().ListJobs(&ctx, req, &resp).ok());
  std::set<std::pair<std::string, std::string>> runs;
  for (const v1::Job& j : resp.jobs()) {
    EXPECT_TRUE(runs.insert({j.spec().labels().at("cell"), j.spec().labels().at("rung")}).second)
        << j.spec().labels().at("cell") << " rung " << j.spec().labels().at("rung") << " twice";
  }
  EXPECT_GE(runs.size(), 4u);

  // A new search of the same family: every cell estimated, the cheapest first; a wall time
  // no first epoch can meet skips them all, and nothing is submitted.
  std::string out;
  ASSERT_EQ(cluster_.Cli({"tune", "run", tune_file("it-tune-estimated", ""), "--dry-run"}, &out), 0)
      << out;
  EXPECT_NE(out.find("estimator: 4 of 4 cells estimated"), std::string::npos) << out;
  EXPECT_EQ(out.find("skipped"), std::string::npos) << out;
  ASSERT_EQ(
      cluster_.Cli({"tune", "run", tune_file("it-tune-hopeless", "max_wall_time: 0.001\n")}, &out),
      1)
      << out;
  size_t skipped = 0;
  for (size_t at = out.find("  skipped "); at != std::string::npos;
       at = out.find("  skipped ", at + 1)) {
    ++skipped;
  }
  EXPECT_EQ(skipped, 4u) << out;
  EXPECT_NE(out.find("over max_wall_time"), std::string::npos) << out;
  EXPECT_NE(out.find("no cell reached the target"), std::string::npos) << out;
  v1::ListJobsRequest hopeless;
  (*hopeless.mutable_labels())["tune"] = "it-tune-hopeless";
  grpc::ClientContext ctx2;
  ASSERT_TRUE(cluster_.stub().ListJobs(&ctx2, hopeless, &resp).ok());
  EXPECT_EQ(resp.jobs_size(), 0);
}

// The same for a genetic-algorithm job (an mlp genome): the islands' checkpoint, written
// by rank 0 every 20 generations, carries the job over to the second attempt, which ends
// the run from there.
TEST_F(ClusterTest, AKilledGaWorkerIsSurvivedFromTheIslandsCheckpoint) {
  cluster_.StartWorkers(3);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(3, 30s));
  v1::JobSpec spec = ShortSpec(2);
  spec.set_algorithm("ga");
  spec.add_hidden_sizes(32);
  spec.set_checkpoint_every_steps(20);
  v1::GaSpec* ga = spec.mutable_ga();
  ga->set_population(32);
  ga->set_generations(6000);  // ~25 s here: still running after the first progress report
                              // on a host ten times faster
  ga->set_elite(2);
  ga->set_migration_interval(10);
  ga->set_migration_size(2);
  ga->set_fitness_batch(128);
  int64_t id = cluster_.Submit(spec);
  v1::Job job = cluster_.WaitFor(
      id, [](const v1::Job& j) { return j.progress().step() >= 100; }, 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ChildProcess* victim = cluster_.WorkerRunning(id, 1);
  ASSERT_NE(victim, nullptr);
  const int64_t generation_at_kill = cluster_.Get(id).progress().step();
  victim->Signal(SIGKILL);
  job = cluster_.WaitDone(id, 180s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_GT(job.result().resumed_from_step(), 0);
  EXPECT_GE(job.result().resumed_from_step(), generation_at_kill - 20);
  EXPECT_EQ(job.result().steps(), 6000);
  EXPECT_EQ(job.result().ranks(0).parameter_hash(), job.result().ranks(1).parameter_hash());
  EXPECT_GT(job.result().test_accuracy(), 0.3);
}

// A SIGSTOPped rank: alive, sockets open, silent. `transport` is the workers' --transport
// (shared memory on one host, or Gloo over TCP as between hosts).
void ClusterTest::FrozenWorkerIsDeclaredDeadAndTheJobResumes(const std::string& transport) {
  cluster_.StartWorkers(3, {"--transport", transport});
  ASSERT_TRUE(cluster_.WaitIdleWorkers(3, 30s));
  int64_t id = cluster_.Submit(CheckpointedSpec());
  ASSERT_FALSE(cluster_.WaitForCheckpoint(60s).empty());
  v1::Job job = cluster_.Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ChildProcess* victim = cluster_.WorkerRunning(id, 1);
  ASSERT_NE(victim, nullptr);
  victim->Signal(SIGSTOP);  // alive, sockets open, silent
  const auto stopped = std::chrono::steady_clock::now();
  job = cluster_.WaitFor(
      id, [](const v1::Job& j) { return j.attempt() >= 2; }, kCollectiveTimeout);
  ASSERT_GE(job.attempt(), 2) << job.reason();
  // The heartbeat timeout plus the abort, not the collective timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, 15s);
  job = cluster_.WaitDone(id, 120s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  ASSERT_EQ(job.result().failed_attempts_size(), 1);
  EXPECT_NE(job.result().failed_attempts(0).find("no heartbeat"), std::string::npos)
      << job.result().failed_attempts(0);
  EXPECT_GT(job.result().resumed_from_step(), 0);
  victim->Signal(SIGKILL);
}

TEST_F(ClusterTest, AFrozenWorkerIsDeclaredDeadAndTheJobResumes) {
  FrozenWorkerIsDeclaredDeadAndTheJobResumes("auto");  // shared memory
}

TEST_F(ClusterTest, AFrozenWorkerIsDeclaredDeadAndTheJobResumesOverGloo) {
  FrozenWorkerIsDeclaredDeadAndTheJobResumes("gloo");
}

TEST_F(ClusterTest, ACoordinatorKilledMidJobLosesNothing) {
  // A fixed port, so that the workers find the restarted coordinator.
  const std::string listen = cluster_.address();
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  int64_t running = cluster_.Submit(CheckpointedSpec(), "req-running");
  int64_t waiting = cluster_.Submit(ShortSpec(3), "req-waiting");  // 3 workers: stays pending
  ASSERT_FALSE(cluster_.WaitForCheckpoint(60s).empty());
  v1::Job job = cluster_.Get(running);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING);

  cluster_.coordinator().Signal(SIGKILL);
  cluster_.coordinator().Wait(10s);
  ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator(listen));
  ASSERT_EQ(cluster_.address(), listen);

  // Both acknowledged jobs are there; retried submits return them, never new ones.
  bool existing = false;
  EXPECT_EQ(cluster_.Submit(CheckpointedSpec(), "req-running", &existing), running);
  EXPECT_TRUE(existing);
  EXPECT_EQ(cluster_.Submit(ShortSpec(3), "req-waiting", &existing), waiting);
  EXPECT_TRUE(existing);
  EXPECT_EQ(cluster_.Get(waiting).state(), v1::JOB_STATE_PENDING);

  // The workers come back on their own and the job resumes from its checkpoint.
  job = cluster_.WaitDone(running, 120s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_GE(job.attempt(), 2);
  EXPECT_GT(job.result().resumed_from_step(), 0);
  std::string out;
  EXPECT_EQ(cluster_.Cli({"list"}, &out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 3) << out;  // header + 2 jobs
  EXPECT_EQ(cluster_.Cli({"cancel", std::to_string(waiting)}, &out), 0) << out;
}

TEST_F(ClusterTest, AGracefulCoordinatorStopSpendsNoRestartAndKeepsTheAttemptsEnergy) {
  const std::string listen = cluster_.address();
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec spec = CheckpointedSpec();
  spec.set_no_restarts(true);  // a failed attempt would end the job FAILED
  int64_t id = cluster_.Submit(spec);
  ASSERT_FALSE(cluster_.WaitForCheckpoint(60s).empty());
  v1::Job job = cluster_.Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING);

  // The workers are paused so that the job cannot end within the server's shutdown grace,
  // however fast this machine is; they resume once the coordinator has gone.
  for (auto& w : cluster_.workers()) w->Signal(SIGSTOP);
  cluster_.coordinator().Signal(SIGTERM);
  const int status = cluster_.coordinator().Wait(30s);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string text = Slurp(cluster_.coordinator_log());
  EXPECT_NE(text.find("1 running attempt(s) left as they are"), std::string::npos) << text;
  for (auto& w : cluster_.workers()) w->Signal(SIGCONT);
  ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator(listen));

  job = cluster_.WaitDone(id, 120s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.result().failed_attempts_size(), 0);
  EXPECT_GE(job.attempt(), 2);
  // The interrupted attempt's ranks delivered their results when their workers
  // reconnected: its energy is in the report.
  job = cluster_.WaitFor(
      id,
      [](const v1::Job& j) {
        return j.result().attempts_size() >= 2 && j.result().attempts(0).ranks_reported_size() == 2;
      },
      30s);
  ASSERT_GE(job.result().attempts_size(), 2);
  EXPECT_EQ(job.result().attempts(0).ranks_reported_size(), 2);
  EXPECT_GT(job.result().energy().earlier_attempts_joules(), 0.0);
}

// The threads of `pid` other than its main one, those that do not block `sig` first
// (SigBlk in /proc/PID/task/TID/status).
std::vector<pid_t> OtherThreadsUnblockedFirst(pid_t pid, int sig) {
  std::vector<pid_t> unblocked, blocked;
  for (const auto& task : fs::directory_iterator(absl::StrFormat("/proc/%d/task", pid))) {
    const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    if (tid == pid) continue;
    std::ifstream status(task.path() / "status");
    std::string line;
    std::optional<uint64_t> mask;
    while (std::getline(status, line)) {
      if (line.rfind("SigBlk:", 0) == 0) mask = std::stoull(line.substr(7), nullptr, 16);
    }
    if (!mask) continue;  // the thread ended while this looked
    (*mask & (uint64_t{1} << (sig - 1)) ? blocked : unblocked).push_back(tid);
  }
  unblocked.insert(unblocked.end(), blocked.begin(), blocked.end());
  return unblocked;
}

// SIGTERM is a stop wherever the kernel delivers it. Threads that libraries start before
// main (OpenBLAS's pool) did not block it, so one delivered there killed the worker by its
// default action (and a container's PID 1 dropped it: `podman stop` then waited out its
// timeout). Sent here to such a thread on purpose.
TEST_F(ClusterTest, AWorkerStopsCleanlyOnSigtermWhicheverThreadTakesIt) {
  cluster_.StartWorkers(1);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(1, 30s));
  ChildProcess& worker = *cluster_.workers()[0];
  // The first thread that still exists when signalled (a pool may retire one meanwhile).
  bool sent = false;
  for (pid_t tid : OtherThreadsUnblockedFirst(worker.pid(), SIGTERM)) {
    if (syscall(SYS_tgkill, worker.pid(), tid, SIGTERM) == 0) {
      sent = true;
      break;
    }
  }
  ASSERT_TRUE(sent) << "no thread of the worker could be signalled";
  const int status = worker.Wait(30s);
  const std::string log = Slurp(cluster_.worker_log(0));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << log;
  EXPECT_NE(log.find("signal 15: stopping"), std::string::npos) << log;
}

TEST_F(ClusterTest, ASecondCoordinatorOnABusyPortExitsWithTheReason) {
  ChildProcess second({ProgramPath("joule-coordinator"), "--listen", cluster_.address(), "--db",
                       (dir_ / "second.db").string(), "--insecure"},
                      (dir_ / "second.log").string());
  const int status = second.Wait(30s);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string text = Slurp(dir_ / "second.log");
  EXPECT_NE(text.find("address already in use"), std::string::npos) << text;
  EXPECT_NE(text.find(cluster_.address()), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(dir_ / "second.db")) << "the store was opened before the port";
}

// Writes a 4-file IDX dataset of `size`x`size` images (10 classes) under dir/fashion-mnist.
void WriteTinyDataset(const fs::path& dir, uint32_t size) {
  fs::create_directories(dir / "fashion-mnist");
  auto header = [](uint8_t ndim, std::vector<uint32_t> dims) {
    std::string h = {0, 0, 8, static_cast<char>(ndim)};
    for (uint32_t d : dims) {
      for (int sh = 24; sh >= 0; sh -= 8) h.push_back(static_cast<char>((d >> sh) & 0xff));
    }
    return h;
  };
  for (const char* split : {"train", "t10k"}) {
    const uint32_t n = 512;
    std::string images = header(3, {n, size, size}) + std::string(n * size * size, '\x40');
    std::string labels = header(1, {n});
    for (uint32_t i = 0; i < n; ++i) labels.push_back(static_cast<char>(i % 10));
    std::ofstream(dir / "fashion-mnist" / (std::string(split) + "-images-idx3-ubyte"),
                  std::ios::binary)
        << images;
    std::ofstream(dir / "fashion-mnist" / (std::string(split) + "-labels-idx1-ubyte"),
                  std::ios::binary)
        << labels;
  }
}

TEST_F(ClusterTest, RanksThatDisagreeFailFastNamingTheRank) {
  WriteTinyDataset(dir_ / "data-a", 12);
  WriteTinyDataset(dir_ / "data-b", 10);  // a different input shape: a different model
  cluster_.StartWorkers(1, {"--data-root", (dir_ / "data-a").string()});
  ASSERT_TRUE(cluster_.WaitIdleWorkers(1, 30s));
  cluster_.StartWorkers(1, {"--data-root", (dir_ / "data-b").string()});
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec spec = ShortSpec(2);
  spec.clear_max_train_samples();
  spec.clear_max_test_samples();
  const auto submitted = std::chrono::steady_clock::now();
  v1::Job job = cluster_.WaitDone(cluster_.Submit(spec), 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.reason();
  EXPECT_NE(job.reason().find("rank 1 differs from rank 0"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("input=1x10x10"), std::string::npos) << job.reason();
  EXPECT_EQ(job.result().failed_attempts_size(), 0);  // not worth a restart
  EXPECT_LT(std::chrono::steady_clock::now() - submitted, 10s);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 15s));
}

}  // namespace
}  // namespace joule
