// The learning rate of every step: the warm-up ramp, then each schedule against PyTorch's
// own (LibTorch's StepLR) or its documented closed form and algorithm (CosineAnnealingLR,
// ReduceLROnPlateau).
#include "worker/train/lr_schedule.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <numbers>

namespace joule::worker {
namespace {

v1::JobSpec Spec(double lr, bool linear, int64_t global_batch, double warmup_epochs,
                 int epochs = 100) {
  v1::JobSpec s;
  s.mutable_optimizer()->set_lr(lr);
  s.set_lr_scaling(linear ? "linear" : "none");
  s.set_global_batch_size(global_batch);
  s.set_lr_warmup_epochs(warmup_epochs);
  s.set_epochs(epochs);
  return s;
}

TEST(LrScheduleTest, LinearScalingAndWarmUp) {
  // Constant (1 step per epoch: warm-up steps = warm-up epochs).
  LrSchedule constant(Spec(0.1, false, 512, 0), 1);
  for (int64_t s : {0, 1, 1000}) EXPECT_DOUBLE_EQ(constant.At(s), 0.1);
  // Goyal et al.: base x 512 / 256, at once without a warm-up.
  LrSchedule scaled(Spec(0.1, true, 512, 0), 1);
  EXPECT_DOUBLE_EQ(scaled.At(0), 0.2);
  // Ramped from base to the target over 10 steps, then flat.
  LrSchedule ramp(Spec(0.1, true, 512, 10), 1);
  EXPECT_DOUBLE_EQ(ramp.At(0), 0.1);
  EXPECT_DOUBLE_EQ(ramp.At(5), 0.15);
  EXPECT_DOUBLE_EQ(ramp.At(10), 0.2);
  EXPECT_DOUBLE_EQ(ramp.At(11), 0.2);
  for (int64_t s = 1; s < 10; ++s) EXPECT_LT(ramp.At(s - 1), ramp.At(s)) << s;
  // A fractional warm-up (lr_warmup_epochs x steps per epoch: 0.5 x 5 = 2.5 steps).
  LrSchedule fractional(Spec(0.1, true, 256 * 3, 0.5), 5);
  EXPECT_DOUBLE_EQ(fractional.At(2), 0.1 + 0.2 * (2 / 2.5));
  EXPECT_DOUBLE_EQ(fractional.At(3), 0.3);
}

TEST(LrScheduleTest, StepDecayIsLibTorchsStepLrEpochByEpoch) {
  for (const auto& [step_epochs, gamma] :
       std::vector<std::pair<int, double>>{{1, 0.5}, {3, 0.1}, {30, 0.1}, {7, 1.0}}) {
    v1::JobSpec spec = Spec(0.4, false, 256, 0);
    spec.mutable_lr_schedule()->set_name("step");
    spec.mutable_lr_schedule()->set_step_epochs(step_epochs);
    spec.mutable_lr_schedule()->set_gamma(gamma);
    const int64_t steps_per_epoch = 7;
    LrSchedule schedule(spec, steps_per_epoch);
    // LibTorch's own: an SGD optimizer's lr once StepLR::step() has run at the start of each
    // epoch so far (LibTorch's C++ StepLR leaves the first call's rate unchanged; Python's
    // steps once in its constructor: both give base x gamma^(epoch // step_size)).
    torch::Tensor w = torch::zeros({1}, torch::requires_grad());
    torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.4));
    torch::optim::StepLR torch_step(sgd, step_epochs, gamma);
    for (int epoch = 0; epoch < 100; ++epoch) {
      torch_step.step();
      const double want = sgd.param_groups()[0].options().get_lr();
      for (int64_t k = 0; k < steps_per_epoch; ++k) {
        EXPECT_NEAR(schedule.At(epoch * steps_per_epoch + k), want, 1e-12 * want + 1e-300)
            << "step_epochs " << step_epochs << " gamma " << gamma << " epoch " << epoch;
      }
    }
  }
  // gamma 0 is PyTorch's default 0.1.
  v1::JobSpec spec = Spec(1, false, 256, 0);
  spec.mutable_lr_schedule()->set_name("step");
  spec.mutable_lr_schedule()->set_step_epochs(2);
  EXPECT_DOUBLE_EQ(LrSchedule(spec, 1).At(2), 0.1);
}

