// The CLI's one fork/exec, with real programs.
#include "client/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/testing/scratch_dir.h"

namespace joule::client {
namespace {

TEST(SubprocessTest, RunProgramGivesTheOutputAndTheExitStatus) {
  std::string out;
  absl::StatusOr<int> rc = RunProgram({"/bin/sh", "-c", "echo to-out; echo to-err >&2; exit 3"}, &out);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 3);
  EXPECT_NE(out.find("to-out"), std::string::npos) << out;
  EXPECT_NE(out.find("to-err"), std::string::npos) << out;
  out.clear();
  rc = RunProgram({"/bin/sh", "-c", "kill -TERM $$"}, &out);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 128 + SIGTERM);
  // Looked up in PATH, as a shell would.
  rc = RunProgram({"true"}, &out);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0);
}

// A program that cannot start is an error naming it and why, not an exit status.
TEST(SubprocessTest, AProgramThatCannotStartIsAnErrorNotAStatus) {
  joule::testing::ScratchDir dir("subprocess");
  const std::string not_executable = (dir.path() / "plain.txt").string();
  std::ofstream(not_executable) << "not a program\n";
  struct Case {
    std::vector<std::string> argv;
    absl::StatusCode code;
  };
  for (const Case& c : {Case{{"/nonexistent/joule-worker"}, absl::StatusCode::kNotFound},
                        Case{{"no-such-program-anywhere-in-path"}, absl::StatusCode::kNotFound},
                        Case{{not_executable}, absl::StatusCode::kPermissionDenied},
                        Case{{}, absl::StatusCode::kInvalidArgument}}) {
    std::string out;
    absl::StatusOr<int> rc = RunProgram(c.argv, &out);
    EXPECT_EQ(rc.status().code(), c.code) << rc.status();
    absl::StatusOr<pid_t> pid = Spawn(c.argv, (dir.path() / "log").string());
    EXPECT_EQ(pid.status().code(), c.code) << pid.status();
    if (!c.argv.empty()) {
      EXPECT_NE(rc.status().message().find(c.argv[0]), std::string::npos) << rc.status();
    }
  }
}

TEST(SubprocessTest, SpawnDetachesIntoItsOwnSessionAndAppendsToItsLog) {
  joule::testing::ScratchDir dir("subprocess");
  const std::string log = (dir.path() / "program.log").string();
  std::ofstream(log) << "an earlier run\n";
  absl::StatusOr<pid_t> pid =
      Spawn({"/bin/sh", "-c", "echo out; echo err >&2; read line; echo \"stdin: $line.\""}, log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(getsid(*pid), *pid);  // a session leader: the terminal's signals are not its
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status));
  const std::string text = joule::testing::Slurp(log);
  EXPECT_EQ(text.find("an earlier run\n"), 0u) << text;
  EXPECT_NE(text.find("out\n"), std::string::npos) << text;
  EXPECT_NE(text.find("err\n"), std::string::npos) << text;
  EXPECT_NE(text.find("stdin: ."), std::string::npos) << text;  // /dev/null: nothing read
  EXPECT_EQ(Spawn({"/bin/true"}, (dir.path() / "no-such-dir" / "log").string()).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace joule::client
