// The state `joule cluster up` records and what `joule cluster down` trusts:
// real processes through /proc, and a fake /proc tree for what a test cannot
// make a real process do.
#include "client/cluster_state.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/testing/process.h"

namespace joule::client {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Field 22 of /proc/PID/stat, read independently of the code under test.
uint64_t StartTicks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) rest >> field;
  return std::stoull(field);
}

TEST(ClusterStateTest, IdentifiesARunningProcess) {
  testing::ChildProcess sleeper({"/bin/sleep", "600"}, "/dev/null");
  // Until exec is done the child still runs this test's program: wait for the
  // evidence.
  absl::StatusOr<ProcessIdentity> id;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  do {
    id = IdentifyProcess(sleeper.pid());
    if (id.ok() && fs::path(id->exe).filename() != "sleep") std::this_thread::sleep_for(5ms);
  } while (id.ok() && fs::path(id->exe).filename() != "sleep" &&
           std::chrono::steady_clock::now() < deadline);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->pid, sleeper.pid());
  EXPECT_EQ(id->start_ticks, StartTicks(sleeper.pid()));
  EXPECT_EQ(id->exe, fs::read_symlink("/proc/" + std::to_string(sleeper.pid()) + "/exe"));
  EXPECT_EQ(CheckProcess(*id), Ownership::kOurs);

  // The same PID with another start time or program is another process: not
  // ours.
  ProcessIdentity reused = *id;
  ++reused.start_ticks;
  std::string why;
  EXPECT_EQ(CheckProcess(reused, &why), Ownership::kNotOurs);
  EXPECT_NE(why.find("started at another time"), std::string::npos) << why;
  ProcessIdentity other_program = *id;
  other_program.exe = "/usr/local/bin/joule-coordinator";
  EXPECT_EQ(CheckProcess(other_program, &why), Ownership::kNotOurs);
  EXPECT_NE(why.find("it now runs " + id->exe), std::string::npos) << why;

  // Exited and reaped: gone. (A zombie is gone too: see the fake /proc below.)
  sleeper.Signal(SIGKILL);
  ASSERT_NE(sleeper.Wait(10s), -1);
  EXPECT_EQ(CheckProcess(*id), Ownership::kGone);
  EXPECT_EQ(IdentifyProcess(sleeper.pid()).status().code(), absl::StatusCode::kNotFound);
}

class FakeProcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("joule_proc_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // /proc/PID with a stat line of `comm`, `state` and start time `start`, and
  // exe -> `exe`.
  void AddProcess(pid_t pid, const std::string& comm, char state, uint64_t start,
                  const std::string& exe) {
    const fs::path dir = root_ / std::to_string(pid);
    fs::create_directories(dir);
    std::ofstream(dir / "stat") << pid << " (" << comm << ") " << state
                                << " 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 " << start
                                << " 1000 100 18446744073709551615\n";
    if (!exe.empty()) fs::create_symlink(exe, dir / "exe");
  }

  fs::path root_;
};

TEST_F(FakeProcTest, ParsesStatWhateverTheCommandName) {
  AddProcess(42, "a) (b c) 9 9", 'S', 777, "/opt/joule/bin/joule-worker");
  auto id = IdentifyProcess(42, root_.string());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->start_ticks, 777u);
  EXPECT_EQ(id->exe, "/opt/joule/bin/joule-worker");
}

TEST_F(FakeProcTest, AReplacedProgramFileIsStillTheSameProcess) {
  AddProcess(42, "joule-worker", 'S', 777, "/opt/joule/bin/joule-worker (deleted)");
  const ProcessIdentity recorded{42, 777, "/opt/joule/bin/joule-worker"};
  EXPECT_EQ(CheckProcess(recorded, nullptr, root_.string()), Ownership::kOurs);
}

TEST_F(FakeProcTest, ZombiesAndMissingProcessesAreGoneAndGarbageIsNotOurs) {
  AddProcess(42, "joule-worker", 'Z', 777, "");
  EXPECT_EQ(CheckProcess({42, 777, "/x/joule-worker"}, nullptr, root_.string()), Ownership::kGone);
  EXPECT_EQ(CheckProcess({43, 777, "/x/joule-worker"}, nullptr, root_.string()), Ownership::kGone);
  fs::create_directories(root_ / "44");
  std::ofstream(root_ / "44" / "stat") << "44 (truncated";
  EXPECT_EQ(CheckProcess({44, 777, "/x/joule-worker"}, nullptr, root_.string()),
            Ownership::kNotOurs);
}

TEST(PidsFileTest, RoundTripsThroughTheFileFormat) {
  const std::vector<ProcessIdentity> processes = {
      {4242, 1234567, "/usr/local/bin/joule-coordinator"},
      {4250, 1234570, "/home/a user/joule build/joule-worker"}};
  const std::string text = FormatPidsFile(processes);
  EXPECT_EQ(text.rfind("# joule cluster pids v2", 0), 0u) << text;
  auto file = ParsePidsFile(text, "pids");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->processes, processes);
  EXPECT_TRUE(file->legacy_pids.empty());
  auto empty = ParsePidsFile(FormatPidsFile({}), "pids");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->processes.empty());
}

TEST(PidsFileTest, AnOlderJoulesBarePidsAreLegacy) {
  auto file = ParsePidsFile("4242\n4250\n", "pids");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->processes.empty());
  EXPECT_EQ(file->legacy_pids, (std::vector<pid_t>{4242, 4250}));
}

TEST(PidsFileTest, AnythingElseIsAnErrorNamingTheLine) {
  const std::string v2 = "# joule cluster pids v2: PID START_TICKS EXE\n";
  for (const std::string& text :
       {std::string("4242\nnot a pid\n"), std::string("-1\n"), v2 + "4242 99\n",
        v2 + "4242 x /bin/joule-worker\n", v2 + "0 99 /bin/joule-worker\n",
        v2 + "4242 99 /bin/joule-worker\n4250\n"}) {
    SCOPED_TRACE(text);
    auto file = ParsePidsFile(text, "/state/pids");
    ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(file.status().message().find("/state/pids line "), std::string::npos)
        << file.status();
  }
}

}  // namespace
}  // namespace joule::client
