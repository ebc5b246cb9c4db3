// Integration: the real `joule` binary (and, for `cluster up`, the real
// joule-coordinator) against what a user's machine can hand it: hostile job
// files, state files whose PIDs now belong to other processes, a port someone
// else holds. Needs no worker.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/scratch_dir.h"

namespace joule {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::PollUntil;
using testing::ProgramPath;
using testing::RunCommand;
using testing::ScratchDir;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

int Lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(dir_ / "state"); }

  // `joule` with this test's state directory and a coordinator nobody listens
  // on: nothing here may need one.
  int Joule(std::vector<std::string> args, std::string* out) {
    args.insert(args.begin(), {ProgramPath("joule"), "--state-dir", (dir_ / "state").string(),
                               "--coordinator", "127.0.0.1:1", "--insecure"});
    return RunCommand(args, out);
  }

  // A `sleep` of this test's, once it runs /bin/sleep (not this program, as
  // between fork and exec), with its start time from /proc.
  std::unique_ptr<ChildProcess> StartSleep(uint64_t* start_ticks, std::string* exe) {
    auto p =
        std::make_unique<ChildProcess>(std::vector<std::string>{"/bin/sleep", "600"}, "/dev/null");
    const std::string proc = "/proc/" + std::to_string(p->pid());
    std::error_code ec;
    PollUntil([&] { return fs::read_symlink(proc + "/exe", ec).filename() == "sleep"; }, 10s, 5ms);
    *exe = fs::read_symlink(proc + "/exe", ec).string();
    std::ifstream f(proc + "/stat");
    std::string stat;
    std::getline(f, stat);
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 22; ++i) rest >> field;
    *start_ticks = std::stoull(field);
    return p;
  }

  void WritePids(const std::string& text) {
    std::ofstream(dir_ / "state" / "pids", std::ios::trunc) << text;
  }

  ScratchDir dir_{"cli"};
};

constexpr char kV2[] = "# joule cluster pids v2: PID START_TICKS EXE\n";

// A state file naming a live process that is not the one `cluster up` started
// (another start time: the PID was reused; another program) is not signalled;
// one that is, is.
TEST_F(CliTest, ClusterDownSignalsOnlyTheProcessesItStarted) {
  uint64_t start;
  std::string exe;
  auto sleeper = StartSleep(&start, &exe);
  ASSERT_EQ(fs::path(exe).filename(), "sleep");
  const std::string pid = std::to_string(sleeper->pid());
  struct Case {
    const char* what;
    std::string pids;
  };
  const std::vector<Case> not_ours = {
      {"reused PID", std::string(kV2) + pid + " " + std::to_string(start + 1) + " " + exe + "\n"},
      {"another program",
       std::string(kV2) + pid + " " + std::to_string(start) + " /usr/bin/joule-coordinator\n"},
  };
  for (const Case& c : not_ours) {
    SCOPED_TRACE(c.what);
    WritePids(c.pids);
    std::string out;
    EXPECT_EQ(Joule({"cluster", "down"}, &out), 0) << out;
    EXPECT_NE(out.find("pid " + pid), std::string::npos) << out;
    EXPECT_NE(out.find("is no longer a process this cluster started"), std::string::npos) << out;
    EXPECT_NE(out.find("left it alone"), std::string::npos) << out;
    // A SIGTERM sent would have ended it at once; give it a second to show.
    EXPECT_EQ(sleeper->Wait(1s), -1) << "signalled a process that is not ours";
    EXPECT_FALSE(fs::exists(dir_ / "state" / "pids"));
  }

  // The control: the true identity is signalled, so the test above could fail.
  WritePids(std::string(kV2) + pid + " " + std::to_string(start) + " " + exe + "\n");
  std::string out;
  EXPECT_EQ(Joule({"cluster", "down"}, &out), 0) << out;
  EXPECT_NE(out.find("1 of 1 processes"), std::string::npos) << out;
  const int status = sleeper->Wait(10s);
  ASSERT_NE(status, -1) << "the cluster's own process was not stopped";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
}

