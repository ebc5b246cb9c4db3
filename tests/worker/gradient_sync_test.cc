#include "worker/train/gradient_sync.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/testing/run_ranks.h"
#include "worker/comm/gloo_process_group.h"
#include "worker/comm/shm_process_group.h"

namespace joule::worker {
namespace {

// Rank r's backward gives parameter k the gradient (r + 1) (k + 1) everywhere; the last
// parameter takes no part in the loss (its gradient stays undefined).
void BackwardOnRank(int rank, std::vector<torch::Tensor>& params) {
  torch::Tensor loss = torch::zeros({});
  for (size_t k = 0; k + 1 < params.size(); ++k) {
    loss = loss + params[k].sum() * static_cast<float>((rank + 1) * (k + 1));
  }
  loss.backward();
}

std::vector<torch::Tensor> Params() {
  return {torch::zeros({3, 4}).requires_grad_(true), torch::zeros({5}).requires_grad_(true),
          torch::zeros({2}).requires_grad_(true)};
}

template <typename Group>
void ExpectAveragedGradients(
    const std::function<absl::StatusOr<std::unique_ptr<Group>>(int, KvClient&)>& create,
    bool fp16) {
  constexpr int kWorld = 3;
  testing::RunRanks<Group>(kWorld, create, [&](int rank, Group& pg) {
    std::vector<torch::Tensor> params = Params();
    v1::SyncSpec spec;
    spec.set_bucket_bytes(32);  // several buckets
    spec.set_fp16_compression(fp16);
    absl::StatusOr<std::unique_ptr<GradientSync>> sync =
        MakeGradientSync(params, {}, 0, spec, pg, torch::Device(torch::kCPU), nullptr);
    ASSERT_TRUE(sync.ok()) << sync.status();
    ASSERT_NE(*sync, nullptr);
    EXPECT_EQ((*sync)->bytes_per_step(), (12 + 5 + 2) * 4);
    for (int step = 0; step < 2; ++step) {
      (*sync)->Prepare();
      BackwardOnRank(rank, params);
      ASSERT_TRUE((*sync)->Finish().ok());
      // The mean of (r + 1) over 3 ranks is 2; in half precision each third is rounded.
      for (size_t k = 0; k < params.size(); ++k) {
        const float want = k + 1 < params.size() ? 2.0f * (k + 1) : 0.0f;
        const torch::Tensor expected = torch::full_like(params[k], want);
        EXPECT_TRUE(fp16 ? torch::allclose(params[k].grad(), expected, 0, 4e-3)
                         : torch::equal(params[k].grad(), expected))
            << "rank " << rank << " parameter " << k << " step " << step << " fp16 " << fp16;
        params[k].mutable_grad().zero_();  // what the optimizer does
      }
    }
  });
}

TEST(GradientSyncTest, BucketsAverageGradientsOverEveryTransport) {
  for (bool fp16 : {false, true}) {
    ExpectAveragedGradients<ShmProcessGroup>(
        [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 3, kv, ShmOptions{}); },
        fp16);
    ExpectAveragedGradients<GlooProcessGroup>(
        [](int r, KvClient& kv) {
          GlooOptions o;
          o.timeout = std::chrono::seconds(30);
          return GlooProcessGroup::Create(r, 3, kv, o);
        },
        fp16);
  }
}

TEST(GradientSyncTest, OneRankHasNothingToAverage) {
  testing::RunRanks<ShmProcessGroup>(
      1, [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 1, kv, ShmOptions{}); },
      [](int, ShmProcessGroup& pg) {
        absl::StatusOr<std::unique_ptr<GradientSync>> sync = MakeGradientSync(
            Params(), {}, 0, v1::SyncSpec{}, pg, torch::Device(torch::kCPU), nullptr);
        ASSERT_TRUE(sync.ok()) << sync.status();
        EXPECT_EQ(*sync, nullptr);
      });
}

TEST(GradientSyncTest, DevicesNeedAnNcclGroup) {
  // A CUDA device on a host-memory group: refused up front, not at the first step.
  testing::RunRanks<ShmProcessGroup>(
      2, [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 2, kv, ShmOptions{}); },
      [](int, ShmProcessGroup& pg) {
        absl::StatusOr<std::unique_ptr<GradientSync>> direct = MakeDeviceGradientSync(Params(), pg);
        EXPECT_EQ(direct.status().code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_NE(direct.status().message().find("CUDA gradients need NCCL"), std::string::npos)
            << direct.status();
        absl::StatusOr<std::unique_ptr<GradientSync>> chosen = MakeGradientSync(
            Params(), {}, 0, v1::SyncSpec{}, pg, torch::Device(torch::kCUDA, 0), nullptr);
        EXPECT_EQ(chosen.status().code(), absl::StatusCode::kFailedPrecondition);
        // The training device.
        for (v1::DeviceKind kind : {v1::DEVICE_KIND_UNSPECIFIED, v1::DEVICE_KIND_CPU}) {
          absl::StatusOr<torch::Device> device = SelectTrainingDevice(kind, pg);
          ASSERT_TRUE(device.ok()) << device.status();
          EXPECT_TRUE(device->is_cpu());
        }
        absl::StatusOr<torch::Device> gpu = SelectTrainingDevice(v1::DEVICE_KIND_GPU, pg);
        EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition) << gpu.status();
      });
}

TEST(LocalSgdScheduleTest, WarmUpThenPeriodicAveraging) {
  v1::SyncSpec local;
  local.set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD);
  local.set_warmup_steps(6);
  local.set_period(4);
  const LocalSgdSchedule s(local, 2);
  EXPECT_TRUE(s.local());
  for (int64_t step = 0; step < 20; ++step) {
    EXPECT_EQ(s.AveragesGradients(step), step < 6) << step;
  }
  // After 10, 14, 18 updates: the local steps that end a period.
  for (int64_t done = 0; done <= 20; ++done) {
    EXPECT_EQ(s.AveragesParametersAfter(done), done == 10 || done == 14 || done == 18) << done;
  }
}

TEST(LocalSgdScheduleTest, AllreduceOneRankAndZeroPeriods) {
  v1::SyncSpec allreduce;
  v1::SyncSpec local;
  local.set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD);
  local.set_warmup_steps(2);
  // Every step averages gradients and none averages parameters: the allreduce strategy,
  // and local SGD on one rank.
  for (const LocalSgdSchedule& s : {LocalSgdSchedule(allreduce, 4), LocalSgdSchedule(local, 1)}) {
    EXPECT_FALSE(s.local());
    for (int64_t step = 0; step < 10; ++step) {
      EXPECT_TRUE(s.AveragesGradients(step));
      EXPECT_FALSE(s.AveragesParametersAfter(step));
    }
  }
  // Period 0 counts as 1: every local step averages.
  const LocalSgdSchedule every(local, 2);
  for (int64_t done = 3; done < 10; ++done) EXPECT_TRUE(every.AveragesParametersAfter(done));
  EXPECT_FALSE(every.AveragesParametersAfter(2));
}

}  // namespace
}  // namespace joule::worker
