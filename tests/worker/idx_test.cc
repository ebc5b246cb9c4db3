#include "worker/data/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "worker/data/dataset.h"
#include "tests/testing/temp_cleanup.h"

namespace joule::worker {
namespace {

const auto* const kIdxCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_idx_"));

namespace fs = std::filesystem;

std::string Header(uint8_t type, std::vector<uint32_t> dims) {
  std::string h = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) h.push_back(static_cast<char>((d >> s) & 0xff));
  }
  return h;
}

std::string Images(uint32_t n, uint32_t h, uint32_t w) {
  std::string out = Header(0x08, {n, h, w});
  for (uint32_t i = 0; i < n * h * w; ++i) out.push_back(static_cast<char>(i % 251));
  return out;
}

std::string Labels(uint32_t n) {
  std::string out = Header(0x08, {n});
  for (uint32_t i = 0; i < n; ++i) out.push_back(static_cast<char>(i % 10));
  return out;
}

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("joule_idx_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void Write(const std::string& name, const std::string& bytes, bool gz) {
    std::string path = (dir_ / name).string();
    if (gz) {
      gzFile f = gzopen((path + ".gz").c_str(), "wb");
      gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
      gzclose(f);
    } else {
      std::ofstream(path, std::ios::binary) << bytes;
    }
  }
  void WriteSplit(const std::string& prefix, uint32_t n_images, uint32_t n_labels, bool gz) {
    Write(prefix + "-images-idx3-ubyte", Images(n_images, 4, 5), gz);
    Write(prefix + "-labels-idx1-ubyte", Labels(n_labels), gz);
  }
  fs::path dir_;
};

TEST(IdxTest, ParsesAGoodFile) {
  auto a = ParseIdx(Images(3, 4, 5), "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<uint32_t>{3, 4, 5}));
  EXPECT_EQ(a->data.size(), 60u);
  EXPECT_EQ(a->data[59], 59);
}

TEST(IdxTest, RejectsTruncatedData) {
  std::string bytes = Images(3, 4, 5);
  bytes.resize(bytes.size() - 7);
  auto a = ParseIdx(bytes, "train-images");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(a.status().message()).find("train-images: truncated"), std::string::npos)
      << a.status();
}

TEST(IdxTest, RejectsTruncatedHeader) {
  auto a = ParseIdx(Images(3, 4, 5).substr(0, 9), "x");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(a.status().message()).find("truncated"), std::string::npos);
  EXPECT_FALSE(ParseIdx("", "x").ok());
}

TEST(IdxTest, RejectsWrongMagicAndTypes) {
  std::string bytes = Images(1, 2, 2);
  bytes[0] = 0x1f;  // e.g. a gzip file read as raw
  auto a = ParseIdx(bytes, "x");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(a.status().message()).find("not an IDX file"), std::string::npos);
  std::string floats = Header(0x0D, {4});
  floats += std::string(16, '\0');
  EXPECT_NE(std::string(ParseIdx(floats, "x").status().message()).find("not unsigned byte"),
            std::string::npos);
  EXPECT_FALSE(ParseIdx(Header(0x08, {}), "x").ok());
  EXPECT_FALSE(ParseIdx(Header(0x08, {0}), "x").ok());
}

TEST(IdxTest, RejectsTrailingBytes) {
  auto a = ParseIdx(Labels(5) + "zz", "labels");
  EXPECT_NE(std::string(a.status().message()).find("2 bytes after"), std::string::npos);
}

TEST_F(IdxFiles, LoadsGzipAndRawSplits) {
  WriteSplit("train", 30, 30, /*gz=*/true);
  WriteSplit("t10k", 10, 10, /*gz=*/false);
  auto train = LoadIdxDataset(dir_.string(), Split::kTrain, 0);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size, 30);
  EXPECT_EQ(train->height, 4);
  EXPECT_EQ(train->width, 5);
  EXPECT_EQ(train->classes, 10);
  EXPECT_FLOAT_EQ(train->images[1], 1.0f / 255.0f);
  EXPECT_EQ(train->labels[13], 3);
  auto test = LoadIdxDataset(dir_.string(), Split::kTest, 4);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size, 4);
  EXPECT_EQ(test->images.size(), 4u * 20u);
}

