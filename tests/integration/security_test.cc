// Integration: a coordinator with TLS and bearer tokens, real workers and the real CLI, and
// a table of hostile or broken inputs, each refused with a clear error and nothing stored
// damaged.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
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

std::string Slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("joule_sec_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string out;
    ASSERT_EQ(RunCommand({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                          "-keyout", (dir_ / "key.pem").string(), "-out",
                          (dir_ / "cert.pem").string(), "-days", "1", "-subj", "/CN=localhost",
                          "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"},
                         &out),
              0)
        << out;
    std::ofstream(dir_ / "clients") << "# name token\nalice s3cret-alice\nbob s3cret-bob\n";
    std::ofstream(dir_ / "alice") << "s3cret-alice\n";
    std::ofstream(dir_ / "wrong") << "not-a-token\n";
    std::ofstream(dir_ / "bob") << "s3cret-bob\n";
    std::ofstream(dir_ / "join") << "join-me\n";
    coordinator_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{kBin + "/joule-coordinator", "--listen", "127.0.0.1:0", "--db",
                                 (dir_ / "jobs.db").string(), "--address-file",
                                 (dir_ / "addr").string(), "--tls-cert",
                                 (dir_ / "cert.pem").string(), "--tls-key",
                                 (dir_ / "key.pem").string(), "--client-tokens-file",
                                 (dir_ / "clients").string(), "--join-token-file",
                                 (dir_ / "join").string(), "--max-active-jobs-per-client", "2",
                                 "--data-root", "/usr/share/datasets", "--data-root",
                                 (dir_ / "data").string()},
        (dir_ / "coordinator.log").string());
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (address_.empty() && std::chrono::steady_clock::now() < deadline) {
      std::ifstream(dir_ / "addr") >> address_;
      if (address_.empty()) std::this_thread::sleep_for(20ms);
    }
    ASSERT_FALSE(address_.empty()) << Slurp(dir_ / "coordinator.log");
  }

  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Runs the CLI over TLS with alice's token unless `extra` says otherwise.
  int Cli(std::vector<std::string> args, std::string* out, std::vector<std::string> global = {}) {
    std::vector<std::string> argv = {kBin + "/joule", "--coordinator", address_};
    if (global.empty()) {
      global = {"--tls-ca", (dir_ / "cert.pem").string(), "--token-file",
                (dir_ / "alice").string()};
    }
    argv.insert(argv.end(), global.begin(), global.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out);
  }

  void StartWorker(const std::string& token_file) {
    workers_.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{kBin + "/joule-worker", "--coordinator", address_, "--threads",
                                 "1", "--tls-ca", (dir_ / "cert.pem").string(),
                                 "--join-token-file", token_file, "--checkpoint-root",
                                 (dir_ / "ckpt").string()},
        (dir_ / ("worker-" + std::to_string(workers_.size()) + ".log")).string()));
  }

  int JobCount() {
    std::string out;
    EXPECT_EQ(Cli({"list"}, &out), 0) << out;
    return static_cast<int>(std::count(out.begin(), out.end(), '\n')) - 1;
  }

  fs::path dir_;
  std::string address_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

TEST_F(SecurityTest, AJobRunsOverTlsWithTokens) {
  StartWorker((dir_ / "join").string());
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  do {
    std::this_thread::sleep_for(100ms);
    Cli({"workers"}, &out);
  } while (out.find("idle") == std::string::npos && std::chrono::steady_clock::now() < deadline);
  ASSERT_NE(out.find("idle"), std::string::npos) << out;
  EXPECT_EQ(Cli({"submit", "--model", "logreg", "--global-batch-size", "64",
                 "--max-train-samples", "2000", "--max-test-samples", "500", "--watch"},
                &out),
            0)
      << out;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;
  for (const char* secret : {"s3cret-alice", "s3cret-bob", "join-me"}) {
    EXPECT_EQ(Slurp(dir_ / "coordinator.log").find(secret), std::string::npos) << "leaked";
    EXPECT_EQ(Slurp(dir_ / "worker-0.log").find(secret), std::string::npos) << "leaked";
  }
}

TEST_F(SecurityTest, AWorkerWithTheWrongJoinTokenNeverJoins) {
  std::ofstream(dir_ / "badjoin") << "guess\n";
  StartWorker((dir_ / "badjoin").string());
  std::this_thread::sleep_for(1500ms);  // it retries with backoff; none may get in
  std::string out;
  EXPECT_EQ(Cli({"workers"}, &out), 0) << out;
  EXPECT_EQ(out.find("local"), std::string::npos);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;  // the header only
  EXPECT_NE(Slurp(dir_ / "worker-0.log").find("UNAUTHENTICATED"), std::string::npos);
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
  const std::string ca = (dir_ / "cert.pem").string();
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
  const fs::path dir = fs::temp_directory_path() / ("joule_sec_start_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string out;
  // Under timeout(1): were the refusal to break, the server would serve forever.
  int rc = RunCommand({"/usr/bin/timeout", "10", kBin + "/joule-coordinator", "--listen",
                       "0.0.0.0:0", "--insecure", "--db", (dir / "jobs.db").string()},
                      &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("plain text is only allowed on loopback"), std::string::npos) << out;
  rc = RunCommand({"/usr/bin/timeout", "10", kBin + "/joule-coordinator", "--listen",
                   "127.0.0.1:0", "--db", (dir / "jobs.db").string()},
                  &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("no TLS certificate"), std::string::npos) << out;
  // TLS off loopback, but no tokens: refused too.
  rc = RunCommand({"/usr/bin/timeout", "10", kBin + "/joule-coordinator", "--listen",
                   "0.0.0.0:0", "--db", (dir / "jobs.db").string(), "--tls-cert",
                   "/nonexistent.pem", "--tls-key", "/nonexistent.pem"},
                  &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("reachable off this machine"), std::string::npos) << out;
  std::ofstream(dir / "empty-tokens") << "# nobody\n";
  rc = RunCommand({"/usr/bin/timeout", "10", kBin + "/joule-coordinator", "--listen",
                   "127.0.0.1:0", "--insecure", "--db", (dir / "jobs.db").string(),
                   "--client-tokens-file", (dir / "empty-tokens").string()},
                  &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("holds no"), std::string::npos) << out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace joule
