// Integration: the real joule-coordinator and joule-worker processes on 127.0.0.1 with
// ephemeral ports, real Fashion-MNIST, driven over gRPC and through the `joule` CLI.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "joule/v1/job.grpc.pb.h"
#include "tests/testing/process.h"

namespace joule {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::RunCommand;
using namespace std::chrono_literals;

const std::string kBin = JOULE_BIN_DIR;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("joule_it_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    coordinator_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{kBin + "/joule-coordinator", "--listen", "127.0.0.1:0",
                                 "--db", (dir_ / "jobs.db").string(), "--address-file",
                                 (dir_ / "addr").string(), "--heartbeat-timeout-ms", "4000"},
        (dir_ / "coordinator.log").string());
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (address_.empty() && std::chrono::steady_clock::now() < deadline) {
      std::ifstream(dir_ / "addr") >> address_;
      if (address_.empty()) std::this_thread::sleep_for(20ms);
    }
    ASSERT_FALSE(address_.empty()) << "coordinator did not start; see " << dir_;
    stub_ = v1::JobService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      int index = static_cast<int>(workers_.size());
      workers_.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{kBin + "/joule-worker", "--coordinator", address_,
                                   "--threads", "1", "--collective-timeout-ms", "10000"},
          (dir_ / ("worker-" + std::to_string(index) + ".log")).string()));
    }
  }

  std::vector<v1::WorkerInfo> Workers() {
    grpc::ClientContext ctx;
    v1::ListWorkersResponse resp;
    EXPECT_TRUE(stub_->ListWorkers(&ctx, {}, &resp).ok());
    return {resp.workers().begin(), resp.workers().end()};
  }

  // Waits until `n` workers hold sessions and are idle.
  bool WaitIdleWorkers(size_t n, std::chrono::seconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      size_t idle = 0;
      for (const auto& w : Workers()) idle += w.state() == v1::WORKER_STATE_IDLE;
      if (idle == n) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
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

  int64_t Submit(const v1::JobSpec& spec) {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitJobResponse resp;
    grpc::Status s = stub_->SubmitJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job_id();
  }

  v1::Job Get(int64_t id) {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    EXPECT_TRUE(stub_->GetJob(&ctx, req, &job).ok());
    return job;
  }

  // Polls until `pred(job)` or the timeout; returns the last job seen.
  v1::Job WaitFor(int64_t id, const std::function<bool(const v1::Job&)>& pred,
                  std::chrono::seconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    v1::Job job = Get(id);
    while (!pred(job) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(50ms);
      job = Get(id);
    }
    return job;
  }

  v1::Job WaitDone(int64_t id, std::chrono::seconds timeout = 120s) {
    return WaitFor(
        id,
        [](const v1::Job& j) {
          return j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED ||
                 j.state() == v1::JOB_STATE_CANCELLED;
        },
        timeout);
  }

  int Cli(std::vector<std::string> args, std::string* out) {
    args.insert(args.begin(), {kBin + "/joule", "--coordinator", address_});
    return RunCommand(args, out);
  }

  fs::path dir_;
  std::string address_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(ClusterTest, ShortJobSucceedsWithIdenticalParametersOnEveryRank) {
  StartWorkers(2);
  ASSERT_TRUE(WaitIdleWorkers(2, 30s));
  v1::JobSpec spec = ShortSpec(2);
  spec.set_epochs(2);
  int64_t id = Submit(spec);
  v1::Job job = WaitDone(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  ASSERT_EQ(job.result().ranks_size(), 2);
  EXPECT_GT(job.result().test_accuracy(), 0.65);  // chance is 0.10
  EXPECT_EQ(job.result().ranks(0).parameter_hash(), job.result().ranks(1).parameter_hash());
  EXPECT_EQ(job.result().samples(), 2 * (6000 / 64) * 64);
  EXPECT_GT(job.result().samples_per_second(), 0);

  std::string out;
  EXPECT_EQ(Cli({"status", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("succeeded"), std::string::npos) << out;
  EXPECT_NE(out.find(job.result().ranks(0).parameter_hash()), std::string::npos) << out;
  EXPECT_EQ(Cli({"watch", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;
  EXPECT_EQ(Cli({"list"}, &out), 0) << out;
  EXPECT_NE(out.find("succeeded"), std::string::npos) << out;
}

TEST_F(ClusterTest, CliSubmitWatchReportsFailureAndBadSpecs) {
  StartWorkers(1);
  ASSERT_TRUE(WaitIdleWorkers(1, 30s));
  std::string out;
  EXPECT_EQ(Cli({"submit", "--model", "mlp", "--workers", "3", "--global-batch-size", "100"},
                &out),
            2)
      << out;
  EXPECT_NE(out.find("global_batch_size 100 is not divisible by workers 3"), std::string::npos)
      << out;
  EXPECT_EQ(Cli({"submit", "--model", "logreg", "--global-batch-size", "64",
                 "--max-train-samples", "2000", "--max-test-samples", "500", "--watch"},
                &out),
            0)
      << out;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;
  EXPECT_EQ(Cli({"status", "999"}, &out), 1);
  EXPECT_NE(out.find("job 999 does not exist"), std::string::npos) << out;
}

TEST_F(ClusterTest, CancelStopsARunningJobAndFreesItsWorkers) {
  StartWorkers(2);
  ASSERT_TRUE(WaitIdleWorkers(2, 30s));
  v1::JobSpec long_job = ShortSpec(2);
  long_job.clear_max_train_samples();
  long_job.set_epochs(50);
  int64_t id = Submit(long_job);
  v1::Job job = WaitFor(
      id, [](const v1::Job& j) { return j.progress().step() > 0; }, 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();

  std::string out;
  EXPECT_EQ(Cli({"cancel", std::to_string(id)}, &out), 0) << out;
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(WaitIdleWorkers(2, 15s)) << "workers were not freed after cancel";
  v1::Job next = WaitDone(Submit(ShortSpec(2)));
  EXPECT_EQ(next.state(), v1::JOB_STATE_SUCCEEDED) << next.reason();
}

TEST_F(ClusterTest, GangWaitsForAThirdWorkerThenRuns) {
  StartWorkers(2);
  ASSERT_TRUE(WaitIdleWorkers(2, 30s));
  int64_t id = Submit(ShortSpec(3));
  // It must stay pending, with the reason, for as long as only two workers exist.
  auto until = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < until) {
    v1::Job job = Get(id);
    ASSERT_EQ(job.state(), v1::JOB_STATE_PENDING);
    EXPECT_EQ(job.reason(), "waiting for 3 idle cpu workers: 2 registered, 2 idle");
    std::this_thread::sleep_for(100ms);
  }
  std::string out;
  EXPECT_EQ(Cli({"status", std::to_string(id)}, &out), 0);
  EXPECT_NE(out.find("waiting for 3 idle cpu workers"), std::string::npos) << out;
  StartWorkers(1);
  v1::Job job = WaitDone(id);
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
  StartWorkers(2);
  ASSERT_TRUE(WaitIdleWorkers(2, 30s));
  v1::JobSpec spec = ShortSpec(2);
  spec.set_dataset("idx:" + data.string());
  v1::Job job = WaitDone(Submit(spec), 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find("train-images-idx3-ubyte.gz"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("truncated"), std::string::npos) << job.reason();
  ASSERT_TRUE(WaitIdleWorkers(2, 15s));
  EXPECT_EQ(WaitDone(Submit(ShortSpec(2))).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(ClusterTest, AKilledWorkerFailsItsJobAndReleasesThePeer) {
  StartWorkers(2);
  ASSERT_TRUE(WaitIdleWorkers(2, 30s));
  v1::JobSpec long_job = ShortSpec(2);
  long_job.clear_max_train_samples();
  long_job.set_epochs(50);
  int64_t id = Submit(long_job);
  ASSERT_EQ(WaitFor(id, [](const v1::Job& j) { return j.progress().step() > 0; }, 60s).state(),
            v1::JOB_STATE_RUNNING);
  workers_[1]->Signal(SIGKILL);
  v1::Job job = WaitDone(id, 30s);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_FALSE(job.reason().empty());
  ASSERT_TRUE(WaitIdleWorkers(1, 20s)) << "the surviving rank was not released";
}

}  // namespace
}  // namespace joule