// An older joule's file of bare PIDs says nothing about whose they are now:
// none is signalled, and the note says so. `cluster up` refuses only when such
// a PID runs a joule program.
TEST_F(CliTest, ALegacyStateFileIsNotTrusted) {
  uint64_t start;
  std::string exe;
  auto sleeper = StartSleep(&start, &exe);
  const std::string pid = std::to_string(sleeper->pid());
  WritePids(pid + "\n");
  std::string out;
  EXPECT_EQ(Joule({"cluster", "down"}, &out), 0) << out;
  EXPECT_NE(out.find("written by an older joule"), std::string::npos) << out;
  EXPECT_NE(out.find("signalled none of " + pid), std::string::npos) << out;
  EXPECT_EQ(sleeper->Wait(1s), -1) << "signalled a PID from a legacy state file";
  EXPECT_FALSE(fs::exists(dir_ / "state" / "pids"));

  WritePids("not a pid\n");
  EXPECT_EQ(Joule({"cluster", "down"}, &out), 1) << out;
  EXPECT_NE(out.find("line 1"), std::string::npos) << out;
  EXPECT_NE(out.find("signalled nothing"), std::string::npos) << out;
  EXPECT_EQ(Lines(out), 1) << out;
}

// Someone holds the port: `cluster up` says what the coordinator said, with the
// address, and leaves no state behind.
// Unreachable: the error says where the address came from. With no --coordinator, the
// local cluster's state directory (found empty, or holding a cluster that is not up), so
// a user with another --state-dir knows what to pass.
TEST_F(CliTest, AnUnreachableCoordinatorErrorNamesWhereItsAddressCameFrom) {
  const std::string state = (dir_ / "state").string();
  const auto list = [&](std::string* out) {
    return RunCommand({ProgramPath("joule"), "--state-dir", state, "--insecure", "list"}, out);
  };
  std::string out;
  EXPECT_NE(list(&out), 0);
  EXPECT_NE(out.find("no local cluster in " + state + ": --state-dir or JOULE_STATE_DIR"),
            std::string::npos)
      << out;
  std::ofstream(dir_ / "state" / "coordinator.addr") << "127.0.0.1:1\n";
  EXPECT_NE(list(&out), 0);
  EXPECT_NE(out.find("cannot reach the coordinator at 127.0.0.1:1 (the local cluster's, from " +
                     state + "/coordinator.addr"),
            std::string::npos)
      << out;
  EXPECT_EQ(Lines(out), 1) << out;
  // Named by flag: nothing about a state directory.
  EXPECT_NE(Joule({"list"}, &out), 0);
  EXPECT_EQ(out.find("state"), std::string::npos) << out;
}

TEST_F(CliTest, ClusterUpShowsWhyTheCoordinatorDidNotStart) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));

  std::string out;
  EXPECT_EQ(Joule({"cluster", "up", "--workers", "1", "--port", port}, &out), 1) << out;
  close(fd);
  EXPECT_NE(out.find("the coordinator did not start"), std::string::npos) << out;
  EXPECT_NE(Lower(out).find("address already in use"), std::string::npos) << out;
  EXPECT_NE(out.find("127.0.0.1:" + port), std::string::npos) << out;
  EXPECT_EQ(Lines(out), 1) << out;
  EXPECT_FALSE(fs::exists(dir_ / "state" / "pids"));
}

// Fixed metrics ports survive a restart of the local cluster (a Prometheus configuration
// stays valid), and --web-ui prints where the UI is.
TEST_F(CliTest, ClusterUpServesMetricsOnTheFixedPortsAsked) {
  auto free_port = [] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return std::to_string(ntohs(addr.sin_port));
  };
  const std::string metrics = free_port(), worker = free_port();
  std::string out;
  ASSERT_EQ(Joule({"cluster", "up", "--workers", "1", "--metrics-port", metrics,
                   "--worker-metrics-port", worker, "--web-ui"},
                  &out),
            0)
      << out;
  EXPECT_NE(out.find("http://127.0.0.1:" + metrics + "/metrics"), std::string::npos) << out;
  EXPECT_NE(out.find("web UI:              http://127.0.0.1:" + metrics + "/ui/"),
            std::string::npos)
      << out;
  const std::string body = testing::HttpGet("http://127.0.0.1:" + worker + "/metrics");
  EXPECT_NE(body.find("joule_"), std::string::npos) << "worker 0 serves no metrics on " << worker;
  EXPECT_NE(testing::HttpGet("http://127.0.0.1:" + metrics + "/ui/").find("<h1>Jobs</h1>"),
            std::string::npos);
  EXPECT_EQ(Joule({"cluster", "down"}, &out), 0) << out;
}

