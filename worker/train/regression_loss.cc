#include "worker/train/regression_loss.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace joule::worker {

absl::StatusOr<torch::Tensor> LatitudeWeights(int64_t rows, double first_degrees,
                                              double last_degrees) {
  if (rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a latitude grid of ", rows, " rows"));
  }
  std::vector<double> cosines(static_cast<size_t>(rows));
  double sum = 0;
  for (int64_t j = 0; j < rows; ++j) {
    const double lat = rows == 1 ? first_degrees
                                 : first_degrees + (last_degrees - first_degrees) *
                                                       static_cast<double>(j) /
                                                       static_cast<double>(rows - 1);
    // cos(+-90 degrees) is 6e-17 in double, not 0: a pole row weighs (almost) nothing.
    cosines[static_cast<size_t>(j)] = std::max(0.0, std::cos(lat * std::numbers::pi / 180));
    sum += cosines[static_cast<size_t>(j)];
  }
  if (sum < 1e-6 * static_cast<double>(rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("latitude weights: the ", rows, " rows from ", first_degrees, " to ",
                     last_degrees, " degrees all lie at a pole (their cosines sum to ", sum, ")"));
  }
  torch::Tensor w = torch::empty({rows, 1}, torch::kFloat32);
  float* p = w.data_ptr<float>();
  for (int64_t j = 0; j < rows; ++j) {
    p[j] = static_cast<float>(cosines[static_cast<size_t>(j)] * static_cast<double>(rows) / sum);
  }
  return w;
}

absl::StatusOr<RegressionLoss> RegressionLoss::FromSpec(const v1::JobSpec& spec,
                                                        const std::vector<int64_t>& target_shape,
                                                        const torch::Device& device) {
  if (spec.loss() != "lat_weighted_mse") return RegressionLoss(torch::Tensor());
  if (target_shape.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss lat_weighted_mse weights the rows of targets shaped [..., rows, columns]; "
        "this dataset's targets are [",
        absl::StrJoin(target_shape, ", "), "]"));
  }
  const double first = spec.latitude_range_size() == 2 ? spec.latitude_range(0) : 90;
  const double last = spec.latitude_range_size() == 2 ? spec.latitude_range(1) : -90;
  absl::StatusOr<torch::Tensor> w =
      LatitudeWeights(target_shape[target_shape.size() - 2], first, last);
  if (!w.ok()) return w.status();
  return RegressionLoss(w->to(device));
}

torch::Tensor RegressionLoss::Mean(const torch::Tensor& out, const torch::Tensor& target) const {
  if (!weighted()) return torch::nn::functional::mse_loss(out, target);
  return ((out - target).pow(2) * row_weights_).mean();
}

torch::Tensor RegressionLoss::Sum(const torch::Tensor& out, const torch::Tensor& target) const {
  torch::Tensor squared = (out - target).pow(2);
  if (weighted()) squared = squared * row_weights_;
  return squared.sum().to(torch::kFloat64);
}

}  // namespace joule::worker
