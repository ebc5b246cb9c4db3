#include "worker/data/staging.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

struct ScopedStageDir {
  fs::path path;
  ScopedStageDir() : path(fs::temp_directory_path() / absl::StrCat("joule-stage-", getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScopedStageDir() { fs::remove_all(path); }
};

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

TEST(StagingTest, AFolderIsCopiedOnceAndSharedThenRemoved) {
  ScopedStageDir d;
  const fs::path src = d.path / "data";
  Write(src / "train" / "a" / "1.png", "one");
  Write(src / "train" / "b" / "2.jpg", "two!");
  Write(src / "val" / "a" / "3.png", "three");
  Write(src / "classes.txt", "a\nb\n");
  Write(src / "notes" / "big.bin", "not the dataset's");  // not a split: not copied
  const std::string dir = (d.path / "scratch" / "joule-stage" / "job-7").string();
  absl::StatusOr<StagedData> s = StageLocal(src.string(), dir, OpenPlain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->copied);
  EXPECT_EQ(s->path, dir);
  EXPECT_EQ(s->files, 4);
  EXPECT_EQ(s->bytes, 3 + 4 + 5 + 4);
  EXPECT_EQ(Read(fs::path(dir) / "train" / "b" / "2.jpg"), "two!");
  EXPECT_EQ(Read(fs::path(dir) / "classes.txt"), "a\nb\n");
  EXPECT_FALSE(fs::exists(fs::path(dir) / "notes"));
  // A later rank or attempt on this host finds it whole and copies nothing.
  absl::StatusOr<StagedData> again = StageLocal(src.string(), dir, OpenPlain);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->copied);
  // A copy a crash left half-made (no marker) is made again, whole.
  fs::remove(fs::path(dir) / ".joule-staged");
  fs::remove(fs::path(dir) / "train" / "a" / "1.png");
  absl::StatusOr<StagedData> redone = StageLocal(src.string(), dir, OpenPlain);
  ASSERT_TRUE(redone.ok());
  EXPECT_TRUE(redone->copied);
  EXPECT_EQ(Read(fs::path(dir) / "train" / "a" / "1.png"), "one");
  RemoveStaged(dir);
  EXPECT_FALSE(fs::exists(dir));
}

TEST(StagingTest, SymlinkedClassesAndFilesAreCopiedUnderTheirLinksNames) {
  // ImageNet trees are often links into a pool: the copy has the links' paths, with the
  // files' contents, inside the staging directory.
  ScopedStageDir d;
  Write(d.path / "pool" / "x.jpg", "pixels");
  Write(d.path / "pool" / "cls" / "y.png", "more");
  const fs::path src = d.path / "data";
  fs::create_directories(src / "train" / "a");
  fs::create_symlink(d.path / "pool" / "x.jpg", src / "train" / "a" / "1.jpg");
  fs::create_directory_symlink(d.path / "pool" / "cls", src / "train" / "b");
  const std::string dir = (d.path / "stage").string();
  absl::StatusOr<StagedData> s = StageLocal(src.string(), dir, OpenPlain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->files, 2);
  EXPECT_EQ(Read(fs::path(dir) / "train" / "a" / "1.jpg"), "pixels");
  EXPECT_EQ(Read(fs::path(dir) / "train" / "b" / "y.png"), "more");
  EXPECT_FALSE(fs::is_symlink(fs::path(dir) / "train" / "a" / "1.jpg"));
  EXPECT_FALSE(fs::exists(d.path / "pool" / "pool")) << "nothing written outside the copy";
}

TEST(StagingTest, RanksRacingOnOneHostCopyOnce) {
  ScopedStageDir d;
  const fs::path src = d.path / "f.h5";
  Write(src, std::string(1 << 20, 'x'));
  const std::string dir = (d.path / "stage").string();
  std::vector<absl::StatusOr<StagedData>> got(4, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] { got[r] = StageLocal(src.string(), dir, OpenPlain); });
  }
  for (auto& t : ranks) t.join();
  int copies = 0;
  for (const auto& g : got) {
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->path, (fs::path(dir) / "f.h5").string());
    copies += g->copied;
  }
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(fs::file_size(fs::path(dir) / "f.h5"), size_t{1} << 20);
}

TEST(StagingTest, FilesTheOpenerRefusesAreNotCopied) {
  ScopedStageDir d;
  Write(d.path / "data" / "train" / "a" / "1.png", "x");
  absl::StatusOr<StagedData> s = StageLocal((d.path / "data").string(), (d.path / "s").string(),
                                            MakeFileOpener({"/usr/share"}));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  absl::StatusOr<StagedData> missing =
      StageLocal((d.path / "nope.h5").string(), (d.path / "t").string(), OpenPlain);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
}

}  // namespace
}  // namespace joule::worker