// Job files a user can point -f at by mistake or malice: one line each, exit 2,
// at once.
TEST_F(CliTest, SubmitRefusesHostileJobFilesInOneLine) {
  ASSERT_EQ(mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  std::string laughs =
      "a: &a "
      "[\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    laughs += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 9; ++i) laughs += std::string(i ? "," : "") + "*" + char(c - 1);
    laughs += "]\n";
  }
  std::ofstream(dir_ / "laughs.yaml") << laughs;
  std::ofstream(dir_ / "list.yaml") << "- model: mlp\n";
  std::ofstream(dir_ / "name.yaml") << "model: mlp\nname: \"x\xff\"\n";
  fs::create_directories(dir_ / "dir.yaml");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/dev/zero", "is a character device"},
      {(dir_ / "fifo").string(), "is a FIFO"},
      {(dir_ / "dir.yaml").string(), "is a directory"},
      {(dir_ / "absent.yaml").string(), "no such file"},
      {(dir_ / "laughs.yaml").string(), "once YAML aliases are expanded"},
      {(dir_ / "list.yaml").string(), "is a list; want a mapping"},
      {(dir_ / "name.yaml").string(), "line 2, field name: not valid UTF-8 (byte 1 is 0xFF)"},
  };
  for (const auto& [path, want] : cases) {
    SCOPED_TRACE(path);
    std::string out;
    EXPECT_EQ(Joule({"submit", "-f", path}, &out), 2) << out;
    EXPECT_EQ(out.rfind("error: " + path + ": ", 0), 0u) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_EQ(Lines(out), 1) << out;
  }
}

TEST_F(CliTest, SubmitNamesTheFlagWithInvalidUtf8) {
  const std::vector<std::vector<std::string>> cases = {{"--name", "ab\xff"},
                                                       {"--model", "\xc0\xaf"},
                                                       {"--dataset", "csv:\xed\xa0\x80"},
                                                       {"--label", "team=\xe2\x82"},
                                                       {"--request-id", "r\xfe"}};
  for (const auto& flag : cases) {
    SCOPED_TRACE(flag[0]);
    std::string out;
    EXPECT_EQ(Joule({"submit", flag[0], flag[1]}, &out), 2) << out;
    EXPECT_EQ(out.rfind("error: " + flag[0] + ": not valid UTF-8 (byte ", 0), 0u) << out;
    EXPECT_EQ(Lines(out), 1) << out;
  }
}

TEST_F(CliTest, EveryProgramHasVersionAndBadFlagsExitTwo) {
  for (const char* program : {"joule", "joule-coordinator", "joule-worker"}) {
    SCOPED_TRACE(program);
    std::string out;
    EXPECT_EQ(RunCommand({ProgramPath(program), "--version"}, &out), 0) << out;
    EXPECT_EQ(out.rfind(std::string(program) + " 0.", 0), 0u) << out;
    EXPECT_NE(out.find("(api joule.v1)"), std::string::npos) << out;
    EXPECT_EQ(RunCommand({ProgramPath(program), "--no-such-flag"}, &out), 2) << out;
  }
  std::string out;
  EXPECT_EQ(RunCommand({ProgramPath("joule-worker"), "--threads", "many"}, &out), 2) << out;
}

