#ifndef JOULE_WORKER_TRAIN_REGRESSION_LOSS_H_
#define JOULE_WORKER_TRAIN_REGRESSION_LOSS_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace joule::worker {

// Latitude weights for a grid of `rows` rows whose first and last lie at `first_degrees`
// and `last_degrees` (rows equally spaced between; one row: `first_degrees`):
//   w_j = cos(lat_j) / ((1 / rows) * sum_k cos(lat_k)),
// so that the weights average 1 over the rows. The weighting of WeatherBench (Rasp et al.
// 2020, "WeatherBench: a benchmark data set for data-driven weather forecasting", eq. 1,
// L(j)) and of FourCastNet's weighted RMSE and ACC (Pathak et al. 2022, arXiv
// 2202.11214, sec. 4.1, whose grid puts row j at 90 - 180 j / (rows - 1) degrees: the
// default [90, -90] here). Shape [rows, 1], float32, on the CPU; broadcasts over
// [..., rows, columns]. Errors: InvalidArgument for rows < 1, or for a grid whose cosines
// sum to under 1e-6 x rows (every row at a pole: no weight to normalise).
absl::StatusOr<torch::Tensor> LatitudeWeights(int64_t rows, double first_degrees,
                                              double last_degrees);

// A regression job's loss (JobSpec.loss): "mse", the mean squared error over every
// target value (torch.nn.functional.mse_loss), or "lat_weighted_mse", each squared error
// times its row's LatitudeWeights before the mean. Holds the weights on the training
// device. Copyable; const methods are thread-safe.
class RegressionLoss {
 public:
  // For `spec` (validated: loss and latitude_range) and a sample's target shape (the
  // dataset's target_shape, without the batch axis). Errors: InvalidArgument for
  // lat_weighted_mse on targets of fewer than two axes (no rows and columns), and
  // LatitudeWeights's.
  static absl::StatusOr<RegressionLoss> FromSpec(const v1::JobSpec& spec,
                                                 const std::vector<int64_t>& target_shape,
                                                 const torch::Device& device);

  // The mean (weighted) squared error of `out` against `target`, both [N, target shape]:
  // a scalar for backward.
  torch::Tensor Mean(const torch::Tensor& out, const torch::Tensor& target) const;
  // The sum of the (weighted) squared errors, float64 scalar; divided by target.numel()
  // it is Mean. For an evaluation's sums across chunks and ranks.
  torch::Tensor Sum(const torch::Tensor& out, const torch::Tensor& target) const;

  bool weighted() const { return row_weights_.defined(); }

 private:
  explicit RegressionLoss(torch::Tensor row_weights) : row_weights_(std::move(row_weights)) {}
  torch::Tensor row_weights_;  // [rows, 1]; undefined for plain mse
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_REGRESSION_LOSS_H_
