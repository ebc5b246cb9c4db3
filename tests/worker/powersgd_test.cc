#include "worker/train/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/run_ranks.h"
#include "worker/comm/shm_process_group.h"

namespace joule::worker {
namespace {

enum class Transport { kGloo, kShm };

const char* TransportName(Transport t) { return t == Transport::kGloo ? "gloo" : "shm"; }

// `body(rank, group)` on `world` ranks (threads) over the transport.
void RunRanks(Transport t, int world, const std::function<void(int, ProcessGroup&)>& body) {
  if (t == Transport::kShm) {
    testing::RunRanks<ShmProcessGroup>(
        world,
        [&](int r, KvClient& kv) { return ShmProcessGroup::Create(r, world, kv, ShmOptions{}); },
        [&](int r, ShmProcessGroup& pg) { body(r, pg); });
    return;
  }
  testing::RunGlooRanks(world, body);
}

torch::Tensor Randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(shape, gen);
}

// A rows x columns matrix of rank `r` (a product of seeded normal factors).
torch::Tensor LowRank(int64_t rows, int64_t columns, int64_t r, uint64_t seed) {
  return torch::mm(Randn({rows, r}, seed), Randn({r, columns}, seed + 1));
}

double RelativeError(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).norm().item<double>() / want.norm().item<double>();
}

TEST(PowerSgdTest, OrthogonalisedColumnsAreOrthonormalAndAZeroColumnStaysZero) {
  for (int64_t rank : {1, 2, 4}) {
    torch::Tensor m = Randn({50, rank}, 3);
    OrthogonaliseColumns(m);
    EXPECT_TRUE(torch::allclose(torch::mm(m.t(), m), torch::eye(rank), 0, 1e-5)) << rank;
  }
  torch::Tensor z = Randn({20, 3}, 4);
  z.narrow(1, 0, 1).zero_();
  OrthogonaliseColumns(z);
  EXPECT_FALSE(torch::isnan(z).any().item<bool>());
  EXPECT_EQ(z.narrow(1, 0, 1).abs().sum().item<float>(), 0.0f);
  EXPECT_NEAR(z.narrow(1, 1, 1).norm().item<double>(), 1.0, 1e-5);
  EXPECT_NEAR(torch::dot(z.select(1, 1), z.select(1, 2)).item<double>(), 0.0, 1e-5);
}

TEST(PowerSgdTest, ARankRGradientComesBackExactlyAndSmallTensorsAreAveragedExactly) {
  // Every rank's weight gradient is the same rank-2 matrix (a conv-shaped 4-D tensor and a
  // plain matrix); rank-2 PowerSGD must return it up to float rounding. The bias and a
  // 3 x 3 matrix (too small to compress) differ by rank and come back as their mean.
  for (Transport t : {Transport::kGloo, Transport::kShm}) {
    for (int world : {2, 3}) {
      RunRanks(t, world, [&](int rank, ProcessGroup& pg) {
        std::vector<torch::Tensor> params = {torch::zeros({32, 3, 5, 5}).requires_grad_(true),
                                             torch::zeros({64, 40}).requires_grad_(true),
                                             torch::zeros({40}).requires_grad_(true),
                                             torch::zeros({3, 3}).requires_grad_(true)};
        GroupFlatAverager averager(pg);
        PowerSgdCompressor c(params, {"conv", "fc", "bias", "small"}, 2, 0, averager);
        EXPECT_EQ(c.compressed_count(), 2);
        EXPECT_EQ(c.floats_per_step(), 40 + 9 + (32 + 64) * 2 + (75 + 40) * 2);
        const torch::Tensor conv = LowRank(32, 75, 2, 10).view({32, 3, 5, 5});
        const torch::Tensor fc = LowRank(64, 40, 2, 20);
        for (int step = 0; step < 3; ++step) {
          params[0].mutable_grad() = conv.clone();
          params[1].mutable_grad() = fc.clone();
          params[2].mutable_grad() = torch::full({40}, static_cast<float>(rank));
          params[3].mutable_grad() = torch::full({3, 3}, static_cast<float>(2 * rank));
          ASSERT_TRUE(c.Reduce().ok());
          const std::string what =
              absl::StrCat(TransportName(t), " world ", world, " rank ", rank, " step ", step);
          EXPECT_LT(RelativeError(params[0].grad(), conv), 1e-5) << what;
          EXPECT_LT(RelativeError(params[1].grad(), fc), 1e-5) << what;
          EXPECT_TRUE(torch::allclose(params[2].grad(), torch::full({40}, (world - 1) / 2.0f)))
              << what;
          EXPECT_TRUE(torch::allclose(params[3].grad(), torch::full({3, 3}, world - 1.0f))) << what;
        }
      });
    }
  }
}

