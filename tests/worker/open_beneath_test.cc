#include "worker/data/open_beneath.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/temp_cleanup.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

const auto* const kOpenBeneathCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_beneath_"));

class OpenBeneathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("joule_beneath_" + std::to_string(getpid()));
    fs::remove_all(base_);
    root_ = base_ / "root";
    outside_ = base_ / "outside";
    fs::create_directories(root_ / "sub");
    fs::create_directories(outside_);
    Write(root_ / "sub" / "data.csv", "inside");
    Write(outside_ / "secret", "outside");
  }
  static void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  // What opening `path` beneath {root_} reads, or the error.
  absl::StatusOr<std::string> Read(const fs::path& path) {
    absl::StatusOr<int> fd = OpenBeneath(path.string(), {root_.string()});
    if (!fd.ok()) return fd.status();
    char buf[64];
    const ssize_t n = read(*fd, buf, sizeof(buf));
    close(*fd);
    return std::string(buf, n > 0 ? n : 0);
  }
  fs::path base_, root_, outside_;
};

TEST_F(OpenBeneathTest, OpensFilesBeneathTheRoot) {
  EXPECT_EQ(*Read(root_ / "sub" / "data.csv"), "inside");
  fs::create_symlink("sub/data.csv", root_ / "alias");  // relative, stays inside
  EXPECT_EQ(*Read(root_ / "alias"), "inside");
  // An absolute target is refused even when it points inside (RESOLVE_BENEATH's rule).
  fs::create_symlink(root_ / "sub" / "data.csv", root_ / "absolute");
  EXPECT_EQ(Read(root_ / "absolute").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Read(root_ / "none").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(OpenBeneathTest, RefusesEveryWayOut) {
  fs::create_symlink(outside_ / "secret", root_ / "link");             // a file symlink
  fs::create_directory_symlink(outside_, root_ / "dirlink");           // a directory symlink
  fs::create_symlink("../../outside/secret", root_ / "sub" / "rel");  // a relative one
  for (const fs::path& p : {root_ / "link", root_ / "dirlink" / "secret", root_ / "sub" / "rel",
                            outside_ / "secret", root_ / ".." / "outside" / "secret",
                            fs::path("/etc/passwd")}) {
    absl::StatusOr<std::string> r = Read(p);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << p << " read "
                                                                       << r.value_or("");
  }
  EXPECT_EQ(OpenBeneath("relative/data.csv", {root_.string()}).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(OpenBeneathTest, OnlyRegularFilesOpenAndAFifoNeverBlocks) {
  // A FIFO without a writer would block open(2) forever in the training thread.
  ASSERT_EQ(mkfifo((root_ / "fifo").c_str(), 0600), 0);
  for (const fs::path& p : {root_ / "fifo", root_ / "sub"}) {
    EXPECT_EQ(Read(p).status().code(), absl::StatusCode::kNotFound) << p;
    EXPECT_EQ(OpenPlain(p.string()).status().code(), absl::StatusCode::kNotFound) << p;
  }
}

TEST_F(OpenBeneathTest, AFileSwappedForASymlinkAfterTheCheckIsRefused) {
  // What the coordinator checked at submit was a plain file under the root...
  const fs::path p = root_ / "sub" / "data.csv";
  ASSERT_TRUE(Read(p).ok());
  // ...which someone replaces with a symlink out of it before the worker opens it.
  fs::remove(p);
  fs::create_symlink(outside_ / "secret", p);
  EXPECT_EQ(Read(p).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(OpenBeneathTest, RootsMayThemselvesBeSymlinks) {
  const fs::path alias = base_ / "root-alias";
  fs::create_directory_symlink(root_, alias);
  absl::StatusOr<int> fd = OpenBeneath((root_ / "sub" / "data.csv").string(), {alias.string()});
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
}

TEST_F(OpenBeneathTest, TheOpenerOfNoRootsOpensAnything) {
  FileOpener open = MakeFileOpener({});
  absl::StatusOr<int> fd = open((outside_ / "secret").string());
  ASSERT_TRUE(fd.ok());
  close(*fd);
  EXPECT_EQ(MakeFileOpener({root_.string()})((outside_ / "secret").string()).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace joule::worker
