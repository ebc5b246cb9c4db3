#include "worker/train/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// A checkpoint with every kind of field: scalars before and after the tensor lists
// (fields 1-7, 10-11), and tensors of several sizes in each list (8, 9, 12).
v1::Checkpoint Varied() {
  v1::Checkpoint c;
  c.set_format_version(1);
  c.set_spec_hash(0xfeedfacecafebeef);
  c.set_job_id(12);
  c.set_attempt(3);
  c.set_next_epoch(4);
  c.set_next_step_in_epoch(5);
  c.set_global_step(678);
  c.set_test_accuracy(0.875);
  c.set_test_loss(0.25);
  int n = 0;
  for (auto* list : {c.mutable_parameters(), c.mutable_momentum(), c.mutable_statistics()}) {
    for (int sizes : {1, 7, 40}) {
      v1::TensorData* t = list->Add();
      t->set_name("t" + std::to_string(n++));
      t->add_shape(sizes);
      for (int i = 0; i < sizes; ++i) t->add_values(n * 1000.0f + i);
    }
  }
  return c;
}

// The wire size of the largest top-level field of `c`: its tag, length and bytes.
size_t LargestField(const v1::Checkpoint& c) {
  size_t largest = 0;
  for (const auto* list : {&c.parameters(), &c.momentum(), &c.statistics()}) {
    for (const v1::TensorData& t : *list) {
      v1::Checkpoint alone;  // fields 8, 9 and 12 all have one-byte tags
      *alone.add_parameters() = t;
      largest = std::max(largest, alone.ByteSizeLong());
    }
  }
  return largest;
}

TEST(CheckpointPayloadTest, PayloadsOfManyPiecesAreTheBytesProtobufWritesAndParseBack) {
  // Every piece limit from the largest field up to the whole payload and past it: each
  // boundary between pieces falls everywhere it can, and the one-piece path is at the end.
  const v1::Checkpoint c = Varied();
  const std::string canonical = c.SerializeAsString();
  ASSERT_GT(canonical.size(), 3 * LargestField(c));
  for (size_t max_piece = LargestField(c); max_piece <= canonical.size() + 1; ++max_piece) {
    SCOPED_TRACE(max_piece);
    std::string bytes = "prefix";
    ASSERT_TRUE(AppendCheckpointPayload(c, max_piece, &bytes).ok());
    EXPECT_EQ(bytes, "prefix" + canonical);
    auto pieces = SplitCheckpointPayload(canonical, max_piece);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    size_t next = 0;
    for (const auto& [begin, end] : *pieces) {
      EXPECT_EQ(begin, next);
      EXPECT_LE(end - begin, max_piece);
      v1::Checkpoint piece;  // whole fields: each piece is a message of its own
      EXPECT_TRUE(piece.ParseFromString(canonical.substr(begin, end - begin))) << begin;
      next = end;
    }
    EXPECT_EQ(next, canonical.size());
    EXPECT_EQ(pieces->size() == 1, canonical.size() <= max_piece);
    v1::Checkpoint back;
    ASSERT_TRUE(ParseCheckpointPayload(canonical, max_piece, &back).ok());
    EXPECT_EQ(back.SerializeAsString(), canonical);
    EXPECT_EQ(back.statistics(2).values(39), c.statistics(2).values(39));
  }
}

TEST(CheckpointPayloadTest, AFieldLargerThanOnePieceIsRefusedClearly) {
  const v1::Checkpoint c = Varied();
  const std::string canonical = c.SerializeAsString();
  const size_t max_piece = LargestField(c) - 1;
  std::string bytes;
  absl::Status w = AppendCheckpointPayload(c, max_piece, &bytes);
  EXPECT_EQ(w.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(w.message()).find("parameters[2]"), std::string::npos) << w;
  v1::Checkpoint back;
  absl::Status r = ParseCheckpointPayload(canonical, max_piece, &back);
  EXPECT_EQ(r.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(r.message()).find("field 8 at byte"), std::string::npos) << r;
  EXPECT_NE(std::string(r.message()).find("protobuf parses in one piece"), std::string::npos) << r;
  // The scalars too, as one run.
  absl::Status scalars = AppendCheckpointPayload(c, 8, &bytes);
  EXPECT_EQ(scalars.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(scalars.message()).find("format_version"), std::string::npos) << scalars;
}

