// Integration: a coordinator with TLS and bearer tokens, real workers and the real CLI, and
// a table of hostile or broken inputs, each refused with a clear error and nothing stored
// damaged.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "joule/v1/job.grpc.pb.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/scratch_dir.h"

namespace joule {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::LocalCluster;
using testing::PollUntil;
using testing::ProgramPath;
using testing::RunCommand;
using testing::ScratchDir;
using testing::Slurp;

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_ / "clients") << "# name token\nalice s3cret-alice\nbob s3cret-bob\n";
    std::ofstream(dir_ / "alice") << "s3cret-alice\n";
    std::ofstream(dir_ / "wrong") << "not-a-token\n";
    std::ofstream(dir_ / "bob") << "s3cret-bob\n";
    std::ofstream(dir_ / "join") << "join-me\n";
    ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator());
  }

  // Runs the CLI over TLS with alice's token unless `global` says otherwise.
  int Cli(std::vector<std::string> args, std::string* out, std::vector<std::string> global = {}) {
    if (global.empty()) {
      global = {"--tls-ca", cluster_.ca_file(), "--token-file", (dir_ / "alice").string()};
    }
    return cluster_.CliWith(global, args, out);
  }

  void StartWorker(const std::string& token_file) {
    cluster_.StartWorkers(1, {"--join-token-file", token_file});
  }

  int JobCount() {
    std::string out;
    EXPECT_EQ(Cli({"list"}, &out), 0) << out;
    return static_cast<int>(std::count(out.begin(), out.end(), '\n')) - 1;
  }

  static testing::LocalClusterOptions Options(const ScratchDir& dir) {
    testing::LocalClusterOptions o;
    o.tls = true;
    o.data_roots = {"/usr/share/datasets", (dir / "data").string()};
    o.coordinator_flags = {"--client-tokens-file",
                           (dir / "clients").string(),  //
                           "--join-token-file",
                           (dir / "join").string(),  //
                           "--max-active-jobs-per-client",
                           "2"};
    o.checkpoint_root = (dir / "ckpt").string();
    return o;
  }

  ScratchDir dir_{"sec"};
  LocalCluster cluster_{dir_.path(), Options(dir_)};
};

TEST_F(SecurityTest, AJobRunsOverTlsWithTokens) {
  StartWorker((dir_ / "join").string());
  std::string out;
  PollUntil(
      [&] {
        Cli({"workers"}, &out);
        return out.find("idle") != std::string::npos;
      },
      30s, 100ms);
  ASSERT_NE(out.find("idle"), std::string::npos) << out;
  EXPECT_EQ(Cli({"submit", "--model", "logreg", "--global-batch-size", "64",
                 "--max-train-samples", "2000", "--max-test-samples", "500", "--watch"},
                &out),
            0)
      << out;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;
  for (const char* secret : {"s3cret-alice", "s3cret-bob", "join-me"}) {
    EXPECT_EQ(Slurp(cluster_.coordinator_log()).find(secret), std::string::npos) << "leaked";
    EXPECT_EQ(Slurp(cluster_.worker_log(0)).find(secret), std::string::npos) << "leaked";
  }
}

TEST_F(SecurityTest, AWorkerWithTheWrongJoinTokenNeverJoins) {
  std::ofstream(dir_ / "badjoin") << "guess\n";
  StartWorker((dir_ / "badjoin").string());
  // It retries with backoff; none may get in. Wait for the first try and two retries to be
  // refused: 0.6 s of backoff (200 ms, doubling: AgentOptions::reconnect_backoff), within
  // three registration deadlines (5 s each) at worst.
  EXPECT_TRUE(PollUntil(
      [&] {
        const std::string log = Slurp(cluster_.worker_log(0));
        int refused = 0;
        for (size_t at = log.find("UNAUTHENTICATED"); at != std::string::npos;
             at = log.find("UNAUTHENTICATED", at + 1)) {
          ++refused;
        }
        return refused >= 3;
      },
      20s))
      << Slurp(cluster_.worker_log(0));
  std::string out;
  EXPECT_EQ(Cli({"workers"}, &out), 0) << out;
  EXPECT_EQ(out.find("local"), std::string::npos);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;  // the header only
  EXPECT_NE(Slurp(cluster_.worker_log(0)).find("UNAUTHENTICATED"), std::string::npos);
}

struct Hostile {
  const char* name;
  std::vector<std::string> args;    // CLI subcommand and flags
  std::vector<std::string> global;  // empty: TLS with alice's token
  int exit_code;
  const char* message;
};

