// GPU tests (ctest label `gpu`): skip without a CUDA device. What only NCCL does (device
// buffers, device selection); the ProcessGroup contract, NCCL's included, is checked in
// process_group_test.cc (ctest worker_process_group_nccl_test).
#include "worker/comm/nccl_process_group.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "tests/testing/in_process_kv.h"
#include "tests/testing/run_ranks.h"

namespace joule::worker {
namespace {

int Devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// `world` NCCL ranks as threads, rank r on device r (NCCL wants one GPU per rank).
void RunRanks(int world, const std::function<void(int, NcclProcessGroup&)>& body) {
  testing::RunRanks<NcclProcessGroup>(
      world,
      [&](int r, KvClient& kv) {
        NcclOptions o;
        o.device = r;
        o.timeout = std::chrono::seconds(60);
        return NcclProcessGroup::Create(r, world, kv, o);
      },
      body);
}

TEST(NcclProcessGroupTest, AllreducesKnownDeviceBuffers) {
  const int devices = Devices();
  if (devices == 0) GTEST_SKIP() << "no CUDA device";
  const int world = std::min(devices, 2);
  RunRanks(world, [world](int rank, NcclProcessGroup& pg) {
    constexpr size_t kN = (size_t{1} << 20) + 3;
    std::vector<float> host(kN);
    for (size_t i = 0; i < kN; ++i) host[i] = static_cast<float>((rank + 1) * (i % 5));
    float* dev = nullptr;
    ASSERT_EQ(cudaSetDevice(pg.device()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(pg.AllreduceDevice(dev, kN, DataType::kFloat32, ReduceOp::kSum).ok());
    ASSERT_EQ(cudaMemcpy(host.data(), dev, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    const float ranks_sum = world * (world + 1) / 2.0f;
    for (size_t i = 0; i < kN; i += 4099) ASSERT_FLOAT_EQ(host[i], ranks_sum * (i % 5)) << i;
    cudaFree(dev);
    // The host interface (staged) and the other collectives.
    std::vector<float> small(10, static_cast<float>(rank));
    ASSERT_TRUE(pg.Allreduce(small, ReduceOp::kAverage).ok());
    EXPECT_FLOAT_EQ(small[9], (world - 1) / 2.0f);
    std::vector<float> b(7, static_cast<float>(rank + 5));
    ASSERT_TRUE(pg.Broadcast(b, 0).ok());
    EXPECT_EQ(b[6], 5.0f);
    std::vector<float> in(3, static_cast<float>(rank)), out(3 * world);
    ASSERT_TRUE(pg.Allgather(in, out).ok());
    EXPECT_EQ(out[3 * (world - 1)], static_cast<float>(world - 1));
    EXPECT_TRUE(pg.Barrier().ok());
  });
  if (world < 2) GTEST_SKIP() << "one GPU: the 2-rank case needs two (NCCL allows one rank per GPU)";
}

TEST(NcclProcessGroupTest, AMissingDeviceIsAClearError) {
  server::RendezvousKv kv;
  kv.OpenScope("s");
  testing::InProcessKv client(kv, "s");
  NcclOptions o;
  o.device = 1000;
  auto pg = NcclProcessGroup::Create(0, 1, client, o);
  EXPECT_EQ(pg.status().code(), absl::StatusCode::kFailedPrecondition) << pg.status();
}

}  // namespace
}  // namespace joule::worker
