#include "worker/train/evaluation.h"

#include <algorithm>
#include <span>

namespace joule::worker {

absl::StatusOr<EvalResult> Evaluate(Model& model, const torch::Tensor& images,
                                    const torch::Tensor& labels, ProcessGroup& pg,
                                    const torch::Device& device, int top_k) {
  torch::NoGradGuard no_grad;
  model.SetTraining(false);
  const int64_t n = images.size(0);
  // Rank r takes examples r, r + size, ...: none when the split is smaller than the world
  // (torch::arange refuses a start past the end); its zeros still join the allreduce.
  torch::Tensor idx = pg.rank() < n ? torch::arange(pg.rank(), n, pg.size(), torch::kLong)
                                    : torch::empty({0}, torch::kLong);
  // Summed on the device, read once: no host synchronisation per chunk.
  torch::Tensor correct =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  torch::Tensor loss_sum = torch::zeros_like(correct);
  torch::Tensor top_k_hits = torch::zeros_like(correct);
  constexpr int64_t kChunk = 1000;
  for (int64_t begin = 0; begin < idx.size(0); begin += kChunk) {
    torch::Tensor b = idx.slice(0, begin, std::min(begin + kChunk, idx.size(0)));
    torch::Tensor x = images.index_select(0, b).to(device);
    torch::Tensor y = labels.index_select(0, b).to(device);
    torch::Tensor logits = model.Forward(x);
    correct += logits.argmax(1).eq(y).sum();
    if (top_k >= 2) {
      const int64_t k = std::min<int64_t>(top_k, logits.size(1));
      top_k_hits += std::get<1>(logits.topk(k, 1)).eq(y.unsqueeze(1)).any(1).sum();
    }
    loss_sum += torch::nn::functional::cross_entropy(
        logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
  model.SetTraining(true);
  float sums[4] = {static_cast<float>(correct.item<double>()),
                   static_cast<float>(loss_sum.item<double>()),
                   static_cast<float>(idx.size(0)),
                   static_cast<float>(top_k_hits.item<double>())};
  if (absl::Status s = pg.AllreduceSum(std::span<float>(sums, 4)); !s.ok()) return s;
  EvalResult out;
  if (sums[2] > 0) {
    out.accuracy = sums[0] / sums[2];
    out.loss = sums[1] / sums[2];
  }
  if (top_k >= 2) out.top_k_accuracy = sums[2] > 0 ? sums[3] / sums[2] : 0;
  return out;
}

}  // namespace joule::worker
