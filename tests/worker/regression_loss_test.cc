#include "worker/train/regression_loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "tests/testing/fake_model.h"
#include "tests/testing/run_ranks.h"
#include "worker/comm/shm_process_group.h"
#include "worker/train/evaluation.h"

namespace joule::worker {
namespace {

// FourCastNet's latitude of row j on a grid of `rows` rows from the north pole to the
// south (Pathak et al. 2022, sec. 4.1): 90 - 180 j / (rows - 1) degrees; its weight
// rows x cos(lat_j) / sum_k cos(lat_k). Written out here in long double, independently of
// LatitudeWeights's linear interpolation.
long double FourCastNetWeight(int64_t j, int64_t rows) {
  auto cos_lat = [rows](int64_t k) {
    const long double lat = 90.0L - 180.0L * static_cast<long double>(k) / (rows - 1);
    return std::cos(lat * std::numbers::pi_v<long double> / 180.0L);
  };
  long double sum = 0;
  for (int64_t k = 0; k < rows; ++k) sum += cos_lat(k);
  return rows * cos_lat(j) / sum;
}

TEST(RegressionLossTest, LatitudeWeightsAreFourCastNetsOnAGlobalGrid) {
  // ERA5's 0.25 degree grid (721 rows) and FourCastNet's crop of it (720) and a coarse one.
  for (int64_t rows : {721, 720, 32, 3}) {
    absl::StatusOr<torch::Tensor> w = LatitudeWeights(rows, 90, -90);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_EQ(w->sizes(), (std::vector<int64_t>{rows, 1}));
    EXPECT_NEAR(w->sum().item<double>(), static_cast<double>(rows), 1e-3 * rows) << rows;
    const float* p = w->data_ptr<float>();
    for (int64_t j = 0; j < rows; ++j) {
      EXPECT_NEAR(p[j], static_cast<double>(FourCastNetWeight(j, rows)), 1e-5) << rows << " " << j;
      EXPECT_NEAR(p[j], p[rows - 1 - j], 1e-6) << "symmetric about the equator";
    }
    EXPECT_LT(p[0], 1e-6) << "the pole row weighs nothing";
  }
  // Three rows: poles 0, the equator carries everything (3 x 1 / 1).
  absl::StatusOr<torch::Tensor> three = LatitudeWeights(3, 90, -90);
  EXPECT_NEAR(three->data_ptr<float>()[1], 3.0, 1e-6);
}

TEST(RegressionLossTest, ARegionalGridWeighsItsOwnLatitudesAndAPoleOnlyGridIsRefused) {
  // Rows at -10, 25 and 60 degrees (south first is allowed too): w_j = 3 cos / sum cos.
  absl::StatusOr<torch::Tensor> w = LatitudeWeights(3, -10, 60);
  ASSERT_TRUE(w.ok()) << w.status();
  const double c[3] = {std::cos(-10 * std::numbers::pi / 180),
                       std::cos(25 * std::numbers::pi / 180),
                       std::cos(60 * std::numbers::pi / 180)};
  for (int j = 0; j < 3; ++j) {
    EXPECT_NEAR(w->data_ptr<float>()[j], 3 * c[j] / (c[0] + c[1] + c[2]), 1e-6) << j;
  }
  absl::StatusOr<torch::Tensor> one = LatitudeWeights(1, 45, -45);
  ASSERT_TRUE(one.ok());
  EXPECT_FLOAT_EQ(one->data_ptr<float>()[0], 1.0f);  // one row: the mean of itself
  for (auto [rows, first, last] : {std::tuple{int64_t{0}, 90.0, -90.0},
                                   {-4, 90.0, -90.0},
                                   {2, 90.0, -90.0},
                                   {1, -90.0, 0.0}}) {
    EXPECT_EQ(LatitudeWeights(rows, first, last).status().code(),
              absl::StatusCode::kInvalidArgument)
        << rows << " rows " << first << ".." << last;
  }
}

v1::JobSpec WeightedSpec() {
  v1::JobSpec s;
  s.set_loss("lat_weighted_mse");
  s.add_latitude_range(60);
  s.add_latitude_range(-30);
  return s;
}

TEST(RegressionLossTest, TheWeightedLossIsTheMeanOfEachSquaredErrorTimesItsRowsWeight) {
  torch::manual_seed(3);
  torch::Tensor out = torch::randn({5, 2, 4, 3});
  torch::Tensor target = torch::randn({5, 2, 4, 3});
  absl::StatusOr<RegressionLoss> plain =
      RegressionLoss::FromSpec(v1::JobSpec(), {2, 4, 3}, torch::Device(torch::kCPU));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->weighted());
  EXPECT_NEAR(plain->Mean(out, target).item<double>(),
              torch::nn::functional::mse_loss(out, target).item<double>(), 1e-6);

