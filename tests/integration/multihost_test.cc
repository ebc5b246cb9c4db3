// Integration across test hosts: the coordinator and each worker in a network namespace of
// their own (scripts/netns-hosts.sh, through testing::NetnsHosts), joined by veth links to
// one bridge, so that gangs talk Gloo over TCP between addresses as between machines. The
// control plane off loopback is TLS with tokens. Needs root (CI runs as root); skips
// without it. Every namespace, veth and the bridge is gone after each test, passed or not.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "joule/v1/job.grpc.pb.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/netns_hosts.h"
#include "tests/testing/process.h"
#include "tests/testing/scratch_dir.h"

namespace joule {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::LocalCluster;
using testing::NetnsHosts;
using testing::ScratchDir;
using testing::Slurp;
using namespace std::chrono_literals;

constexpr std::chrono::milliseconds kHeartbeatTimeout = 4s;
constexpr std::chrono::milliseconds kCollectiveTimeout = 30s;
constexpr int kHosts = 5;  // host 1: the coordinator; hosts 2..5: one worker each

// Occurrences of `needle` in `text`.
int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

class MultihostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hosts_ = std::make_unique<NetnsHosts>(kHosts, dir_ / "hosts.log");
    if (!hosts_->ready()) {
      if (!hosts_->skip_reason().empty()) GTEST_SKIP() << hosts_->skip_reason();
      FAIL() << "the test hosts did not come up:\n" << hosts_->log();
    }
    std::ofstream(dir_ / "clients") << "tester s3cret-tester\n";
    std::ofstream(dir_ / "tester") << "s3cret-tester\n";
    std::ofstream(dir_ / "join") << "join-me\n";
    testing::LocalClusterOptions o;
    o.tls = true;
    o.client_token = "s3cret-tester";
    o.certificate_ips = {NetnsHosts::Address(1)};
    o.coordinator_prefix = hosts_->Prefix(1);
    o.coordinator_flags = {"--client-tokens-file", (dir_ / "clients").string(),
                           "--join-token-file", (dir_ / "join").string()};
    o.heartbeat_timeout = kHeartbeatTimeout;
    o.collective_timeout = kCollectiveTimeout;
    o.data_roots = {"/usr/share/datasets"};
    // One directory every host sees (the namespaces share the filesystem); a real cluster
    // needs shared storage here (NFS, a PVC).
    o.checkpoint_root = (dir_ / "checkpoints").string();
    o.worker_flags = {"--join-token-file", (dir_ / "join").string()};
    cluster_ = std::make_unique<LocalCluster>(dir_.path(), o);
    ASSERT_NO_FATAL_FAILURE(cluster_->StartCoordinator(NetnsHosts::Address(1) + ":0"));
    ASSERT_TRUE(cluster_->address().starts_with(NetnsHosts::Address(1) + ":"))
        << cluster_->address();
  }

  void TearDown() override {
    cluster_.reset();  // kills the workers and the coordinator
    if (!hosts_) return;
    const std::string run = hosts_->run();
    hosts_.reset();
    if (!run.empty()) {
      EXPECT_EQ(NetnsHosts::Leftovers(run), "") << "test hosts left behind";
    }
  }

  // One worker on each of hosts first..last, its Gloo on the host's address.
  void StartWorkersOnHosts(int first, int last) {
    for (int h = first; h <= last; ++h) {
      cluster_->StartWorkers(1, {"--gloo-host", NetnsHosts::Address(h)}, hosts_->Prefix(h));
    }
  }

  // What the workers' logs say about the transports their ranks connected over.
  void ExpectOnlyGloo(int connections) {
    std::string logs;
    for (size_t i = 0; i < cluster_->workers().size(); ++i) {
      logs += Slurp(cluster_->worker_log(static_cast<int>(i)));
    }
    EXPECT_EQ(Count(logs, "connected over gloo"), connections) << logs;
    EXPECT_EQ(Count(logs, "connected over shm"), 0) << logs;
  }

  int Cli(const std::vector<std::string>& args, std::string* out) {
    return cluster_->CliWith(
        {"--tls-ca", cluster_->ca_file(), "--token-file", (dir_ / "tester").string()}, args,
        out);
  }

  static v1::JobSpec ShortSpec(int workers, int epochs) {
    v1::JobSpec s;
    s.set_name("multihost");
    s.set_model("mlp");
    s.set_dataset("fashion-mnist");
    s.set_workers(workers);
    s.set_global_batch_size(32 * workers);
    s.set_epochs(epochs);
    s.mutable_optimizer()->set_lr(0.05);
    s.mutable_optimizer()->set_momentum(0.9);
    s.set_max_train_samples(6000);
    s.set_max_test_samples(2000);
    return s;
  }

  ScratchDir dir_{"mh"};
  std::unique_ptr<NetnsHosts> hosts_;
  std::unique_ptr<LocalCluster> cluster_;
};

