#ifndef JOULE_WORKER_TRAIN_OPTIMIZER_H_
#define JOULE_WORKER_TRAIN_OPTIMIZER_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule::worker {

// The optimizers a job's `optimizer` names, each one PyTorch's update (or the paper's for
// LARS) so that a recipe written for PyTorch trains the same here. Per parameter p with
// gradient g, at learning rate lr and step t (1 on the first step):
//
// sgd (torch.optim.SGD, dampening 0):
//   d = g + wd p  (L2; with decoupled_weight_decay instead p *= 1 - lr wd first, as SGDW
//                  of Loshchilov & Hutter, arXiv 1711.05101, Algorithm 1)
//   b = d on the first step, else m b + d  (when m != 0)
//   d = d + m b with nesterov, else b  (when m != 0)
//   p -= lr d
// adamw (torch.optim.AdamW, amsgrad off):
//   p *= 1 - lr wd
//   m1 = b1 m1 + (1 - b1) g;  m2 = b2 m2 + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) m1 / (sqrt(m2) / sqrt(1 - b2^t) + eps)
// lars (You, Gitman, Ginsburg, arXiv 1708.03888, Algorithm 1, in the form of timm's
//       timm.optim.Lars with dampening 0 and trust_clip off):
//   r = eta |p| / (|g| + wd |p| + eps), or 1 when |p| = 0 or |g| = 0  (|.|: the L2 norm of
//       the whole parameter tensor, i.e. per layer)
//   d = r (g + wd p);  b = d on the first step, else m b + d;  p -= lr (m != 0 ? b : d)
//   Parameters of one dimension (biases, BatchNorm's weights) are neither adapted nor
//   decayed (r = 1, wd = 0), as LARS is usually run (the paper's and NVIDIA's setups).
//
// An undefined gradient (the parameter got none) counts as zeros. State per parameter:
// "momentum" (b, sgd and lars when m != 0; m1 for adamw) and for adamw also
// "second_moment" (m2); checkpoints keep them (checkpoint_assembly.h).
struct OptimizerOptions {
  enum class Kind { kSgd, kAdamW, kLars };
  Kind kind = Kind::kSgd;
  double momentum = 0;                  // m: sgd and lars, in [0, 1)
  double weight_decay = 0;              // wd, >= 0
  bool nesterov = false;                // sgd only, needs m > 0
  bool decoupled_weight_decay = false;  // sgd only (adamw's always is)
  double beta1 = 0.9, beta2 = 0.999;    // adamw, PyTorch's defaults
  double eps = 1e-8;                    // adamw (PyTorch's default) and lars (timm's)
  double trust_coefficient = 0.001;     // lars' eta (the paper's and timm's default)

  // The options a validated spec's optimizer gives (job_spec.h fills its defaults: a
  // field left 0 is PyTorch's default, as above).
  static OptimizerOptions FromSpec(const v1::OptimizerSpec& spec);
};

// A job's optimizer over a model's parameters. Owns its state; the parameters stay owned
// by the model (the tensors share its storage). Not thread-safe.
class Optimizer {
 public:
  // `params`: float32 leaves, any shapes, all on one device; their .grad() is read and
  // zeroed by Step(). The state starts as zeros of the same shapes and device.
  Optimizer(std::vector<torch::Tensor> params, OptimizerOptions options);

  // Updates every parameter with learning rate `lr` from its .grad(), then zeroes the
  // gradients, and counts the step. Holds its own torch::NoGradGuard.
  void Step(double lr);

  // The state tensors, slot by slot (state()[slot][parameter], in the parameters' order):
  // one slot ("momentum") for sgd and lars with m != 0 and for adamw, a second
  // ("second_moment") for adamw, none for sgd and lars without momentum. Zeros until
  // started(). Callers may copy into them (checkpoint restore, broadcast, averaging), not
  // replace them.
  std::vector<std::vector<torch::Tensor>>& state() { return state_; }
  const std::vector<std::vector<torch::Tensor>>& state() const { return state_; }
  // Every state tensor in one list, slot-major (for collectives over all of them).
  std::vector<torch::Tensor> StateTensors() const;
  static const char* SlotName(int slot) { return slot == 0 ? "momentum" : "second_moment"; }

  // Steps taken (adamw's t - 1 before a step). started(): the state holds something, i.e.
  // at least one step ran and the optimizer keeps state. A restored optimizer gets the
  // steps of the run it continues (global steps: one optimizer step each).
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  bool started() const { return steps_ > 0 && !state_.empty(); }
  const OptimizerOptions& options() const { return options_; }

 private:
  void StepSgd(torch::Tensor& p, torch::Tensor& g, size_t i, double lr);
  void StepAdamW(torch::Tensor& p, const torch::Tensor& g, size_t i, double lr);
  void StepLars(torch::Tensor& p, torch::Tensor& g, size_t i, double lr);

  std::vector<torch::Tensor> params_;
  std::vector<std::vector<torch::Tensor>> state_;
  OptimizerOptions options_;
  int64_t steps_ = 0;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_OPTIMIZER_H_
