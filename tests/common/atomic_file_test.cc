// WriteFileAtomically: whole or not at all, never through a symlink, no temporary file left
// behind on any failure (issue 23: export followed a symlink at -o PATH; -o DIR left DIR.tmp).
#include "common/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace joule {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("joule-atomic-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  // Every entry of the scratch directory: nothing but what the test expects is left.
  std::vector<std::string> Entries() {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST_F(AtomicFileTest, WritesANewFileAndReplacesAnOldOne) {
  const fs::path p = dir_ / "report.html";
  ASSERT_TRUE(WriteFileAtomically(p, "first").ok());
  EXPECT_EQ(Read(p), "first");
  ASSERT_TRUE(WriteFileAtomically(p, std::string(1 << 20, 'x')).ok());
  EXPECT_EQ(Read(p).size(), 1u << 20);
  EXPECT_EQ(Entries(), std::vector<std::string>{"report.html"});
  struct stat st;
  ASSERT_EQ(stat(p.c_str(), &st), 0);
  const mode_t mask = umask(0);
  umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0644 & ~mask);
}

TEST_F(AtomicFileTest, ASymlinkAtTheTargetIsReplacedNotFollowed) {
  const fs::path victim = dir_ / "victim";
  { std::ofstream(victim) << "precious"; }
  const fs::path link = dir_ / "model.pt";
  fs::create_symlink(victim, link);
  ASSERT_TRUE(WriteFileAtomically(link, "model").ok());
  EXPECT_EQ(Read(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(link));
  EXPECT_EQ(Read(link), "model");
  // A dangling symlink, and one to a directory: replaced alike.
  const fs::path dangling = dir_ / "dangling";
  fs::create_symlink(dir_ / "nowhere", dangling);
  ASSERT_TRUE(WriteFileAtomically(dangling, "x").ok());
  EXPECT_FALSE(fs::exists(dir_ / "nowhere"));
  const fs::path to_dir = dir_ / "to-dir";
  fs::create_directory(dir_ / "sub");
  fs::create_directory_symlink(dir_ / "sub", to_dir);
  ASSERT_TRUE(WriteFileAtomically(to_dir, "y").ok());
  EXPECT_TRUE(fs::is_empty(dir_ / "sub"));
  EXPECT_EQ(Read(to_dir), "y");
}

TEST_F(AtomicFileTest, BadTargetsAreOneLineErrorsAndLeaveNothing) {
  fs::create_directory(dir_ / "out");
  struct Case {
    fs::path path;
    absl::StatusCode code;
    const char* want;
  };
  const Case cases[] = {
      {"", absl::StatusCode::kInvalidArgument, "empty name"},
      {"-", absl::StatusCode::kInvalidArgument, "standard output"},
      {dir_ / "out", absl::StatusCode::kInvalidArgument, "is a directory"},
      {dir_ / "missing" / "x.npz", absl::StatusCode::kUnavailable, "No such file"},
      {dir_ / "victim-file" / "x", absl::StatusCode::kUnavailable, "cannot write"},
  };
  { std::ofstream(dir_ / "victim-file") << "v"; }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path.string());
    absl::Status s = WriteFileAtomically(c.path, "data");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s;
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
  }
  EXPECT_EQ(Entries(), (std::vector<std::string>{"out", "victim-file"}));
  EXPECT_TRUE(fs::is_empty(dir_ / "out"));
}

TEST_F(AtomicFileTest, AWriterThatFailsLeavesTheOldFileAndNoTemporary) {
  const fs::path p = dir_ / "model.npz";
  { std::ofstream(p) << "old"; }
  absl::Status s = WriteFileAtomicallyWith(p, [](const std::string& tmp) {
    std::ofstream(tmp) << "half";
    return absl::UnavailableError("disk full");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "disk full");
  EXPECT_EQ(Read(p), "old");
  EXPECT_EQ(Entries(), std::vector<std::string>{"model.npz"});
  // A writer that replaces the temporary file by its own (as libzip does) is committed.
  s = WriteFileAtomicallyWith(p, [](const std::string& tmp) {
    const std::string own = tmp + ".own";
    std::ofstream(own) << "new";
    fs::rename(own, tmp);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Read(p), "new");
  EXPECT_EQ(Entries(), std::vector<std::string>{"model.npz"});
  // A relative name is written beside it in the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  s = WriteFileAtomically("relative.csv", "a,b\n");
  fs::current_path(cwd);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Read(dir_ / "relative.csv"), "a,b\n");
}

}  // namespace
}  // namespace joule
