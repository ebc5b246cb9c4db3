#include "worker/train/splits.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

// A fresh directory under the temp directory, removed with the fixture.
class SplitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("joule-splits-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // An uncompressed IDX file: magic {0, 0, 8, ndim}, big-endian dimensions, bytes.
  void WriteIdx(const std::string& name, const std::vector<uint32_t>& dims) {
    std::ofstream out(dir_ / name, std::ios::binary);
    out.put(0).put(0).put(8).put(static_cast<char>(dims.size()));
    size_t n = 1;
    for (uint32_t d : dims) {
      for (int shift : {24, 16, 8, 0}) out.put(static_cast<char>((d >> shift) & 0xFF));
      n *= d;
    }
    for (size_t i = 0; i < n; ++i) out.put(static_cast<char>(i % 2));
  }
  void WriteIdxPair(const std::string& prefix, uint32_t count, uint32_t side) {
    WriteIdx(prefix + "-images-idx3-ubyte", {count, side, side});
    WriteIdx(prefix + "-labels-idx1-ubyte", {count});
  }

  std::filesystem::path dir_;
};

v1::JobSpec Spec(const std::string& dataset) {
  v1::JobSpec s;
  s.set_dataset(dataset);
  return s;
}

TEST_F(SplitsTest, SyntheticSplitsHaveTheirDocumentedSizes) {
  absl::StatusOr<Splits> s = LoadSplits(Spec("synthetic:3x8x5:4:200"), "/nonexistent", OpenPlain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size, 200);
  EXPECT_EQ(s->test.size, 20);
  EXPECT_EQ(s->train.channels, 3);
  EXPECT_EQ(s->train.height, 8);
  EXPECT_EQ(s->train.width, 5);
  EXPECT_EQ(s->train.images.size(), 200u * 3 * 8 * 5);
  // A stratified fraction thins the training split only.
  v1::JobSpec half = Spec("synthetic:1x4x4:2:200");
  half.set_dataset_fraction(2);
  s = LoadSplits(half, "", OpenPlain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_LT(s->train.size, 200);
  EXPECT_GE(s->train.size, 99);
  EXPECT_EQ(s->test.size, 20);
}

TEST_F(SplitsTest, IdxDirectoriesLoadAndCapTheirSplits) {
  WriteIdxPair("train", 12, 4);
  WriteIdxPair("t10k", 5, 4);
  v1::JobSpec spec = Spec("idx:" + dir_.string());
  absl::StatusOr<Splits> s = LoadSplits(spec, "", OpenPlain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size, 12);
  EXPECT_EQ(s->test.size, 5);
  spec.set_max_train_samples(7);
  spec.set_max_test_samples(2);
  s = LoadSplits(spec, "", OpenPlain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size, 7);
  EXPECT_EQ(s->test.size, 2);
}

TEST_F(SplitsTest, TestImagesOfAnotherSizeAreDataLoss) {
  WriteIdxPair("train", 6, 4);
  WriteIdxPair("t10k", 3, 5);
  absl::StatusOr<Splits> s = LoadSplits(Spec("idx:" + dir_.string()), "", OpenPlain);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("test images are 5x5, train images 4x4"), std::string::npos)
      << s.status();
}

TEST_F(SplitsTest, JobFilesAreOpenedBeneathTheRootsNamedDatasetsUnderTheDataRoot) {
  const std::filesystem::path csv = dir_ / "blobs.csv";
  {
    std::ofstream out(csv);
    out << "x,label\n";
    for (int i = 0; i < 40; ++i) out << i << "," << i % 2 << "\n";
  }
  // Inside the allowed root: rows 9, 19, ... are the test split.
  absl::StatusOr<Splits> s =
      LoadSplits(Spec("csv:" + csv.string()), "", MakeFileOpener({dir_.string()}));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size, 36);
  EXPECT_EQ(s->test.size, 4);
  // Outside it, for csv: and idx: alike.
  const FileOpener elsewhere = MakeFileOpener({"/usr/share/datasets"});
  s = LoadSplits(Spec("csv:" + csv.string()), "", elsewhere);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  WriteIdxPair("train", 6, 4);
  WriteIdxPair("t10k", 3, 4);
  s = LoadSplits(Spec("idx:" + dir_.string()), "", elsewhere);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  // A named dataset lies under the worker's own data root, whatever the roots.
  std::filesystem::create_directories(dir_ / "fashion-mnist");
  std::filesystem::rename(dir_ / "train-images-idx3-ubyte", dir_ / "fashion-mnist/train-images-idx3-ubyte");
  std::filesystem::rename(dir_ / "train-labels-idx1-ubyte", dir_ / "fashion-mnist/train-labels-idx1-ubyte");
  std::filesystem::rename(dir_ / "t10k-images-idx3-ubyte", dir_ / "fashion-mnist/t10k-images-idx3-ubyte");
  std::filesystem::rename(dir_ / "t10k-labels-idx1-ubyte", dir_ / "fashion-mnist/t10k-labels-idx1-ubyte");
  s = LoadSplits(Spec("fashion-mnist"), dir_.string(), elsewhere);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size, 6);
}

TEST_F(SplitsTest, MissingAndMalformedDatasetsAreErrors) {
  EXPECT_EQ(LoadSplits(Spec("idx:" + dir_.string()), "", OpenPlain).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(LoadSplits(Spec("synthetic:0x1x1:2:10"), "", OpenPlain).ok());
  EXPECT_FALSE(LoadSplits(Spec("csv:"), "", OpenPlain).ok());
}

TEST(CheckBatchTilingTest, OnlyBatchesThatTileAreAccepted) {
  // Every combination on a small grid: accepted exactly when the global batch is world x
  // local x max(1, accumulation) with a positive local batch, and one fits in the split.
  for (int world = 0; world <= 3; ++world) {
    for (int local = -1; local <= 3; ++local) {
      for (int accumulation = 0; accumulation <= 2; ++accumulation) {
        for (int global = 0; global <= 20; ++global) {
          for (int64_t train : {0, 5, 18}) {
            v1::JobSpec spec;
            spec.set_global_batch_size(global);
            spec.set_local_batch_size(local);
            spec.set_accumulation_steps(accumulation);
            const bool tiles =
                world >= 1 && local > 0 && global == world * local * std::max(1, accumulation);
            const absl::Status s = CheckBatchTiling(spec, world, train);
            const std::string what = absl::StrCat("world ", world, " local ", local, " acc ",
                                                  accumulation, " global ", global, " train ",
                                                  train, ": ", s.ToString());
            EXPECT_EQ(s.ok(), tiles && train >= global) << what;
            if (!s.ok()) {
              EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
              EXPECT_NE(s.message().find(tiles ? "fewer than one global batch" : "is not workers"),
                        std::string::npos)
                  << what;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace joule::worker