  absl::StatusOr<RegressionLoss> weighted =
      RegressionLoss::FromSpec(WeightedSpec(), {2, 4, 3}, torch::Device(torch::kCPU));
  ASSERT_TRUE(weighted.ok()) << weighted.status();
  EXPECT_TRUE(weighted->weighted());
  // By hand: rows at 60, 30, 0, -30 degrees.
  double cos_sum = 0, want = 0;
  for (int h = 0; h < 4; ++h) cos_sum += std::cos((60 - 30 * h) * std::numbers::pi / 180);
  auto o = out.accessor<float, 4>();
  auto t = target.accessor<float, 4>();
  for (int n = 0; n < 5; ++n) {
    for (int c = 0; c < 2; ++c) {
      for (int h = 0; h < 4; ++h) {
        const double w = 4 * std::cos((60 - 30 * h) * std::numbers::pi / 180) / cos_sum;
        for (int x = 0; x < 3; ++x) want += w * std::pow(o[n][c][h][x] - t[n][c][h][x], 2);
      }
    }
  }
  want /= out.numel();
  EXPECT_NEAR(weighted->Mean(out, target).item<double>(), want, 1e-5);
  EXPECT_NEAR(weighted->Sum(out, target).item<double>() / out.numel(), want, 1e-5);
  EXPECT_EQ(weighted->Sum(out, target).scalar_type(), torch::kFloat64);
  // Gradients flow through the weights' product.
  torch::Tensor leaf = out.clone().requires_grad_(true);
  weighted->Mean(leaf, target).backward();
  EXPECT_TRUE(leaf.grad().defined());

  // A target without rows and columns cannot be latitude-weighted.
  absl::StatusOr<RegressionLoss> flat =
      RegressionLoss::FromSpec(WeightedSpec(), {7}, torch::Device(torch::kCPU));
  EXPECT_EQ(flat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(flat.status().message()).find("this dataset's targets are [7]"),
            std::string::npos)
      << flat.status();
}

// Evaluate sums the weighted squared errors over every rank's strided shard: the same
// weighted MSE on one rank and on three, and its root as the RMSE.
TEST(RegressionLossTest, EvaluationGivesTheWholeSplitsWeightedMseOnEveryRank) {
  torch::manual_seed(5);
  const int64_t n = 7;
  torch::Tensor targets = torch::randn({n, 1, 4, 3});
  torch::Tensor inputs = targets + torch::randn({n, 1, 4, 3});  // the model returns its input
  absl::StatusOr<RegressionLoss> loss =
      RegressionLoss::FromSpec(WeightedSpec(), {1, 4, 3}, torch::Device(torch::kCPU));
  ASSERT_TRUE(loss.ok());
  const double want = loss->Mean(inputs, targets).item<double>();
  const double unweighted = torch::nn::functional::mse_loss(inputs, targets).item<double>();
  ASSERT_GT(std::abs(want - unweighted), 1e-3) << "the weights must matter in this example";
  for (int world : {1, 3}) {
    std::vector<EvalResult> got(world);
    testing::RunRanks<ShmProcessGroup>(
        world,
        [world](int r, KvClient& kv) {
          return ShmProcessGroup::Create(r, world, kv, ShmOptions{});
        },
        [&](int rank, ShmProcessGroup& pg) {
          testing::FakeModel model;
          model.forward = [](const torch::Tensor& x) { return x; };
          EvalOptions options;
          options.regression_loss = &*loss;
          absl::StatusOr<EvalResult> r =
              Evaluate(model, inputs, targets, pg, torch::Device(torch::kCPU), options);
          ASSERT_TRUE(r.ok()) << r.status();
          got[rank] = *r;
        });
    for (const EvalResult& r : got) {
      EXPECT_NEAR(r.loss, want, 1e-5) << "world " << world;
      EXPECT_NEAR(r.rmse, std::sqrt(want), 1e-5) << "world " << world;
      EXPECT_EQ(r.accuracy, 0);
      EXPECT_EQ(r.top_k_accuracy, -1);
    }
  }
}

}  // namespace
}  // namespace joule::worker
