#include "worker/train/attempt_context.h"

#include <algorithm>
#include <span>
#include <vector>

namespace joule::worker {

torch::Tensor ImagesTensor(ImageDataset& d) {
  if (d.file_backed()) return torch::Tensor();
  std::vector<int64_t> shape{d.size};
  if (d.sample_shape.empty()) {
    shape.insert(shape.end(), {d.channels, d.height, d.width});
  } else {
    shape.insert(shape.end(), d.sample_shape.begin(), d.sample_shape.end());
  }
  return torch::from_blob(d.images.data(), shape, torch::kFloat32);
}

torch::Tensor LabelsTensor(ImageDataset& d) {
  if (d.regression()) {
    std::vector<int64_t> shape{d.size};
    shape.insert(shape.end(), d.target_shape.begin(), d.target_shape.end());
    return torch::from_blob(d.targets.data(), shape, torch::kFloat32);
  }
  return torch::from_blob(d.labels.data(), {d.size}, torch::kLong);
}

absl::StatusOr<bool> AgreeToStop(const AttemptContext& ctx) {
  float flag = ctx.hooks.stop_requested && ctx.hooks.stop_requested() ? 1.0f : 0.0f;
  ScopedPhase comm(ctx.hooks.phases, Phase::kCommunication);
  if (absl::Status s = ctx.pg.Allreduce(std::span<float>(&flag, 1), ReduceOp::kSum); !s.ok()) {
    return s;
  }
  return flag > 0;
}

void RecordEpoch(const AttemptContext& ctx, int32_t epoch, int64_t step, int64_t samples,
                 double train_loss, double lr, const SplitEvaluation& test,
                 const SplitEvaluation& train) {
  v1::EpochRecord* h = ctx.result.add_history();
  h->set_epoch(epoch);
  h->set_step(step);
  h->set_samples(samples);
  h->set_elapsed_seconds(ctx.Elapsed());
  h->set_train_loss(train_loss);
  h->set_test_accuracy(std::max(0.0, test.accuracy));
  h->set_test_loss(test.loss);
  h->set_joules(ctx.hooks.energy_joules ? ctx.hooks.energy_joules() : 0);
  h->set_attempt(ctx.assignment.attempt());
  h->set_lr(lr);
  h->set_test_top_k_accuracy(test.top_k_accuracy);
  h->set_test_rmse(test.rmse);
  h->set_train_accuracy(train.accuracy);
  h->set_train_eval_loss(train.loss);
  h->set_train_top_k_accuracy(train.top_k_accuracy);
}

}  // namespace joule::worker
