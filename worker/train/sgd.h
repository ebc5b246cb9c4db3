#ifndef JOULE_WORKER_TRAIN_SGD_H_
#define JOULE_WORKER_TRAIN_SGD_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "common/job_spec.h"

namespace joule::worker {

// One parameter's torch.optim.SGD update (dampening 0, no Nesterov; PyTorch's rule):
//   d = g + wd p;  b = m b + d (b = d on the first step, `started` false);
//   p -= lr (m != 0 ? b : d)
// and then g = 0, ready for the next step's accumulation. `p`, `g` and `b` have the same
// shape and device, float32; `b` is untouched when m = 0. A single pass over p, g and b
// when all are contiguous float32 CPU tensors (one read-modify-write instead of four
// tensor ops), the same arithmetic in the same order as the tensor version it falls back
// to otherwise (CUDA, strided). An undefined `g` (the parameter got no gradient) counts as
// zero and is set to zeros. The caller holds a torch::NoGradGuard.
void SgdStep(torch::Tensor& p, torch::Tensor& g, torch::Tensor& b, double lr, double momentum,
             double weight_decay, bool started);

struct SgdOptions {
  double momentum = 0;      // m above; 0 keeps no momentum buffers in use
  double weight_decay = 0;  // wd above (L2 penalty, added to the gradient)
};

// Stochastic gradient descent over a model's parameters, with PyTorch's momentum and
// weight decay (torch::optim::SGD with dampening 0 and nesterov false gives the same
// values, up to float rounding): see SgdStep. Owns the momentum buffers; the parameters
// stay owned by the model (the tensors share its storage). Not thread-safe.
class Sgd {
 public:
  // `params`: float32 leaves, any shapes, all on one device; their .grad() is read and
  // zeroed by Step(). The momentum buffers start as zeros of the same shapes and device.
  Sgd(std::vector<torch::Tensor> params, SgdOptions options);

  // Updates every parameter with learning rate `lr` from its .grad() (undefined: zero),
  // then zeroes the gradients. After the first step with momentum != 0, started().
  void Step(double lr);

  // One buffer per parameter, in the same order; zeros until started(). Callers may copy
  // into them (checkpoint restore, broadcast), but not replace them.
  std::vector<torch::Tensor>& momentum_buffers() { return buffers_; }
  const std::vector<torch::Tensor>& momentum_buffers() const { return buffers_; }
  // Whether the buffers hold a momentum: PyTorch's first step sets b = d, later ones
  // b = m b + d. Set when the buffers are restored from a checkpoint that had them.
  bool started() const { return started_; }
  void set_started(bool started) { started_ = started; }
  const SgdOptions& options() const { return options_; }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> buffers_;
  SgdOptions options_;
  bool started_ = false;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_SGD_H_
