#include "worker/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/job_spec.h"

namespace joule::worker {

LrSchedule::LrSchedule(const v1::JobSpec& spec, int64_t steps_per_epoch)
    : base_(spec.optimizer().lr()),
      target_(TargetLearningRate(spec.optimizer().lr(), spec.lr_scaling() == "linear",
                                 spec.global_batch_size())),
      warmup_epochs_(spec.lr_warmup_epochs()),
      warmup_steps_(spec.lr_warmup_epochs() * static_cast<double>(steps_per_epoch)),
      steps_per_epoch_(std::max<int64_t>(1, steps_per_epoch)),
      epochs_(spec.epochs()),
      spec_(spec.lr_schedule()) {
  const std::string& name = spec_.name();
  kind_ = name == "step"      ? Kind::kStep
          : name == "cosine"  ? Kind::kCosine
          : name == "plateau" ? Kind::kPlateau
                              : Kind::kConstant;
}

double LrSchedule::At(int64_t global_step) const {
  if (warmup_steps_ > 0 && static_cast<double>(global_step) < warmup_steps_) {
    return base_ + (target_ - base_) * (static_cast<double>(global_step) / warmup_steps_);
  }
  const int64_t epoch = global_step / steps_per_epoch_;
  switch (kind_) {
    case Kind::kConstant:
      return target_;
    case Kind::kStep: {
      const double gamma = spec_.gamma() > 0 ? spec_.gamma() : 0.1;
      return target_ * std::pow(gamma, static_cast<double>(epoch / spec_.step_epochs()));
    }
    case Kind::kCosine: {
      const double n = epochs_ - warmup_epochs_;
      if (n <= 0) return target_;
      const double t = std::clamp(static_cast<double>(epoch) - warmup_epochs_, 0.0, n);
      return spec_.min_lr() +
             (target_ - spec_.min_lr()) * (1 + std::cos(std::numbers::pi * t / n)) / 2;
    }
    case Kind::kPlateau:
      return std::max(target_ * plateau_.scale, spec_.min_lr());
  }
  return target_;
}

void LrSchedule::OnEvaluation(int32_t epoch, double test_loss) {
  if (kind_ != Kind::kPlateau) return;
  if (static_cast<double>(epoch + 1) <= warmup_epochs_) return;  // still warming up
  const double threshold = spec_.threshold() > 0 ? spec_.threshold() : 1e-4;
  // NaN compares false: a loss that is not a number is never better.
  if (test_loss < plateau_.best * (1 - threshold)) {
    plateau_.best = test_loss;
    plateau_.bad_epochs = 0;
  } else {
    ++plateau_.bad_epochs;
  }
  const int32_t patience = spec_.has_patience() ? spec_.patience() : 10;
  if (plateau_.bad_epochs > patience) {
    plateau_.scale *= spec_.factor() > 0 ? spec_.factor() : 0.1;
    plateau_.bad_epochs = 0;
  }
}

}  // namespace joule::worker