// Gangs of 2 and of 4 across hosts: Gloo (never shared memory across namespaces, though the
// host names agree), every rank ends with the same parameters, accuracy as on one host.
TEST_F(MultihostTest, GangsOfTwoAndFourAcrossHostsUseGlooAndAgree) {
  StartWorkersOnHosts(2, 5);
  ASSERT_TRUE(cluster_->WaitIdleWorkers(4, 30s)) << Slurp(cluster_->worker_log(0));
  struct Case {
    int workers, epochs;
  };
  int connections = 0;
  for (const Case c : {Case{2, 2}, Case{4, 3}}) {
    const v1::JobSpec spec = ShortSpec(c.workers, c.epochs);
    const int64_t id = cluster_->Submit(spec);
    const v1::Job job = cluster_->WaitDone(id, 90s);
    ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << c.workers << ": " << job.reason();
    ASSERT_EQ(job.result().ranks_size(), c.workers);
    for (int r = 1; r < c.workers; ++r) {
      EXPECT_EQ(job.result().ranks(r).parameter_hash(), job.result().ranks(0).parameter_hash())
          << c.workers << " workers, rank " << r;
    }
    EXPECT_GT(job.result().test_accuracy(), 0.65) << c.workers;  // chance is 0.10
    EXPECT_EQ(job.result().samples(), c.epochs * (6000 / (32 * c.workers)) * 32 * c.workers);
    std::string out;
    EXPECT_EQ(Cli({"status", std::to_string(id)}, &out), 0) << out;
    EXPECT_NE(out.find("succeeded"), std::string::npos) << out;
    connections += c.workers;
    ASSERT_TRUE(cluster_->WaitIdleWorkers(4, 15s));
  }
  ExpectOnlyGloo(connections);
}

// A worker SIGKILLed mid-job on its host: the survivor is released, and the job resumes on
// the spare (a third host) from the checkpoint in the shared directory, and succeeds.
TEST_F(MultihostTest, AKilledWorkerIsReplacedByASpareHostFromTheCheckpoint) {
  StartWorkersOnHosts(2, 4);
  ASSERT_TRUE(cluster_->WaitIdleWorkers(3, 30s)) << Slurp(cluster_->worker_log(0));
  v1::JobSpec spec = ShortSpec(2, 1);
  spec.set_max_train_samples(19200);  // 300 steps
  spec.set_checkpoint_every_steps(50);
  const int64_t id = cluster_->Submit(spec);
  ASSERT_FALSE(cluster_->WaitForCheckpoint(60s).empty());
  v1::Job job = cluster_->Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ChildProcess* victim = cluster_->WorkerRunning(id, 1);
  ASSERT_NE(victim, nullptr);
  victim->Signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  job = cluster_->WaitFor(
      id, [](const v1::Job& j) { return j.attempt() >= 2; }, kCollectiveTimeout);
  ASSERT_GE(job.attempt(), 2) << job.reason();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 15s);
  job = cluster_->WaitDone(id, 90s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempt(), 2);
  ASSERT_EQ(job.result().failed_attempts_size(), 1);
  EXPECT_GT(job.result().resumed_from_step(), 0);
  EXPECT_EQ(job.result().steps(), 300);
  ASSERT_EQ(job.result().ranks_size(), 2);
  EXPECT_EQ(job.result().ranks(0).parameter_hash(), job.result().ranks(1).parameter_hash());
  EXPECT_GT(job.result().test_accuracy(), 0.65);
  ExpectOnlyGloo(4);  // two ranks in each attempt
}

}  // namespace
}  // namespace joule
