// GPU tests (ctest label `gpu`): need a CUDA device and a CUDA-enabled LibTorch; skip
// otherwise (Debian's libtorch-dev is CPU-only).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <thread>

#include "tests/testing/in_process_kv.h"
#include "worker/comm/connect.h"
#include "worker/train/gradient_sync.h"
#include "worker/train/trainer.h"

namespace joule::worker {
namespace {

// `accumulation` micro-batches of 64 / accumulation per rank and step.
std::vector<v1::RankResult> TrainOnGpus(int world, int accumulation = 1) {
  server::RendezvousKv kv;
  kv.OpenScope("job/1/attempt/1");
  std::vector<v1::RankResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      testing::InProcessKv client(kv, "job/1/attempt/1");
      TrainHooks hooks;
      hooks.connect = [&]() -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
        ConnectOptions o;
        o.gpu = true;
        o.cuda_device = r;
        o.gloo.timeout = std::chrono::seconds(60);
        auto pg = ConnectProcessGroup(r, world, client, o);
        if (!pg.ok()) return pg.status();
        return std::shared_ptr<ProcessGroup>(*std::move(pg));
      };
      v1::Assignment a;
      a.set_job_id(1);
      a.set_attempt(1);
      a.set_rank(r);
      a.set_world_size(world);
      v1::JobSpec* s = a.mutable_spec();
      s->set_model("cnn");
      s->set_dataset("fashion-mnist");
      s->set_device_kind(v1::DEVICE_KIND_GPU);
      s->set_workers(world);
      s->set_global_batch_size(64 * world);
      s->set_local_batch_size(64 / accumulation);
      s->set_accumulation_steps(accumulation);
      s->set_epochs(1);
      s->mutable_optimizer()->set_lr(0.05);
      s->mutable_optimizer()->set_momentum(0.9);
      s->set_max_train_samples(8192);
      s->set_max_test_samples(1000);
      s->set_seed(3);
      // Fashion-MNIST's directory's parent: Debian's dataset-fashion-mnist, or where
      // JOULE_TEST_DATA_ROOT says (scripts/gpu-check.sh: the carried copy, on a GPU machine
      // without Debian's package).
      TrainerOptions options;
      if (const char* root = std::getenv("JOULE_TEST_DATA_ROOT"); root && *root) {
        options.data_root = root;
      }
      results[r] = RunTraining(a, options, hooks);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(GpuTrainerTest, RanksOnGpusLearnAndEndWithEqualParameters) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "LibTorch without CUDA or no CUDA device";
  }
  const int world = std::min<int>(2, static_cast<int>(torch::cuda::device_count()));
  std::vector<v1::RankResult> r = TrainOnGpus(world);
  for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_GT(r[0].test_accuracy(), 0.65);
  if (world < 2) GTEST_SKIP() << "one GPU: equal parameters across ranks need two";
  EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash());
}

TEST(GpuTrainerTest, GradientAccumulationOnGpus) {
  // Before, the first step failed: the loss sum was a CPU tensor, the micro-batch losses
  // CUDA ones. Two micro-batches of 32 give the gradient of one batch of 64.
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "LibTorch without CUDA or no CUDA device";
  }
  const int world = std::min<int>(2, static_cast<int>(torch::cuda::device_count()));
  std::vector<v1::RankResult> micro = TrainOnGpus(world, /*accumulation=*/2);
  for (const auto& rr : micro) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(micro[0].steps(), 8192 / (64 * world));
  EXPECT_GT(micro[0].test_accuracy(), 0.65);
  std::vector<v1::RankResult> whole = TrainOnGpus(world);
  ASSERT_TRUE(whole[0].ok()) << whole[0].error();
  EXPECT_NEAR(micro[0].test_accuracy(), whole[0].test_accuracy(), 0.02);
  if (world == 2) {
    EXPECT_EQ(micro[0].parameter_hash(), micro[1].parameter_hash());
  }
}

TEST(GpuTrainerTest, DeviceGradientSyncAveragesOnTheGpus) {
  // The NCCL implementation behind GradientSync: rank r's gradients (r + 1) (k + 1) on its
  // GPU average to (world + 1) / 2 (k + 1); a parameter without a gradient gets zeros.
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "LibTorch without CUDA or no CUDA device";
  }
  const int world = std::min<int>(2, static_cast<int>(torch::cuda::device_count()));
  server::RendezvousKv kv;
  kv.OpenScope("job/1/attempt/1");
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      testing::InProcessKv client(kv, "job/1/attempt/1");
      ConnectOptions o;
      o.gpu = true;
      o.cuda_device = r;
      auto pg = ConnectProcessGroup(r, world, client, o);
      ASSERT_TRUE(pg.ok()) << pg.status();
      absl::StatusOr<torch::Device> device = SelectTrainingDevice(v1::DEVICE_KIND_GPU, **pg);
      ASSERT_TRUE(device.ok()) << device.status();
      const auto on_gpu = torch::TensorOptions().device(*device);
      std::vector<torch::Tensor> params = {torch::zeros({3, 4}, on_gpu).requires_grad_(true),
                                           torch::zeros({5}, on_gpu).requires_grad_(true)};
      absl::StatusOr<std::unique_ptr<GradientSync>> sync = MakeDeviceGradientSync(params, **pg);
      ASSERT_TRUE(sync.ok()) << sync.status();
      EXPECT_EQ((*sync)->bytes_per_step(), (12 + 5) * 4);
      (*sync)->Prepare();
      (params[0].sum() * static_cast<float>(r + 1)).backward();
      ASSERT_TRUE((*sync)->Finish().ok());
      const float mean = (world + 1) / 2.0f;
      EXPECT_TRUE(torch::allclose(params[0].grad().cpu(), torch::full({3, 4}, mean)));
      ASSERT_TRUE(params[1].grad().defined());
      EXPECT_TRUE(torch::equal(params[1].grad().cpu(), torch::zeros({5})));
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace joule::worker
