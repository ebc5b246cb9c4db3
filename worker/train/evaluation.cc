#include "worker/train/evaluation.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace joule::worker {

namespace {

absl::StatusOr<EvalResult> EvaluateIndices(Model& model, int64_t n, const EvalLoader& load,
                                           int64_t chunk, ProcessGroup& pg,
                                           const torch::Device& device, const EvalOptions& options);

}  // namespace

absl::StatusOr<EvalResult> Evaluate(Model& model, const torch::Tensor& images,
                                    const torch::Tensor& labels, ProcessGroup& pg,
                                    const torch::Device& device, const EvalOptions& options) {
  auto load = [&](const std::vector<int64_t>& indices)
      -> absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> {
    torch::Tensor b = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                       {static_cast<int64_t>(indices.size())}, torch::kLong);
    return std::pair{images.index_select(0, b), labels.index_select(0, b)};
  };
  return EvaluateIndices(model, images.size(0), load, 1000, pg, device, options);
}

absl::StatusOr<EvalResult> Evaluate(Model& model, int64_t n, const EvalLoader& load, int64_t chunk,
                                    ProcessGroup& pg, const torch::Device& device,
                                    const EvalOptions& options) {
  return EvaluateIndices(model, n, load, chunk, pg, device, options);
}

namespace {

absl::StatusOr<EvalResult> EvaluateIndices(Model& model, int64_t n, const EvalLoader& load,
                                           int64_t chunk, ProcessGroup& pg,
                                           const torch::Device& device,
                                           const EvalOptions& options) {
  const int top_k = options.top_k;
  const bool local = options.local;
  torch::NoGradGuard no_grad;
  model.SetTraining(false);
  // Rank r takes examples r, r + size, ...: none when the split is smaller than the world;
  // its zeros still join the allreduce. A local shard is the rank's own, whole.
  std::vector<int64_t> idx;
  for (int64_t i = local ? 0 : pg.rank(); i < n; i += local ? 1 : pg.size()) idx.push_back(i);
  bool regression = false;
  int64_t target_values = 0;
  // Summed on the device, read once: no host synchronisation per chunk.
  torch::Tensor correct =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  torch::Tensor loss_sum = torch::zeros_like(correct);
  torch::Tensor top_k_hits = torch::zeros_like(correct);
  int64_t evaluated = 0;
  for (size_t begin = 0; begin < idx.size(); begin += static_cast<size_t>(chunk)) {
    const std::vector<int64_t> b(idx.begin() + static_cast<std::ptrdiff_t>(begin),
                                 idx.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                   begin + static_cast<size_t>(chunk), idx.size())));
    absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> batch = load(b);
    if (!batch.ok()) {
      model.SetTraining(true);
      return batch.status();
    }
    if (batch->second.size(0) == 0) continue;
    evaluated += batch->second.size(0);
    torch::Tensor x = batch->first.to(device);
    torch::Tensor y = batch->second.to(device);
    torch::Tensor logits = model.Forward(x);
    if (y.is_floating_point()) {  // a regression: squared errors, summed
      regression = true;
      target_values += y.numel();
      loss_sum += options.regression_loss != nullptr
                      ? options.regression_loss->Sum(logits, y)
                      : (logits - y).pow(2).sum().to(torch::kFloat64);
      continue;
    }
    correct += logits.argmax(1).eq(y).sum();
    if (top_k >= 2) {
      const int64_t k = std::min<int64_t>(top_k, logits.size(1));
      top_k_hits += std::get<1>(logits.topk(k, 1)).eq(y.unsqueeze(1)).any(1).sum();
    }
    loss_sum += torch::nn::functional::cross_entropy(
        logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
  model.SetTraining(true);
  float sums[6] = {static_cast<float>(correct.item<double>()),
                   static_cast<float>(loss_sum.item<double>()),
                   static_cast<float>(evaluated),
                   static_cast<float>(top_k_hits.item<double>()),
                   static_cast<float>(target_values),
                   regression ? 1.0f : 0.0f};
  if (absl::Status s = pg.AllreduceSum(std::span<float>(sums, 6)); !s.ok()) return s;
  EvalResult out;
  if (sums[5] > 0) {  // some rank evaluated a regression (one with an empty shard has none)
    out.loss = sums[4] > 0 ? sums[1] / sums[4] : 0;
    out.rmse = std::sqrt(out.loss);
    return out;
  }
  if (sums[2] > 0) {
    out.accuracy = sums[0] / sums[2];
    out.loss = sums[1] / sums[2];
  }
  if (top_k >= 2) out.top_k_accuracy = sums[2] > 0 ? sums[3] / sums[2] : 0;
  return out;
}

}  // namespace

}  // namespace joule::worker
