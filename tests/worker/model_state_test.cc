#include "worker/train/model_state.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <string>
#include <tuple>
#include <vector>

#include "tests/testing/run_ranks.h"
#include "tests/testing/fake_model.h"
#include "worker/comm/gloo_process_group.h"
#include "worker/comm/shm_process_group.h"

namespace joule::worker {
namespace {

using testing::FakeModel;

// Parameters w [2, 3] = 0..5 and b [2] = 6, 7; one buffer "bn.mean" [3] = 0.5.
FakeModel SmallFakeModel() {
  FakeModel m;
  m.parameters = {{"w", torch::arange(6, torch::kFloat32).reshape({2, 3}).requires_grad_(true)},
                  {"b", torch::tensor({6.0f, 7.0f}).requires_grad_(true)}};
  m.buffers = {{"bn.mean", torch::full({3}, 0.5f)}};
  return m;
}

TEST(ModelStateTest, CollectsTheModelsTensorsAsHandles) {
  FakeModel m = SmallFakeModel();
  ModelTensors t = CollectModelTensors(m);
  EXPECT_EQ(t.parameter_names, (std::vector<std::string>{"w", "b"}));
  EXPECT_EQ(t.statistic_names, (std::vector<std::string>{"bn.mean"}));
  EXPECT_EQ(t.parameter_count(), 8);
  // Writing a handle writes the model.
  torch::NoGradGuard no_grad;
  t.parameters[1].fill_(-1.0f);
  t.statistics[0].fill_(2.0f);
  EXPECT_EQ(m.parameters[1].second[0].item<float>(), -1.0f);
  EXPECT_EQ(m.buffers[0].second[2].item<float>(), 2.0f);
}

TEST(ModelStateTest, PackAndUnpackRoundTripInOrder) {
  std::vector<torch::Tensor> tensors = {torch::arange(6, torch::kFloat32).reshape({2, 3}),
                                        torch::tensor({6.0f, 7.0f}), torch::zeros({0})};
  torch::Tensor flat = torch::full({10}, -1.0f);  // longer than needed: the tail stays
  Pack(tensors, flat);
  EXPECT_TRUE(torch::equal(flat, torch::tensor({0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, -1.f, -1.f})));
  std::vector<torch::Tensor> back = {torch::zeros({2, 3}), torch::zeros({2}), torch::zeros({0})};
  Unpack(flat, back);
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(torch::equal(back[i], tensors[i])) << i;
}

TEST(ModelStateTest, SyncTensorsBroadcastsAndAverages) {
  testing::RunRanks<ShmProcessGroup>(
      3, [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 3, kv, ShmOptions{}); },
      [](int rank, ShmProcessGroup& pg) {
        const float v = static_cast<float>(rank);
        std::vector<torch::Tensor> ts = {torch::full({2, 2}, v), torch::full({3}, 10 * v)};
        ASSERT_TRUE(SyncTensors(pg, ts, /*average=*/false).ok());
        EXPECT_TRUE(torch::equal(ts[0], torch::zeros({2, 2})));
        EXPECT_TRUE(torch::equal(ts[1], torch::zeros({3})));
        ts = {torch::full({2, 2}, v), torch::full({3}, 10 * v)};
        ASSERT_TRUE(SyncTensors(pg, ts, /*average=*/true).ok());
        EXPECT_TRUE(torch::allclose(ts[0], torch::full({2, 2}, 1.0f)));   // (0 + 1 + 2) / 3
        EXPECT_TRUE(torch::allclose(ts[1], torch::full({3}, 10.0f)));
        std::vector<torch::Tensor> none;
        EXPECT_TRUE(SyncTensors(pg, none, /*average=*/true).ok());
      });
}

TEST(ModelStateTest, ParameterExchangeBroadcastsAndAveragesThroughOneBuffer) {
  testing::RunRanks<ShmProcessGroup>(
      3, [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 3, kv, ShmOptions{}); },
      [](int rank, ShmProcessGroup& pg) {
        std::vector<std::tuple<std::string, int64_t>> heard;
        ParameterExchange exchange(7, [&](const char* op, int64_t bytes, double seconds) {
          EXPECT_GE(seconds, 0.0);
          heard.emplace_back(op, bytes);
        });
        const float v = static_cast<float>(rank + 1);
        std::vector<torch::Tensor> ts = {torch::full({2, 2}, v), torch::full({3}, 2 * v)};
        ASSERT_TRUE(exchange.Broadcast(pg, ts).ok());
        EXPECT_TRUE(torch::equal(ts[0], torch::full({2, 2}, 1.0f)));
        EXPECT_TRUE(torch::equal(ts[1], torch::full({3}, 2.0f)));
        ts = {torch::full({2, 2}, v), torch::full({3}, 2 * v)};
        ASSERT_TRUE(exchange.Average(pg, ts).ok());
        // The sum times the float 1 / world: (1 + 2 + 3) x (1 / 3f), 2 (1 + 2 + 3) x (1 / 3f).
        const float third = 1.0f / 3.0f;
        EXPECT_TRUE(torch::equal(ts[0], torch::full({2, 2}, 6.0f) * third));
        EXPECT_TRUE(torch::equal(ts[1], torch::full({3}, 12.0f) * third));
        const std::vector<std::tuple<std::string, int64_t>> want = {{"broadcast", 28},
                                                                    {"average", 28}};
        EXPECT_EQ(heard, want);
      });
}

