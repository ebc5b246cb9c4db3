#include "worker/train/gradient_reducer.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <thread>

#include "tests/testing/run_ranks.h"

namespace joule::worker {
namespace {

namespace nn = torch::nn;

// Ranks are threads of one process, and LibTorch's default generator is global: model
// initialisation is serialised, and batches come from generators of their own.
std::mutex init_mu;

nn::Sequential SmallModel() {
  std::lock_guard<std::mutex> lock(init_mu);
  torch::manual_seed(7);
  return nn::Sequential(nn::Linear(20, 64), nn::ReLU(), nn::Linear(64, 32), nn::ReLU(),
                        nn::Linear(32, 5));
}

// Forward and backward of `model` on this rank's own batch (different on every rank).
void Backward(nn::Sequential& model, int rank, int seed = 0) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank + 1000 * seed);
  torch::Tensor x = torch::randn({16, 20}, gen);
  torch::Tensor y = torch::randint(0, 5, {16}, gen, torch::kLong);
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
}

void RunRanks(int world, const std::function<void(int, ProcessGroup&)>& body) {
  testing::RunGlooRanks(world, body);
}

// The reference: every gradient packed into one flat buffer, averaged after backward.
std::vector<float> FlatAverage(nn::Sequential& model, int rank, ProcessGroup& pg) {
  Backward(model, rank);
  std::vector<float> flat;
  for (const auto& p : model->parameters()) {
    torch::Tensor g = p.grad().contiguous();
    flat.insert(flat.end(), g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  }
  EXPECT_TRUE(pg.Allreduce(flat, ReduceOp::kAverage).ok());
  return flat;
}

std::vector<float> Gradients(nn::Sequential& model) {
  std::vector<float> flat;
  for (const auto& p : model->parameters()) {
    torch::Tensor g = p.grad().contiguous();
    flat.insert(flat.end(), g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  }
  return flat;
}

class GradientReducerEquality : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(GradientReducerEquality, BucketedEqualsFlatAllreduce) {
  const auto [world, bucket_bytes] = GetParam();
  RunRanks(world, [&, world = world, bucket_bytes = bucket_bytes](int rank, ProcessGroup& pg) {
    nn::Sequential flat_model = SmallModel();
    std::vector<float> expected = FlatAverage(flat_model, rank, pg);

    nn::Sequential model = SmallModel();
    GradientReducer reducer(model->parameters(), bucket_bytes, pg);
    for (int step = 0; step < 2; ++step) {  // twice: the reducer resets between steps
      for (auto& p : model->parameters()) p.mutable_grad().zero_();
      reducer.Prepare();
      Backward(model, rank);
      ASSERT_TRUE(reducer.Finish().ok());
      std::vector<float> got = Gradients(model);
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], expected[i], 1e-6f * (1 + std::abs(expected[i])))
            << "world " << world << " bucket " << bucket_bytes << " index " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    BucketSizes, GradientReducerEquality,
    ::testing::Values(std::tuple{2, int64_t{256}},            // a bucket per tensor
                      std::tuple{2, int64_t{4096}},           // several tensors per bucket
                      std::tuple{3, int64_t{2048}},           // odd world size
                      std::tuple{2, kDefaultBucketBytes}));   // one bucket (first-cap bound)

// A one-rank group that records when each allreduce is launched and finishes it at once.
class RecordingGroup final : public ProcessGroup {
 public:
  struct Done final : Work {
    absl::Status status;
    absl::Status Wait() override { return status; }
  };
  int rank() const override { return 0; }
  int size() const override { return 1; }
  using ProcessGroup::AllreduceAsync;
  std::shared_ptr<Work> AllreduceAsync(SharedBuffer data, ReduceOp, Precision wire) override {
    launches.push_back(data->size());
    wires.push_back(wire);
    agreed.push_back(false);
    auto w = std::make_shared<Done>();
    w->status = fail ? absl::AbortedError("aborted") : absl::OkStatus();
    return w;
  }
  std::shared_ptr<Work> AllreduceAgreedAsync(SharedBuffer data, ReduceOp op,
                                             Precision wire) override {
    std::shared_ptr<Work> w = AllreduceAsync(std::move(data), op, wire);
    agreed.back() = true;
    return w;
  }
  absl::Status Allreduce(std::span<float>, ReduceOp) override { return absl::OkStatus(); }
  absl::Status Broadcast(std::span<float>, int) override { return absl::OkStatus(); }
  absl::Status Allgather(std::span<const float>, std::span<float>) override {
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort() override {}
  absl::Status AllreduceHalf(std::span<Half>, ReduceOp) override { return absl::OkStatus(); }
  std::vector<size_t> launches;
  std::vector<Precision> wires;
  std::vector<bool> agreed;  // per launch: AllreduceAgreedAsync
  bool fail = false;
};

TEST(GradientReducerTest, TheFirstStepChecksEveryBucketAndLaterStepsRepeatTheCycle) {
  nn::Sequential model = SmallModel();
  RecordingGroup group;
  GradientReducer reducer(model->parameters(), 256, group);
  const size_t buckets = static_cast<size_t>(reducer.num_buckets());
  // A failed first step agrees on nothing: the next step checks again.
  group.fail = true;
  reducer.Prepare();
  Backward(model, 0);
  ASSERT_FALSE(reducer.Finish().ok());
  group.fail = false;
  for (int step = 0; step < 3; ++step) {
    reducer.Prepare();
    Backward(model, 0);
    ASSERT_TRUE(reducer.Finish().ok());
  }
  ASSERT_EQ(group.agreed.size(), 4 * buckets);
  for (size_t i = 0; i < group.agreed.size(); ++i) {
    EXPECT_EQ(group.agreed[i], i >= 2 * buckets) << "launch " << i;
    EXPECT_EQ(group.launches[i], group.launches[i % buckets]) << "launch " << i;  // the cycle
  }
}

TEST(GradientReducerTest, BucketsFollowReverseParameterOrderAndTheCaps) {
  // Sizes (floats): w0 1280, b0 64, w1 2048, b1 32, w2 160, b2 5.
  nn::Sequential model = SmallModel();
  RecordingGroup group;
  GradientReducer reducer(model->parameters(), 8192, group);
  // Reverse order b2 w2 b1 (788 B) | w1 (8192 B: would overflow the first bucket) |
  // b0 w0 (5376 B).
  ASSERT_EQ(reducer.num_buckets(), 3);
  EXPECT_EQ(reducer.bucket_parameters(0), (std::vector<size_t>{5, 4, 3}));
  EXPECT_EQ(reducer.bucket_parameters(1), (std::vector<size_t>{2}));
  EXPECT_EQ(reducer.bucket_parameters(2), (std::vector<size_t>{1, 0}));
  EXPECT_EQ(reducer.total_bytes(), (1280 + 64 + 2048 + 32 + 160 + 5) * 4);
}

TEST(GradientReducerTest, LaunchesBucketsDuringBackward) {
  nn::Sequential model = SmallModel();
  RecordingGroup group;
  GradientReducer reducer(model->parameters(), 256, group);
  // The first layer's weight gradient is among the last computed; by then the buckets of
  // the later layers must already be on their way.
  size_t launched_before_first_layer = 0;
  model->parameters()[0].register_hook([&](const torch::Tensor&) {
    launched_before_first_layer = group.launches.size();
  });
  reducer.Prepare();
  Backward(model, 0);
  EXPECT_GE(launched_before_first_layer, 4u);
  ASSERT_TRUE(reducer.Finish().ok());
  EXPECT_EQ(group.launches.size(), static_cast<size_t>(reducer.num_buckets()));
}

TEST(GradientReducerTest, Fp16CompressionAsksForHalfOnTheWire) {
  nn::Sequential model = SmallModel();
  RecordingGroup group;
  GradientReducer reducer(model->parameters(), 256, group);
  reducer.set_wire_precision(Precision::kFloat16);
  reducer.Prepare();
  Backward(model, 0);
  ASSERT_TRUE(reducer.Finish().ok());
  ASSERT_FALSE(group.wires.empty());
  for (Precision p : group.wires) EXPECT_EQ(p, Precision::kFloat16);
}

TEST(GradientReducerTest, AccumulatesDisarmedMicroBatchesAndReducesOnce) {
  nn::Sequential plain = SmallModel();
  Backward(plain, 0, 1);
  Backward(plain, 0, 2);
  std::vector<float> expected = Gradients(plain);

  nn::Sequential model = SmallModel();
  RecordingGroup group;
  GradientReducer reducer(model->parameters(), 4096, group);
  Backward(model, 0, 1);  // disarmed: only accumulates
  EXPECT_TRUE(group.launches.empty());
  reducer.Prepare();
  Backward(model, 0, 2);
  ASSERT_TRUE(reducer.Finish().ok());
  std::vector<float> got = Gradients(model);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expected[i], 1e-6f) << i;
}

TEST(GradientReducerTest, UnusedParametersCountAsZeroAndDoNotBlock) {
  nn::Sequential model = SmallModel();
  nn::Linear unused(3, 3);
  std::vector<torch::Tensor> params = model->parameters();
  for (const auto& p : unused->parameters()) params.push_back(p);
  RecordingGroup group;
  GradientReducer reducer(params, 256, group);
  reducer.Prepare();
  Backward(model, 0);
  ASSERT_TRUE(reducer.Finish().ok());
  EXPECT_EQ(group.launches.size(), static_cast<size_t>(reducer.num_buckets()));
  EXPECT_EQ(unused->weight.grad().abs().sum().item<float>(), 0.0f);
}

TEST(GradientReducerTest, AFailedBucketIsAnErrorNamingIt) {
  nn::Sequential model = SmallModel();
  RecordingGroup group;
  group.fail = true;
  GradientReducer reducer(model->parameters(), 256, group);
  reducer.Prepare();
  Backward(model, 0);
  absl::Status s = reducer.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_NE(std::string(s.message()).find("gradient bucket 0"), std::string::npos) << s;
}

}  // namespace
}  // namespace joule::worker