TEST(LrScheduleTest, CosineAnnealsFromTheTargetAfterTheWarmUpToMinLrAtTheLastEpoch) {
  v1::JobSpec spec = Spec(0.1, true, 512, 5, 25);  // target 0.2, 5 warm-up epochs
  spec.mutable_lr_schedule()->set_name("cosine");
  spec.mutable_lr_schedule()->set_min_lr(0.002);
  const int64_t spe = 4;
  LrSchedule cosine(spec, spe);
  EXPECT_DOUBLE_EQ(cosine.At(0), 0.1);             // the ramp's start
  EXPECT_DOUBLE_EQ(cosine.At(5 * spe), 0.2);       // the first epoch after it: t = 0
  for (int epoch = 5; epoch < 25; ++epoch) {
    // torch CosineAnnealingLR's closed form, T_max = 20 epochs, eta_min = 0.002.
    const double t = epoch - 5;
    const double want = 0.002 + (0.2 - 0.002) * (1 + std::cos(std::numbers::pi * t / 20)) / 2;
    EXPECT_NEAR(cosine.At(epoch * spe + spe - 1), want, 1e-15) << epoch;
  }
  EXPECT_NEAR(cosine.At(25 * spe), 0.002, 1e-15);  // past the last epoch: stays at min
  // No epochs after the warm-up: the target.
  v1::JobSpec all_warmup = Spec(0.1, false, 256, 3, 3);
  all_warmup.mutable_lr_schedule()->set_name("cosine");
  EXPECT_DOUBLE_EQ(LrSchedule(all_warmup, 1).At(3), 0.1);
}

// ReduceLROnPlateau's algorithm (torch/optim/lr_scheduler.py): mode min, threshold_mode
// rel, cooldown 0; is_better(a) = a < best x (1 - threshold); after num_bad_epochs >
// patience the lr becomes max(lr x factor, min_lr) and num_bad_epochs 0.
TEST(LrScheduleTest, PlateauFollowsReduceLrOnPlateauStepByStep) {
  v1::JobSpec spec = Spec(1.0, false, 256, 2, 100);  // 2 warm-up epochs, target 1
  v1::LrScheduleSpec* p = spec.mutable_lr_schedule();
  p->set_name("plateau");
  p->set_factor(0.5);
  p->set_patience(2);
  p->set_threshold(0.01);
  p->set_min_lr(0.2);
  LrSchedule schedule(spec, 1);
  ASSERT_TRUE(schedule.is_plateau());
  // Epochs 0 and 1 are the warm-up: their losses do not count.
  schedule.OnEvaluation(0, 0.1);
  schedule.OnEvaluation(1, 0.1);
  EXPECT_EQ(schedule.plateau(), PlateauState{});
  struct Case {
    double loss;
    double lr_after;
    int bad_after;
  };
  // best: inf -> 5; 4.96 is not 1% better (bad 1), 4.95 is (exactly 5 x 0.99 is not:
  // strictly below), then three bad epochs -> halve; ...
  const Case cases[] = {
      {5.0, 1.0, 0},     // best 5
      {4.96, 1.0, 1},    // not below 4.95
      {4.95, 1.0, 2},    // not strictly below 4.95
      {4.9, 1.0, 0},     // below: best 4.9
      {4.9, 1.0, 1},
      {4.9, 1.0, 2},
      {4.9, 0.5, 0},     // 3 > patience 2: halved, count reset
      {std::numeric_limits<double>::quiet_NaN(), 0.5, 1},  // NaN is never better
      {4.9, 0.5, 2},
      {4.9, 0.25, 0},    // halved again
      {4.9, 0.25, 1},
      {4.9, 0.25, 2},
      {4.9, 0.2, 0},     // 0.125 clamps at min_lr
  };
  int32_t epoch = 2;
  for (const Case& c : cases) {
    schedule.OnEvaluation(epoch++, c.loss);
    EXPECT_DOUBLE_EQ(schedule.At(epoch), c.lr_after) << "epoch " << epoch - 1;
    EXPECT_EQ(schedule.plateau().bad_epochs, c.bad_after) << "epoch " << epoch - 1;
  }
  // Its state is what a resumed attempt restores.
  LrSchedule resumed(spec, 1);
  resumed.set_plateau(schedule.plateau());
  EXPECT_DOUBLE_EQ(resumed.At(100), schedule.At(100));
  // Other schedules ignore evaluations.
  LrSchedule constant(Spec(1.0, false, 256, 0), 1);
  constant.OnEvaluation(5, 1.0);
  EXPECT_EQ(constant.plateau(), PlateauState{});
}

TEST(LrScheduleTest, PlateauDefaultsArePyTorchs) {
  v1::JobSpec spec = Spec(1.0, false, 256, 0, 100);
  spec.mutable_lr_schedule()->set_name("plateau");  // factor 0.1, patience 10, 1e-4
  LrSchedule schedule(spec, 1);
  schedule.OnEvaluation(0, 1.0);
  for (int e = 1; e <= 10; ++e) schedule.OnEvaluation(e, 0.99995);  // within 1e-4: bad
  EXPECT_DOUBLE_EQ(schedule.At(11), 1.0);  // 10 bad epochs: not more than patience yet
  schedule.OnEvaluation(11, 1.0);
  EXPECT_DOUBLE_EQ(schedule.At(12), 0.1);
}

}  // namespace
}  // namespace joule::worker