TEST(ModelStateTest, FingerprintNamesShapesAndDtypes) {
  FakeModel m = SmallFakeModel();
  EXPECT_EQ(Fingerprint(m, InputShape{1, 2, 3, 2}, 2, 10, 4),
            "world=2 input=1x2x3 classes=2 | train=10 test=4 | w:2x3:Float | b:2:Float | "
            "buffer bn.mean:3:Float");
}

TEST(ModelStateTest, FirstDifferenceNamesTheField) {
  EXPECT_EQ(FirstDifference("a | b | c", "a | b | c"), "identical");
  EXPECT_EQ(FirstDifference("a | b:2 | c", "a | b:3 | c"), "b:3 where rank 0 has b:2");
  EXPECT_EQ(FirstDifference("a | b", "a | b | c"), "c where rank 0 has (nothing)");
  EXPECT_EQ(FirstDifference("a | b | c", "a | b"), "(nothing) where rank 0 has c");
}

TEST(ModelStateTest, CheckFingerprintsNamesTheFirstRankThatDiffers) {
  EXPECT_TRUE(CheckFingerprints({}).ok());
  EXPECT_TRUE(CheckFingerprints({"x | y", "x | y", "x | y"}).ok());
  absl::Status s = CheckFingerprints({"x | y", "x | y", "x | z", "q"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "rank 2 differs from rank 0: z where rank 0 has y");
}

TEST(ModelStateTest, ParameterHashIsTheCrcOfParametersThenBuffers) {
  FakeModel m = SmallFakeModel();
  uLong want = crc32(0L, Z_NULL, 0);
  std::vector<float> bytes = {0, 1, 2, 3, 4, 5, 6, 7, 0.5f, 0.5f, 0.5f};
  want = crc32(want, reinterpret_cast<const Bytef*>(bytes.data()),
               static_cast<uInt>(bytes.size() * sizeof(float)));
  EXPECT_EQ(ParameterHash(m), static_cast<uint32_t>(want));
  // Every element of a parameter and of a buffer counts.
  const uint32_t before = ParameterHash(m);
  torch::NoGradGuard no_grad;
  m.buffers[0].second[1].fill_(0.25f);
  const uint32_t buffer_changed = ParameterHash(m);
  EXPECT_NE(buffer_changed, before);
  m.parameters[0].second[1][2].fill_(5.5f);
  EXPECT_NE(ParameterHash(m), buffer_changed);
}

TEST(ModelStateTest, HashTextIsEightLowercaseHexDigits) {
  EXPECT_EQ(HashText(0), "00000000");
  EXPECT_EQ(HashText(0xDEADBEEF), "deadbeef");
  EXPECT_EQ(HashText(0x0EADBEEF), "0eadbeef");
}

TEST(ModelStateTest, RanksCompareParameterHashes) {
  testing::RunRanks<ShmProcessGroup>(
      3,
      [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 3, kv, ShmOptions{}); },
      [](int rank, ShmProcessGroup& pg) {
        EXPECT_TRUE(CompareParameterHashes(pg, 0xDEADBEEF).ok());
        // The low and the high halves of the hash both count.
        absl::Status s = CompareParameterHashes(pg, rank == 2 ? 0xDEADBEEE : 0xDEADBEEF);
        EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
        EXPECT_NE(s.message().find("rank 0 has hash deadbeef, rank 2 has deadbeee"),
                  std::string::npos)
            << s;
        s = CompareParameterHashes(pg, rank == 1 ? 0x0EADBEEF : 0xDEADBEEF);
        EXPECT_NE(s.message().find("rank 1 has 0eadbeef"), std::string::npos) << s;
      });
}

TEST(ModelStateTest, ComparingHashesOverGlooNamesEveryRankThatDiffers) {
  testing::RunRanks<GlooProcessGroup>(
      4,
      [](int r, KvClient& kv) {
        GlooOptions o;
        o.timeout = std::chrono::seconds(30);
        return GlooProcessGroup::Create(r, 4, kv, o);
      },
      [](int rank, GlooProcessGroup& pg) {
        // Hashes whose 16-bit halves are extreme: 0, 0xFFFF, both.
        EXPECT_TRUE(CompareParameterHashes(pg, 0xFFFFFFFF).ok());
        const uint32_t mine = rank == 1 ? 0xFFFF0000 : rank == 3 ? 0x0000FFFF : 0xFFFFFFFF;
        absl::Status s = CompareParameterHashes(pg, mine);
        EXPECT_EQ(s.message(),
                  "the ranks ended training with different parameters: rank 0 has hash ffffffff, "
                  "rank 1 has ffff0000, rank 3 has 0000ffff")
            << s;
      });
}

}  // namespace
}  // namespace joule::worker
