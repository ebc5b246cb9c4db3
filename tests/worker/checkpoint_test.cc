#include "worker/train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("joule_ckpt_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static v1::Checkpoint Make(int64_t step, uint64_t hash = 42) {
    v1::Checkpoint c;
    c.set_format_version(1);
    c.set_spec_hash(hash);
    c.set_global_step(step);
    c.set_next_epoch(1);
    c.set_next_step_in_epoch(step % 10);
    v1::TensorData* t = c.add_parameters();
    t->set_name("0.weight");
    t->add_shape(2);
    t->add_shape(3);
    for (int i = 0; i < 6; ++i) t->add_values(static_cast<float>(step) + i * 0.5f);
    return c;
  }
  std::string Path(int64_t step) const {
    char name[64];
    std::snprintf(name, sizeof(name), "/ckpt-%012lld.jck", static_cast<long long>(step));
    return dir_ + name;
  }
  std::string dir_;
};

TEST_F(CheckpointTest, RoundTripAndNewestWins) {
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(100), 5).ok());
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(250), 5).ok());
  std::vector<std::string> skipped;
  auto c = LoadNewestCheckpoint(dir_, 42, &skipped);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->global_step(), 250);
  EXPECT_EQ(c->parameters(0).values(5), 252.5f);
  EXPECT_TRUE(skipped.empty());
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().extension(), ".jck") << "left a temporary file: " << e.path();
  }
}

TEST_F(CheckpointTest, KeepsOnlyTheNewestN) {
  for (int step : {10, 20, 30, 40}) ASSERT_TRUE(WriteCheckpoint(dir_, Make(step), 2).ok());
  EXPECT_FALSE(fs::exists(Path(10)));
  EXPECT_FALSE(fs::exists(Path(20)));
  EXPECT_TRUE(fs::exists(Path(30)));
  EXPECT_TRUE(fs::exists(Path(40)));
}

TEST_F(CheckpointTest, ATruncatedNewestIsSkippedForThePreviousOne) {
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(100), 5).ok());
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(200), 5).ok());
  fs::resize_file(Path(200), fs::file_size(Path(200)) - 9);
  std::vector<std::string> skipped;
  auto c = LoadNewestCheckpoint(dir_, 42, &skipped);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->global_step(), 100);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("truncated"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find(Path(200)), std::string::npos) << skipped[0];
}

TEST_F(CheckpointTest, AFlippedByteFailsTheChecksum) {
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(100), 5).ok());
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(200), 5).ok());
  {
    std::fstream f(Path(200), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x7f');
  }
  auto bad = ReadCheckpoint(Path(200));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(bad.status().message()).find("checksum mismatch"), std::string::npos)
      << bad.status();
  std::vector<std::string> skipped;
  auto c = LoadNewestCheckpoint(dir_, 42, &skipped);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->global_step(), 100);
}

TEST_F(CheckpointTest, GarbageAndForeignCheckpointsAreNotResumed) {
  fs::create_directories(dir_);
  std::ofstream(Path(999)) << "not a checkpoint at all";
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(50, /*hash=*/7), 5).ok());
  std::vector<std::string> skipped;
  auto c = LoadNewestCheckpoint(dir_, 42, &skipped);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("bad magic"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find("different job shape"), std::string::npos) << skipped[1];
}

TEST_F(CheckpointTest, PruningNeverDeletesTheFileJustWrittenForAStaleNewerOne) {
  fs::create_directories(dir_);
  std::ofstream(Path(999)) << "garbage from an abandoned run";
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(50), 1).ok());
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(100), 1).ok());
  EXPECT_FALSE(fs::exists(Path(50)));
  EXPECT_TRUE(fs::exists(Path(100)));
  std::vector<std::string> skipped;
  auto c = LoadNewestCheckpoint(dir_, 42, &skipped);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->global_step(), 100);
}

TEST_F(CheckpointTest, NoDirectoryIsNotFound) {
  std::vector<std::string> skipped;
  EXPECT_EQ(LoadNewestCheckpoint(dir_ + "/missing", 42, &skipped).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SpecHashTest, ChangesWithWhatShapesTheRunOnly) {
  v1::JobSpec a;
  a.set_model("mlp");
  a.set_global_batch_size(128);
  a.set_workers(2);
  v1::JobSpec b = a;
  b.set_epochs(10);  // more epochs: the same run, longer
  b.set_name("renamed");
  EXPECT_EQ(SpecHash(a), SpecHash(b));
  b.set_global_batch_size(256);
  EXPECT_NE(SpecHash(a), SpecHash(b));
}

}  // namespace
}  // namespace joule::worker