TEST_F(SecurityTest, HostileInputsAreRefusedAndNothingStoredIsDamaged) {
  std::string out;
  ASSERT_EQ(Cli({"submit", "--model", "mlp", "--workers", "8", "--global-batch-size", "64",
                 "--request-id", "keep-me"},
                &out),
            0)
      << out;
  const std::string kept = out;
  fs::create_directories(dir_ / "data");
  fs::create_symlink("/etc", dir_ / "data" / "escape");
  std::ofstream(dir_ / "garbage.yaml") << "model: [unclosed\n";
  std::ofstream(dir_ / "huge.yaml") << "model: mlp\nname: " << std::string(5 << 20, 'x') << "\n";
  const std::string ca = cluster_.ca_file();
  const Hostile cases[] = {
      {"malformed spec file", {"submit", "-f", (dir_ / "garbage.yaml").string()}, {}, 2,
       "not valid YAML"},
      // The CLI refuses a job file over 1 MiB before sending it (issue 9).
      {"oversized spec", {"submit", "-f", (dir_ / "huge.yaml").string(), "--global-batch-size",
                          "64"}, {}, 2, "a job file may hold at most 1048576 bytes"},
      {"bad spec values", {"submit", "--model", "mlp", "--workers", "3", "--global-batch-size",
                           "64"}, {}, 2, "not divisible by workers 3"},
      {"path traversal", {"submit", "--model", "mlp", "--global-batch-size", "64", "--dataset",
                          "idx:/usr/share/datasets/../../etc"}, {}, 2,
       "outside the allowed data roots"},
      {"absolute path outside", {"submit", "--model", "mlp", "--global-batch-size", "64",
                                 "--dataset", "idx:/root"}, {}, 2,
       "outside the allowed data roots"},
      {"symlink out of a root", {"submit", "--model", "mlp", "--global-batch-size", "64",
                                 "--dataset", "idx:" + (dir_ / "data" / "escape").string()},
       {}, 2, "outside the allowed data roots"},
      {"torchscript model outside", {"submit", "--model", "torchscript:/etc/passwd",
                                     "--global-batch-size", "64"}, {}, 2,
       "outside the allowed data roots"},
      {"csv data outside", {"submit", "--model", "mlp", "--global-batch-size", "64",
                            "--dataset", "csv:/etc/passwd"}, {}, 2,
       "outside the allowed data roots"},
      {"missing token", {"list"}, {"--tls-ca", ca}, 1, "no bearer token"},
      {"wrong token", {"submit", "--model", "mlp", "--global-batch-size", "64"},
       {"--tls-ca", ca, "--token-file", (dir_ / "wrong").string()}, 1, "not accepted"},
      {"plain text against TLS", {"list"}, {"--insecure", "--token-file",
                                            (dir_ / "alice").string()}, 3,
       "cannot reach the coordinator"},
      {"unknown CA", {"list"}, {"--token-file", (dir_ / "alice").string()}, 3,
       "cannot reach the coordinator"},
      {"too many active jobs", {"submit", "--model", "mlp", "--workers", "8",
                                "--global-batch-size", "64"}, {}, 0, ""},
      {"over the client's limit", {"submit", "--model", "mlp", "--workers", "8",
                                   "--global-batch-size", "64"}, {}, 1,
       "already has 2 jobs pending or running (limit 2)"},
      {"cancelling another client's job", {"cancel", "1"},
       {"--tls-ca", ca, "--token-file", (dir_ / "bob").string()}, 1,
       "job 1 belongs to client alice, not bob"},
  };
  for (const Hostile& c : cases) {
    int rc = Cli(c.args, &out, c.global);
    EXPECT_EQ(rc, c.exit_code) << c.name << ": " << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.name << ": " << out;
  }
  // What was acknowledged before is intact: the same job under the same request id, and
  // only the one accepted since.
  EXPECT_EQ(JobCount(), 2);
  EXPECT_EQ(Cli({"submit", "--model", "mlp", "--workers", "8", "--global-batch-size", "64",
                 "--request-id", "keep-me"},
                &out),
            0);
  EXPECT_EQ(out, kept);
}

TEST(SecurityStartupTest, PlainTextOffLoopbackIsRefused) {
  const ScratchDir dir("sec_start");
  std::string out;
  // Under timeout(1): were the refusal to break, the server would serve forever.
  int rc = RunCommand({"/usr/bin/timeout", "10", ProgramPath("joule-coordinator"), "--listen",
                       "0.0.0.0:0", "--insecure", "--db", (dir / "jobs.db").string()},
                      &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("plain text is only allowed on loopback"), std::string::npos) << out;
  rc = RunCommand({"/usr/bin/timeout", "10", ProgramPath("joule-coordinator"), "--listen",
                   "127.0.0.1:0", "--db", (dir / "jobs.db").string()},
                  &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("no TLS certificate"), std::string::npos) << out;
  // TLS off loopback, but no tokens: refused too.
  rc = RunCommand({"/usr/bin/timeout", "10", ProgramPath("joule-coordinator"), "--listen",
                   "0.0.0.0:0", "--db", (dir / "jobs.db").string(), "--tls-cert",
                   "/nonexistent.pem", "--tls-key", "/nonexistent.pem"},
                  &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("reachable off this machine"), std::string::npos) << out;
  std::ofstream(dir / "empty-tokens") << "# nobody\n";
  rc = RunCommand({"/usr/bin/timeout", "10", ProgramPath("joule-coordinator"), "--listen",
                   "127.0.0.1:0", "--insecure", "--db", (dir / "jobs.db").string(),
                   "--client-tokens-file", (dir / "empty-tokens").string()},
                  &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("holds no"), std::string::npos) << out;
}

}  // namespace
}  // namespace joule
