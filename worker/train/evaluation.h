#ifndef JOULE_WORKER_TRAIN_EVALUATION_H_
#define JOULE_WORKER_TRAIN_EVALUATION_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/process_group.h"
#include "worker/models/models.h"
#include "worker/train/regression_loss.h"

namespace joule::worker {

struct EvalResult {
  double accuracy = 0;  // fraction of the split classified correctly, in [0, 1]
  double loss = 0;      // mean cross-entropy (natural log) per example
  // Fraction whose label is among the `top_k` largest logits (torch.topk; ties broken as
  // it breaks them), in [0, 1]; -1 when top_k < 2.
  double top_k_accuracy = -1;
  // A regression (float labels: targets): `loss` is the mean (weighted: RegressionLoss)
  // squared error over every target value, this its root; `accuracy` is 0. -1 for a
  // classification.
  double rmse = -1;
};

struct EvalOptions {
  // >= 2 also counts top-k hits; every rank must pass the same, at most the model's
  // classes (the trainer checks it before training; a larger k counts as the classes).
  int top_k = 0;
  // Every rank holds its own shard of the split (hdf5:) and evaluates all of it; the sums
  // still cover every rank's. Otherwise rank r of a world of w takes examples r, r + w, ...
  bool local = false;
  // A regression's loss (float labels): its weighted squared errors; null = plain MSE.
  // Outlives the call.
  const RegressionLoss* regression_loss = nullptr;
};

// Collective: evaluates `model` on a test split, each rank its strided shard, and sums the
// shards over ranks, so every rank returns the same result. Rank r of a world of w takes
// examples r, r + w, r + 2w, ... of `images` [N, C, H, W] float32 and `labels` [N] int64
// (host tensors; batches are copied to `device`, 1000 examples at a time); a rank past
// the last example has none and still joins the allreduce. The correct count and loss sum
// are kept on the device in float64 and travel as float32 sums. {0, 0} for an empty
// split. The model is in evaluation mode during the pass and in training mode after.
// Float `labels` [N, ...] are a regression's targets (EvalResult.rmse).
// Errors: the group's. Not thread-safe (the model and one collective on `pg`).
absl::StatusOr<EvalResult> Evaluate(Model& model, const torch::Tensor& images,
                                    const torch::Tensor& labels, ProcessGroup& pg,
                                    const torch::Device& device,
                                    const EvalOptions& options = EvalOptions{});

// The same over a split of `size` examples drawn by `load`: given this rank's indices of a
// chunk (at most `chunk` of them), the images and labels to evaluate (host tensors; may
// leave some out, e.g. a file that does not decode: the result counts those it gets).
// Errors: the group's and the loader's (then this rank leaves before the allreduce).
using EvalLoader = std::function<absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>>(
    const std::vector<int64_t>& indices)>;
absl::StatusOr<EvalResult> Evaluate(Model& model, int64_t size, const EvalLoader& load,
                                    int64_t chunk, ProcessGroup& pg, const torch::Device& device,
                                    const EvalOptions& options = EvalOptions{});

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_EVALUATION_H_
