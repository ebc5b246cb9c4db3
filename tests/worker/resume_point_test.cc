#include "worker/train/resume_point.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/run_ranks.h"
#include "worker/comm/gloo_process_group.h"
#include "worker/comm/shm_process_group.h"

namespace joule::worker {
namespace {

using I64 = std::numeric_limits<int64_t>;
using I32 = std::numeric_limits<int32_t>;

// Resume points at the boundaries of every field. The float-halves header this encoding
// replaced carried integers as 24-bit halves: values at and past 2^48 (and any negative
// one) came back wrong.
std::vector<ResumePoint> BoundaryPoints() {
  const std::vector<int64_t> i64 = {0,           1,          -1,       (int64_t{1} << 24) - 1,
                                    int64_t{1} << 24, int64_t{1} << 48, (int64_t{1} << 53) + 1,
                                    I64::max(),  I64::min(), I64::max() - 1, I64::min() + 1};
  const std::vector<int32_t> i32 = {0, 1, -1, I32::max(), I32::min()};
  const std::vector<double> doubles = {-1.0,
                                       0.0,
                                       -0.0,
                                       0.1,  // not a float
                                       1.0 / 3.0,
                                       std::numeric_limits<double>::denorm_min(),
                                       std::numeric_limits<double>::max(),
                                       std::numeric_limits<double>::infinity()};
  std::vector<ResumePoint> points;
  for (size_t i = 0; i < i64.size(); ++i) {
    ResumePoint p;
    p.next_epoch = i32[i % i32.size()];
    p.next_step_in_epoch = i64[i];
    p.global_step = i64[i64.size() - 1 - i];
    p.has_optimizer_state = i % 2 == 0;
    p.test_accuracy = doubles[i % doubles.size()];
    p.has_plateau = i % 3 == 0;
    p.plateau.scale = doubles[(i + 3) % doubles.size()];
    p.plateau.best = doubles[(i + 5) % doubles.size()];
    p.plateau.bad_epochs = i32[(i + 1) % i32.size()];
    points.push_back(p);
  }
  return points;
}

std::string Describe(const ResumePoint& p) {
  return absl::StrCat("epoch ", p.next_epoch, " step ", p.next_step_in_epoch, " global ",
                      p.global_step, " momentum ", p.has_optimizer_state, " accuracy ",
                      p.test_accuracy);
}

// Equal field by field, the accuracy by its bits (so -0.0 and NaN payloads count).
void ExpectSame(const ResumePoint& got, const ResumePoint& want) {
  EXPECT_EQ(got.next_epoch, want.next_epoch) << Describe(want);
  EXPECT_EQ(got.next_step_in_epoch, want.next_step_in_epoch) << Describe(want);
  EXPECT_EQ(got.global_step, want.global_step) << Describe(want);
  EXPECT_EQ(got.has_optimizer_state, want.has_optimizer_state) << Describe(want);
  EXPECT_EQ(std::bit_cast<uint64_t>(got.test_accuracy),
            std::bit_cast<uint64_t>(want.test_accuracy))
      << Describe(want);
  EXPECT_EQ(got.has_plateau, want.has_plateau) << Describe(want);
  EXPECT_EQ(std::bit_cast<uint64_t>(got.plateau.scale), std::bit_cast<uint64_t>(want.plateau.scale))
      << Describe(want);
  EXPECT_EQ(std::bit_cast<uint64_t>(got.plateau.best), std::bit_cast<uint64_t>(want.plateau.best))
      << Describe(want);
  EXPECT_EQ(got.plateau.bad_epochs, want.plateau.bad_epochs) << Describe(want);
}

TEST(ResumePointTest, EveryBoundaryValueRoundTrips) {
  std::vector<ResumePoint> points = BoundaryPoints();
  ResumePoint nan;
  nan.test_accuracy = std::bit_cast<double>(uint64_t{0x7FF8'0000'0000'1234});  // a payload
  points.push_back(nan);
  for (const ResumePoint& p : points) {
    absl::StatusOr<std::optional<ResumePoint>> back = DecodeResumePoint(EncodeResumePoint(p));
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_TRUE(back->has_value()) << Describe(p);
    ExpectSame(**back, p);
  }
}

TEST(ResumePointTest, TheLayoutIsLittleEndianAsDocumented) {
  ResumePoint p;
  p.next_epoch = 0x01020304;
  p.next_step_in_epoch = 0x1112131415161718;
  p.global_step = -2;  // FE FF .. FF
  p.has_optimizer_state = true;
  p.test_accuracy = 1.0;  // 0x3FF0000000000000
  p.has_plateau = true;
  p.plateau.scale = 0.5;  // 0x3FE0000000000000; best stays +inf, 0x7FF0000000000000
  p.plateau.bad_epochs = 0x0A0B0C0D;
  const ResumePointBytes b = EncodeResumePoint(p);
  const ResumePointBytes want = {
      1,    0x04, 0x03, 0x02, 0x01, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
      0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 1,    0,    0,    0,    0,
      0,    0,    0xF0, 0x3F, 1,    0,    0,    0,    0,    0,    0,    0xE0, 0x3F,
      0,    0,    0,    0,    0,    0,    0xF0, 0x7F, 0x0D, 0x0C, 0x0B, 0x0A};
  EXPECT_EQ(b, want);
  EXPECT_EQ(EncodeResumePoint(std::nullopt), ResumePointBytes{});
}

TEST(ResumePointTest, NoCheckpointRoundTrips) {
  absl::StatusOr<std::optional<ResumePoint>> back =
      DecodeResumePoint(EncodeResumePoint(std::nullopt));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->has_value());
}

TEST(ResumePointTest, BytesThatAreNoEncodingAreDataLoss) {
  // Every flag value but 0 and 1, in either flag byte; and stray bytes after "none".
  for (size_t flag : {size_t{0}, size_t{21}, size_t{30}}) {
    for (int v = 2; v < 256; ++v) {
      ResumePointBytes b = EncodeResumePoint(ResumePoint{});
      b[flag] = static_cast<uint8_t>(v);
      absl::StatusOr<std::optional<ResumePoint>> got = DecodeResumePoint(b);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << flag << " " << v;
    }
  }
  for (size_t i = 1; i < kResumePointBytes; ++i) {
    ResumePointBytes b{};
    b[i] = 7;
    absl::StatusOr<std::optional<ResumePoint>> got = DecodeResumePoint(b);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << i;
    const std::string named = i == 21   ? "flag bytes are 0, 7 and 0"
                              : i == 30 ? "flag bytes are 0, 0 and 7"
                                        : absl::StrCat("byte ", i);
    EXPECT_NE(got.status().message().find(named), std::string::npos) << got.status();
  }
}

template <typename Group>
void BroadcastBoundaries(
    const std::function<absl::StatusOr<std::unique_ptr<Group>>(int, KvClient&)>& create) {
  const std::vector<ResumePoint> points = BoundaryPoints();
  testing::RunRanks<Group>(3, create, [&](int rank, Group& pg) {
    for (const ResumePoint& p : points) {
      // Non-roots start from something else: what they pass is ignored.
      std::optional<ResumePoint> point;
      if (rank == 1) point = p;
      if (rank == 2) point = ResumePoint{};
      ASSERT_TRUE(BroadcastResumePoint(pg, 1, &point).ok());
      ASSERT_TRUE(point.has_value()) << "rank " << rank;
      ExpectSame(*point, p);
    }
    std::optional<ResumePoint> none;
    if (rank != 0) none = ResumePoint{};
    ASSERT_TRUE(BroadcastResumePoint(pg, 0, &none).ok());
    EXPECT_FALSE(none.has_value()) << "rank " << rank;
  });
}

TEST(ResumePointTest, BroadcastIsExactOnEveryTransport) {
  BroadcastBoundaries<ShmProcessGroup>(
      [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 3, kv, ShmOptions{}); });
  BroadcastBoundaries<GlooProcessGroup>([](int r, KvClient& kv) {
    GlooOptions o;
    o.timeout = std::chrono::seconds(30);
    return GlooProcessGroup::Create(r, 3, kv, o);
  });
}

// One rank whose Broadcast delivers `wire` (what a broken transport might), for the
// receiving side's checks.
class ScriptedBroadcast final : public ProcessGroup {
 public:
  explicit ScriptedBroadcast(std::vector<float> wire) : wire_(std::move(wire)) {}
  int rank() const override { return 1; }
  int size() const override { return 2; }
  std::shared_ptr<Work> AllreduceAsync(SharedBuffer, ReduceOp, Precision) override {
    return std::make_shared<CompletedWork>(absl::UnimplementedError("allreduce"));
  }
  using ProcessGroup::AllreduceAsync;
  absl::Status Allreduce(std::span<float>, ReduceOp) override {
    return absl::UnimplementedError("allreduce");
  }
  absl::Status AllreduceHalf(std::span<Half>, ReduceOp) override {
    return absl::UnimplementedError("allreduce");
  }
  absl::Status Broadcast(std::span<float> data, int root) override {
    if (root != 0 || data.size() != wire_.size()) return absl::InvalidArgumentError("size");
    std::copy(wire_.begin(), wire_.end(), data.begin());
    return absl::OkStatus();
  }
  absl::Status Allgather(std::span<const float>, std::span<float>) override {
    return absl::UnimplementedError("allgather");
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort() override {}

 private:
  std::vector<float> wire_;
};

TEST(ResumePointTest, ElementsThatAreNotBytesAreDataLoss) {
  for (float bad : {-1.0f, 256.0f, 0.5f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<float> wire(kResumePointBytes, 0.0f);
    wire[0] = 1.0f;
    wire[9] = bad;
    ScriptedBroadcast pg(wire);
    std::optional<ResumePoint> point;
    absl::Status s = BroadcastResumePoint(pg, 0, &point);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << bad << ": " << s;
    EXPECT_NE(s.message().find("element 9"), std::string::npos) << s;
    EXPECT_FALSE(point.has_value());
  }
  // The group's own error passes through.
  ScriptedBroadcast short_wire(std::vector<float>(3, 0.0f));
  std::optional<ResumePoint> point;
  EXPECT_EQ(BroadcastResumePoint(short_wire, 0, &point).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace joule::worker