TEST_F(IdxFiles, RejectsMismatchedCounts) {
  WriteSplit("train", 30, 29, true);
  auto d = LoadIdxDataset(dir_.string(), Split::kTrain, 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(d.status().message()).find("holds 30 images but"), std::string::npos)
      << d.status();
}

TEST_F(IdxFiles, RejectsATruncatedGzipStream) {
  WriteSplit("train", 200, 200, true);
  std::string path = (dir_ / "train-images-idx3-ubyte.gz").string();
  fs::resize_file(path, fs::file_size(path) / 2);
  auto d = LoadIdxDataset(dir_.string(), Split::kTrain, 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << d.status();
  EXPECT_NE(std::string(d.status().message()).find("train-images-idx3-ubyte.gz"),
            std::string::npos)
      << d.status();
}

TEST_F(IdxFiles, MissingFileIsNotFound) {
  auto d = LoadIdxDataset(dir_.string(), Split::kTest, 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
}

TEST(FashionMnistTest, TheInstalledDatasetLoads) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  ASSERT_TRUE(fs::exists(dir)) << "install dataset-fashion-mnist (scripts/install-deps.sh)";
  auto test = LoadIdxDataset(dir, Split::kTest, 0);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size, 10000);
  EXPECT_EQ(test->height, 28);
  EXPECT_EQ(test->classes, 10);
}

TEST(SyntheticDatasetTest, ShapesAreAsAskedAndTheSameOnEveryRank) {
  SyntheticSpec spec{3, 8, 6, 5, 200};
  ImageDataset a = MakeSyntheticDataset(spec, Split::kTrain);
  ImageDataset b = MakeSyntheticDataset(spec, Split::kTrain);
  ImageDataset test = MakeSyntheticDataset(spec, Split::kTest);
  EXPECT_EQ(a.size, 200);
  EXPECT_EQ(test.size, 20);
  EXPECT_EQ(a.images.size(), 200u * 3 * 8 * 6);
  EXPECT_EQ(a.images, b.images);  // deterministic: every rank draws the same data
  EXPECT_EQ(a.labels, b.labels);
  for (int64_t l : a.labels) EXPECT_LT(l, 5);
  for (float v : a.images) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LT(v, 1.0f);
  }
}

TEST(SyntheticDatasetTest, StratifiedFractionKeepsEveryKthOfEachClass) {
  ImageDataset d;
  d.size = 12;
  d.classes = 2;
  d.height = d.width = 1;
  for (int i = 0; i < 12; ++i) {
    d.images.push_back(static_cast<float>(i));
    d.labels.push_back(i < 8 ? 0 : 1);  // 8 of class 0, 4 of class 1
  }
  KeepStratifiedFraction(d, 4);
  EXPECT_EQ(d.size, 3);
  EXPECT_EQ(d.labels, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(d.images, (std::vector<float>{0, 4, 8}));
}

TEST(EpochSharderTest, RanksGetDisjointEqualShardsThatChangePerEpoch) {
  constexpr int kWorld = 3;
  constexpr int64_t kSize = 1000, kGlobal = 48;
  std::vector<EpochSharder> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.emplace_back(kSize, kGlobal, r, kWorld, 7);
  std::vector<int64_t> first_epoch_step0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen;
    for (auto& s : ranks) {
      s.StartEpoch(epoch);
      EXPECT_EQ(s.steps_per_epoch(), kSize / kGlobal);  // remainder dropped
      EXPECT_EQ(s.local_batch(), kGlobal / kWorld);
      for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
        for (int64_t i : s.Batch(step)) {
          EXPECT_TRUE(seen.insert(i).second) << "example " << i << " used twice";
          EXPECT_LT(i, kSize);
        }
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kSize / kGlobal * kGlobal));
    std::vector<int64_t> step0 = ranks[0].Batch(0);
    if (epoch == 0) first_epoch_step0 = step0;
    else EXPECT_NE(step0, first_epoch_step0);
  }
}

}  // namespace
}  // namespace joule::worker