// The worker settles its BLAS kernel before it computes (worker/blas/blas_startup.h):
// a named core is switched to by re-executing, and checked; a name OpenBLAS does not
// accept is undone and OpenBLAS's own choice kept; a name the worker does not know, or one
// the CPU cannot run, is refused before any re-exec; the user's OPENBLAS_CORETYPE wins.
TEST_F(CliTest, TheWorkerSettlesItsBlasKernelAndSaysHow) {
  // The worker as a user runs it without OPENBLAS_CORETYPE (the test's own environment
  // may set it: a user's choice, which the worker keeps, tested below).
  const std::vector<std::string> worker_argv = {"/usr/bin/env", "-u", "OPENBLAS_CORETYPE",
                                                ProgramPath("joule-worker")};
  const auto worker_with = [&](std::vector<std::string> args) {
    args.insert(args.begin(), worker_argv.begin(), worker_argv.end());
    return args;
  };
  const std::string worker = ProgramPath("joule-worker");
  std::string out;
  ASSERT_EQ(RunCommand(worker_with({"--blas-info"}), &out), 0) << out;
  EXPECT_NE(out.find("choice    "), std::string::npos) << out;
  EXPECT_NE(out.find("within the float error bound"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(worker_with({"--blas-kernel", "no such!", "--blas-info"}), &out), 2) << out;
  // OpenBLAS's own choice, before any switch of ours.
  ASSERT_EQ(RunCommand(worker_with({"--blas-kernel", "keep", "--blas-info"}), &out), 0) << out;
  if (out.find("library   OpenBLAS") == std::string::npos) {
    GTEST_SKIP() << "the BLAS is not OpenBLAS: nothing to choose\n" << out;
  }
  const auto field = [](const std::string& text, const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    if (at == std::string::npos) return std::string();
    const size_t from = text.find_first_not_of(' ', at + 1 + name.size());
    return text.substr(from, text.find('\n', from) - from);
  };
  const std::string own = field("\n" + out, "core");
  const std::string own_core = own.substr(0, own.find(' '));
  ASSERT_FALSE(own_core.empty()) << out;

  ASSERT_EQ(RunCommand({"/usr/bin/env", "OPENBLAS_CORETYPE=Prescott", worker, "--blas-info"}, &out),
            0)
      << out;
  EXPECT_EQ(field("\n" + out, "core").rfind("Prescott", 0), 0u) << out;
  EXPECT_NE(field("\n" + out, "choice").find("OPENBLAS_CORETYPE=Prescott set by the user"),
            std::string::npos)
      << out;

  ASSERT_EQ(RunCommand(worker_with({"--blas-kernel", "NOSUCHCORE", "--blas-info"}), &out), 0)
      << out;
  EXPECT_EQ(field("\n" + out, "core").rfind(own_core, 0), 0u) << out;
  EXPECT_NE(field("\n" + out, "choice").find("is not an x86 OpenBLAS core this worker knows"),
            std::string::npos)
      << out;

  // An SSE core other than OpenBLAS's own runs on any x86-64: switched to, re-executed,
  // checked, and (on a CPU with wider vectors) marked a fallback.
  const std::string other = own_core == "Prescott" ? "NEHALEM" : "PRESCOTT";
  ASSERT_EQ(RunCommand(worker_with({"--blas-kernel", other, "--blas-info"}), &out), 0) << out;
  EXPECT_TRUE(absl::EqualsIgnoreCase(field("\n" + out, "core").substr(0, other.size()), other))
      << out;
  EXPECT_NE(field("\n" + out, "choice").find("checked: sgemm within the float error bound"),
            std::string::npos)
      << out;
}

TEST_F(CliTest, MistypedSubcommandsAndFlagsGetADidYouMean) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"sumbit"}, "did you mean 'submit' instead of 'sumbit'?"},
      {{"sweep", "stauts", "x"}, "did you mean 'status' instead of 'stauts'?"},
      {{"submit", "--modle", "mlp"}, "did you mean '--model' instead of '--modle'?"},
      {{"list", "--stat=running"}, "did you mean '--state' instead of '--stat'?"},
  };
  for (const auto& [args, want] : cases) {
    SCOPED_TRACE(args[0]);
    std::string out;
    EXPECT_EQ(Joule(args, &out), 2) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
  }
  // Nothing close: no suggestion.
  std::string out;
  EXPECT_EQ(Joule({"zzzzzzzz"}, &out), 2) << out;
  EXPECT_EQ(out.find("did you mean"), std::string::npos) << out;
  // A model, checked before anything is sent (estimate validates the spec itself).
  EXPECT_EQ(Joule({"estimate", "--model", "mpl", "--global-batch-size", "64"}, &out), 2) << out;
  EXPECT_NE(out.find("model \"mpl\" is unknown (did you mean \"mlp\"?)"), std::string::npos)
      << out;
}

TEST_F(CliTest, EveryUnknownKeyOfAJobFileIsNamedAtOnceAndStdinWorks) {
  std::ofstream(dir_ / "typos.yaml") << "epoch: 2\n"
                                        "model: mlp\n"
                                        "optimizer: {lrr: 0.1, momentum: 0.9}\n"
                                        "labels: {anything: goes}\n"
                                        "sync: {strategy: allreduce, perod: 4}\n";
  std::string out;
  EXPECT_EQ(Joule({"submit", "-f", (dir_ / "typos.yaml").string()}, &out), 2) << out;
  EXPECT_NE(out.find("unknown fields epoch (line 1; did you mean epochs?), optimizer.lrr "
                     "(line 3; did you mean optimizer.lr?), sync.perod (line 5; did you mean "
                     "sync.period?)"),
            std::string::npos)
      << out;
  EXPECT_EQ(Lines(out), 1) << out;
  // `-f -`: standard input, with its own name in errors.
  const std::string cmd = "printf 'modle: mlp\\n' | " + ProgramPath("joule") +
                          " --coordinator 127.0.0.1:1 --insecure submit -f -";
  EXPECT_EQ(RunCommand({"/bin/sh", "-c", cmd + " 2>&1"}, &out), 2) << out;
  EXPECT_NE(out.find("error: standard input: unknown field modle (line 1; did you mean model?)"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace joule
