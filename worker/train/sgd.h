#ifndef JOULE_WORKER_TRAIN_SGD_H_
#define JOULE_WORKER_TRAIN_SGD_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>

namespace joule::worker {

// One parameter's torch.optim.SGD update (dampening 0, no Nesterov; PyTorch's rule), the
// fast path of Optimizer's sgd (optimizer.h):
//   d = g + wd p;  b = m b + d (b = d on the first step, `started` false);
//   p -= lr (m != 0 ? b : d)
// and then g = 0, ready for the next step's accumulation. `p`, `g` and `b` have the same
// shape and device, float32; `b` is untouched (and may be undefined) when m = 0. A single pass over p, g and b
// when all are contiguous float32 CPU tensors (one read-modify-write instead of four
// tensor ops), the same arithmetic in the same order as the tensor version it falls back
// to otherwise (CUDA, strided). An undefined `g` (the parameter got no gradient) counts as
// zero and is set to zeros. The caller holds a torch::NoGradGuard.
void SgdStep(torch::Tensor& p, torch::Tensor& g, torch::Tensor& b, double lr, double momentum,
             double weight_decay, bool started);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_SGD_H_
