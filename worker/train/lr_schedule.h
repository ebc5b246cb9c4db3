#ifndef JOULE_WORKER_TRAIN_LR_SCHEDULE_H_
#define JOULE_WORKER_TRAIN_LR_SCHEDULE_H_
// The learning rate of every step of a job: the linear-scaling warm-up (Goyal et al. 2017,
// "Accurate, Large Minibatch SGD"), then the job's schedule by epoch (JobSpec.lr_schedule,
// PyTorch's lr_scheduler semantics stepped once per epoch). No LibTorch: a pure function of
// the spec and the plateau state.
#include <cstdint>
#include <limits>

#include "joule/v1/job.pb.h"

namespace joule::worker {

// ReduceLROnPlateau's state (checkpoint.proto PlateauState): the scale of the target
// learning rate, the best test loss so far, the epochs since it last improved.
struct PlateauState {
  double scale = 1;
  double best = std::numeric_limits<double>::infinity();
  int32_t bad_epochs = 0;
  bool operator==(const PlateauState&) const = default;
};

// With T = spec.optimizer.lr x (global batch / 256 when lr_scaling is "linear", else 1)
// and W = lr_warmup_epochs x steps_per_epoch warm-up steps, the rate of the step that
// follows `global_step` (in epoch e = global_step / steps_per_epoch, 0-based):
//   step <  W:  lr + (T - lr) x step / W                          (the ramp, as before)
//   constant:   T
//   step:       T x gamma^floor(e / step_epochs)                  (torch StepLR)
//   cosine:     min + (T - min) x (1 + cos(pi x t / N)) / 2, t = clamp(e - w, 0, N),
//               w = lr_warmup_epochs, N = epochs - w               (torch CosineAnnealingLR,
//               closed form; T when N <= 0)
//   plateau:    max(T x scale, min_lr), scale x= factor after each evaluation that leaves
//               the loss above best x (1 - threshold) for more than `patience` epochs in a
//               row (torch ReduceLROnPlateau, mode "min", threshold_mode "rel", cooldown 0).
// The spec must be valid (NormalizeAndValidateSpec). Not thread-safe (the training
// thread's); every rank holds the same one: the evaluation it follows is allreduced.
class LrSchedule {
 public:
  LrSchedule(const v1::JobSpec& spec, int64_t steps_per_epoch);

  double At(int64_t global_step) const;
  // The test loss after 0-based epoch `epoch`: a plateau schedule's step (epochs of the
  // warm-up do not count). A loss that is not a number never improves.
  void OnEvaluation(int32_t epoch, double test_loss);

  const PlateauState& plateau() const { return plateau_; }
  void set_plateau(const PlateauState& state) { plateau_ = state; }
  bool is_plateau() const { return kind_ == Kind::kPlateau; }

 private:
  enum class Kind { kConstant, kStep, kCosine, kPlateau };
  Kind kind_ = Kind::kConstant;
  double base_, target_;
  double warmup_epochs_, warmup_steps_;
  int64_t steps_per_epoch_;
  int32_t epochs_;
  v1::LrScheduleSpec spec_;
  PlateauState plateau_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_LR_SCHEDULE_H_