TEST(CheckpointPayloadTest, DamagedPayloadsFailCleanlyOrParseAsProtobufDoes) {
  // Every truncation, and every byte replaced by a few values, parsed in small pieces: the
  // answer is DATA_LOSS, or exactly what protobuf's own parser makes of the same bytes.
  const std::string canonical = Varied().SerializeAsString();
  const size_t max_piece = LargestField(Varied()) + 8;
  auto check = [&](const std::string& bytes) {
    v1::Checkpoint ours, theirs;
    absl::Status st = ParseCheckpointPayload(bytes, max_piece, &ours);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
      return;
    }
    ASSERT_TRUE(theirs.ParseFromString(bytes));
    EXPECT_EQ(ours.SerializeAsString(), theirs.SerializeAsString());
  };
  int accepted = 0;
  for (size_t n = 0; n < canonical.size(); ++n) {
    SCOPED_TRACE(n);
    check(canonical.substr(0, n));
    v1::Checkpoint ours;
    accepted += ParseCheckpointPayload(canonical.substr(0, n), max_piece, &ours).ok();
    for (char b : {'\x00', '\x07', '\x0b', '\x80', '\xff'}) {
      std::string flipped = canonical;
      flipped[n] = b;
      check(flipped);
    }
  }
  EXPECT_GT(accepted, 0);  // whole-field prefixes are valid messages
  EXPECT_LT(accepted, static_cast<int>(canonical.size()));
}

TEST_F(CheckpointTest, AHeaderLengthThatDisagreesWithTheFileIsRefused) {
  ASSERT_TRUE(WriteCheckpoint(dir_, Make(100), 5).ok());
  const uint64_t real = fs::file_size(Path(100)) - 20;
  for (uint64_t length : {uint64_t{0}, real - 1, real + 1, uint64_t{1} << 31,
                          (uint64_t{1} << 32) + real, ~uint64_t{0} - 19, ~uint64_t{0}}) {
    SCOPED_TRACE(length);
    std::fstream f(Path(100), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((length >> (8 * i)) & 0xff));
    f.close();
    auto c = ReadCheckpoint(Path(100));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(std::string(c.status().message()).find("truncated or padded"), std::string::npos)
        << c.status();
  }
}

// Protobuf will not serialize this checkpoint in one call (SerializeAsString gives ""), so
// before payloads were written field by field it was saved as an empty payload, and one
// over 2 GiB could not be parsed (ParseFromArray takes an int). It needs ~12 GB of memory
// and 2.4 GB of disk, so it runs only on request:
//   worker_checkpoint_test --gtest_also_run_disabled_tests --gtest_filter='*Above2GiB*'
TEST_F(CheckpointTest, DISABLED_ACheckpointAbove2GiBRoundTrips) {
  v1::Checkpoint c = Make(7);
  constexpr int kFloats = 200'000'000;  // 800 MB a tensor, three: 2.4 GB
  for (int t = 0; t < 3; ++t) {
    v1::TensorData* p = c.add_parameters();
    p->set_name("big" + std::to_string(t));
    p->add_shape(kFloats);
    p->mutable_values()->Resize(kFloats, 0.0f);
    p->set_values(kFloats - 1, static_cast<float>(t + 1));
  }
  ASSERT_GT(c.ByteSizeLong(), size_t{1} << 31);
  EXPECT_TRUE(c.SerializeAsString().empty());  // protobuf's own limit
  ASSERT_TRUE(WriteCheckpoint(dir_, c, 1).ok());
  EXPECT_GT(fs::file_size(Path(7)), uint64_t{1} << 31);
  auto back = ReadCheckpoint(Path(7));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->parameters_size(), 4);
  EXPECT_EQ(back->global_step(), 7);
  EXPECT_EQ(back->parameters(0).values(5), c.parameters(0).values(5));
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(back->parameters(t + 1).values_size(), kFloats);
    EXPECT_EQ(back->parameters(t + 1).values(kFloats - 1), t + 1.0f);
  }
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
