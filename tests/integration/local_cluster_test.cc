// The integration fixture itself (tests/testing/local_cluster.h, scratch_dir.h): what the
// other integration tests rely on, checked against a real coordinator without workers.
#include "tests/testing/local_cluster.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "tests/testing/scratch_dir.h"

namespace joule::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The failures `statement` reports through GoogleTest, intercepted (so they do not fail
// this test) and joined, one message a line.
template <typename F>
std::string Failures(F statement) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    statement();
  }
  std::string messages;
  for (int i = 0; i < results.size(); ++i) {
    messages += results.GetTestPartResult(i).message();
    messages += "\n";
  }
  return messages;
}

v1::JobSpec PendingSpec() {  // 8 workers: never placed here
  v1::JobSpec s;
  s.set_model("mlp");
  s.set_dataset("fashion-mnist");
  s.set_workers(8);
  s.set_global_batch_size(64);
  s.set_epochs(1);
  s.mutable_optimizer()->set_lr(0.05);
  return s;
}

TEST(ScratchDirTest, IsNamedForTheTestStartsEmptyAndGoesWhenTheTestPasses) {
  fs::path path;
  {
    ScratchDir dir("fixture");
    path = dir.path();
    EXPECT_EQ(path.parent_path(), fs::temp_directory_path());
    EXPECT_NE(path.filename().string().find("ScratchDirTest.IsNamedForTheTestStartsEmpty"),
              std::string::npos)
        << path;
    ASSERT_TRUE(fs::is_directory(path));
    EXPECT_TRUE(fs::is_empty(path));
    std::ofstream(dir / "left-over") << "x";
    EXPECT_EQ(Slurp(dir / "left-over"), "x");
    // A second one for the same test (a rerun) starts empty again.
    ScratchDir again("fixture");
    EXPECT_EQ(again.path(), path);
    EXPECT_TRUE(fs::is_empty(path));
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(PollUntilTest, StopsAtTheEvidenceOrAtTheDeadline) {
  int calls = 0;
  EXPECT_TRUE(PollUntil([&] { return ++calls == 3; }, 60s, 1ms));
  EXPECT_EQ(calls, 3);

  calls = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(PollUntil([&] { return ++calls < 0; }, 30ms, 1ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  EXPECT_GE(calls, 2);
  EXPECT_EQ(Slurp("/nonexistent/file"), "");
}

class LocalClusterTest : public ::testing::Test {
 protected:
  LocalClusterOptions Options() {
    LocalClusterOptions o;
    o.checkpoint_root = (dir_ / "checkpoints").string();
    return o;
  }

  ScratchDir dir_{"fixture"};
};

TEST_F(LocalClusterTest, RestartsOnTheSameDatabaseAndPort) {
  LocalCluster cluster(dir_.path(), Options());
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator());
  const std::string address = cluster.address();
  EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  EXPECT_NE(address, "127.0.0.1:0");
  EXPECT_FALSE(cluster.metrics_address().empty());  // the coordinator's default
  const int64_t id = cluster.Submit(PendingSpec(), "req-1");
  ASSERT_GT(id, 0);

  cluster.coordinator().Signal(SIGKILL);
  ASSERT_NE(cluster.coordinator().Wait(10s), -1);
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator(address));
  EXPECT_EQ(cluster.address(), address);
  bool existing = false;
  EXPECT_EQ(cluster.Submit(PendingSpec(), "req-1", &existing), id);
  EXPECT_TRUE(existing);
  // A wait that times out returns the last job seen.
  const v1::Job job = cluster.WaitFor(
      id, [](const v1::Job& j) { return j.attempt() > 0; }, 100ms);
  EXPECT_EQ(job.id(), id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_TRUE(cluster.Workers().empty());
  EXPECT_TRUE(cluster.WaitIdleWorkers(0, 1s));
  EXPECT_EQ(cluster.WorkerRunning(id, 0), nullptr);

  std::string out;
  EXPECT_EQ(cluster.Cli({"status", std::to_string(id)}, &out), 0) << out;
  EXPECT_NE(out.find("waiting for 8 idle cpu workers"), std::string::npos) << out;
  EXPECT_NE(Slurp(cluster.coordinator_log()).find("serving on " + address), std::string::npos);
}

TEST_F(LocalClusterTest, ACoordinatorThatExitsFailsTheStartAtOnceWithItsLog) {
  LocalClusterOptions options = Options();
  options.coordinator_flags = {"--no-such-flag"};
  LocalCluster cluster(dir_.path(), options);
  const auto start = std::chrono::steady_clock::now();
  const std::string failures = Failures([&] { cluster.StartCoordinator(); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, LocalCluster::kStartTimeout);
  EXPECT_NE(failures.find("the coordinator did not start"), std::string::npos) << failures;
  EXPECT_NE(failures.find("--no-such-flag"), std::string::npos) << failures;
}

TEST_F(LocalClusterTest, ServesTlsWithTokensToTheStubAndTheCli) {
  std::ofstream(dir_ / "clients") << "carol s3cret-carol\n";
  std::ofstream(dir_ / "carol") << "s3cret-carol\n";
  LocalClusterOptions options = Options();
  options.tls = true;
  options.client_token = "s3cret-carol";
  options.coordinator_flags = {"--client-tokens-file", (dir_ / "clients").string()};
  LocalCluster cluster(dir_.path(), options);
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator());
  ASSERT_TRUE(fs::exists(cluster.ca_file()));
  const int64_t id = cluster.Submit(PendingSpec());
  EXPECT_GT(id, 0);
  EXPECT_EQ(cluster.Get(id).state(), v1::JOB_STATE_PENDING);

  std::string out;
  EXPECT_EQ(
      cluster.CliWith({"--tls-ca", cluster.ca_file(), "--token-file", (dir_ / "carol").string()},
                      {"list"}, &out),
      0)
      << out;
  EXPECT_NE(out.find("pending"), std::string::npos) << out;
  // The default CLI flags trust the certificate but carry no token: the coordinator says so.
  EXPECT_EQ(cluster.Cli({"list"}, &out), 1) << out;
  EXPECT_NE(out.find("no bearer token"), std::string::npos) << out;
}

TEST_F(LocalClusterTest, WaitForCheckpointSeesOnlyFinishedCheckpointFiles) {
  LocalCluster cluster(dir_.path(), Options());
  EXPECT_EQ(cluster.WaitForCheckpoint(50ms), fs::path());  // no directory yet
  const fs::path job = dir_ / "checkpoints" / "job-7-abc";
  fs::create_directories(job);
  std::ofstream(job / "ckpt-000000000050.jck.tmp.123") << "partial";
  EXPECT_EQ(cluster.WaitForCheckpoint(50ms), fs::path());
  std::ofstream(job / "ckpt-000000000050.jck") << "done";
  EXPECT_EQ(cluster.WaitForCheckpoint(1s), job / "ckpt-000000000050.jck");
}

}  // namespace
}  // namespace joule::testing