TEST(PowerSgdTest, ErrorFeedbackMakesTheCompressedSumConvergeToTheTrueOne) {
  // A fixed full-rank gradient per rank, rank 1: one step's approximation misses most of
  // the mean gradient, but the error each rank carries over adds back what was missed, so
  // the mean of the applied gradients over T steps tends to the true mean (the error
  // stays bounded: sum of applied = T x mean - mean error).
  RunRanks(Transport::kGloo, 2, [&](int rank, ProcessGroup& pg) {
    std::vector<torch::Tensor> params = {torch::zeros({30, 20}).requires_grad_(true)};
    GroupFlatAverager averager(pg);
    PowerSgdCompressor c(params, {"w"}, 1, 5, averager);
    const torch::Tensor mine = Randn({30, 20}, 100 + rank);
    const torch::Tensor mean = (Randn({30, 20}, 100) + Randn({30, 20}, 101)) / 2;
    // What rank 1 alone keeps of the mean: its best rank-1 approximation (SVD).
    auto [u, s, vh] = torch::linalg_svd(mean, false);
    const torch::Tensor best1 = s[0].item<float>() * torch::outer(u.select(1, 0), vh[0]);
    const double truncation = RelativeError(best1, mean);
    EXPECT_GT(truncation, 0.5);
    torch::Tensor sum = torch::zeros({30, 20});
    std::vector<double> errors;
    for (int step = 1; step <= 400; ++step) {
      params[0].mutable_grad() = mine.clone();
      ASSERT_TRUE(c.Reduce().ok());
      sum += params[0].grad();
      if (step == 1) errors.push_back(RelativeError(sum, mean));
      if (step % 100 == 0) errors.push_back(RelativeError(sum / step, mean));
    }
    // One step alone is lossy (the compression is real), as a rank-1 approximation must be.
    EXPECT_GT(errors.front(), 0.5);
    for (size_t i = 1; i < errors.size(); ++i) EXPECT_LT(errors[i], errors[i - 1]) << i;
    EXPECT_LT(errors.back(), 0.05);  // from over 0.5: the error decays as 1 / T
  });
}

TEST(PowerSgdTest, RestoredStateContinuesBitForBitAndAMisfitStartsAfresh) {
  // Run 5 steps, gather the state (every rank's error feedback, the common Q), restore it
  // into new compressors and run 5 more: the same gradients as 10 uninterrupted steps.
  for (Transport t : {Transport::kGloo, Transport::kShm}) {
    RunRanks(t, 3, [&](int rank, ProcessGroup& pg) {
      auto make_params = [] {
        return std::vector<torch::Tensor>{torch::zeros({24, 16}).requires_grad_(true),
                                          torch::zeros({16}).requires_grad_(true)};
      };
      auto gradients = [&](std::vector<torch::Tensor>& params, int step) {
        params[0].mutable_grad() = Randn({24, 16}, 1000 * step + rank);
        params[1].mutable_grad() = Randn({16}, 1000 * step + rank + 500);
      };
      std::vector<torch::Tensor> through = make_params(), first = make_params(),
                                 second = make_params();
      GroupFlatAverager a1(pg), a2(pg), a3(pg);
      PowerSgdCompressor uninterrupted(through, {"w", "b"}, 2, 9, a1);
      PowerSgdCompressor before(first, {"w", "b"}, 2, 9, a2);
      PowerSgdCompressor after(second, {"w", "b"}, 2, 9, a3);
      v1::PowerSgdState state;
      ASSERT_TRUE(before.GatherState(0, &state).ok());
      EXPECT_EQ(state.world_size(), 0) << "no state before a step";
      for (int step = 0; step < 10; ++step) {
        gradients(through, step);
        ASSERT_TRUE(uninterrupted.Reduce().ok());
        PowerSgdCompressor& c = step < 5 ? before : after;
        std::vector<torch::Tensor>& p = step < 5 ? first : second;
        if (step == 5) {
          ASSERT_TRUE(before.GatherState(0, &state).ok());
          if (rank == 0) {
            EXPECT_EQ(state.world_size(), 3);
            EXPECT_EQ(state.q_size(), 1);
            EXPECT_EQ(state.error_size(), 3);
          }
          ASSERT_TRUE(after.RestoreState(0, rank == 0 ? &state : nullptr).ok());
          EXPECT_TRUE(after.started());
        }
        gradients(p, step);
        ASSERT_TRUE(c.Reduce().ok());
        for (size_t k = 0; k < p.size(); ++k) {
          EXPECT_TRUE(torch::equal(p[k].grad(), through[k].grad()))
              << TransportName(t) << " rank " << rank << " step " << step << " tensor " << k;
        }
      }
      // A state of another rank R, world size or shape is not restored, on any rank.
      GroupFlatAverager a4(pg);
      std::vector<torch::Tensor> other = make_params();
      PowerSgdCompressor fresh(other, {"w", "b"}, 2, 9, a4);
      for (int misfit = 0; misfit < 4; ++misfit) {
        v1::PowerSgdState bad = state;  // rank 0's is the whole state; the others' empty
        if (rank == 0 && misfit == 0) bad.set_matrix_rank(3);
        if (rank == 0 && misfit == 1) bad.set_world_size(2);
        if (rank == 0 && misfit == 2) bad.mutable_q(0)->set_name("v");
        if (rank == 0 && misfit == 3) bad.mutable_error(2)->mutable_values()->RemoveLast();
        ASSERT_TRUE(fresh.RestoreState(0, rank == 0 ? &bad : nullptr).ok());
        EXPECT_FALSE(fresh.started()) << misfit;
      }
    });
  }
}

}  // namespace
}  // namespace joule::worker
