#include "worker/train/sgd.h"

namespace joule::worker {
namespace {

// The loop of SgdStep, instantiated per case so that each variant has no branch inside
// and the compiler vectorises it. Not inlined: GCC drops the __restrict promises when it
// inlines, and then keeps the loop scalar (seen: 14% of an mlp step).
template <bool kDecay, bool kMomentum, bool kStarted>
__attribute__((noinline)) void SgdKernel(float* __restrict p, float* __restrict g,
                                         float* __restrict b, int64_t n, float lr, float m,
                                         float wd) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if constexpr (kDecay) d = d + wd * p[i];
    if constexpr (kMomentum) {
      if constexpr (kStarted) {
        d = b[i] * m + d;
      }
      b[i] = d;
    }
    p[i] = p[i] + (-lr) * d;
    g[i] = 0.0f;
  }
}

void SgdLoop(float* p, float* g, float* b, int64_t n, float lr, float m, float wd,
             bool started) {
  const bool decay = wd != 0, mom = m != 0;
  if (decay) {
    if (!mom) return SgdKernel<true, false, false>(p, g, b, n, lr, m, wd);
    if (started) return SgdKernel<true, true, true>(p, g, b, n, lr, m, wd);
    return SgdKernel<true, true, false>(p, g, b, n, lr, m, wd);
  }
  if (!mom) return SgdKernel<false, false, false>(p, g, b, n, lr, m, wd);
  if (started) return SgdKernel<false, true, true>(p, g, b, n, lr, m, wd);
  return SgdKernel<false, true, false>(p, g, b, n, lr, m, wd);
}

}  // namespace

void SgdStep(torch::Tensor& p, torch::Tensor& g, torch::Tensor& b, double lr, double momentum,
             double weight_decay, bool started) {
  if (!g.defined()) g = torch::zeros_like(p);
  const float flr = static_cast<float>(lr), fm = static_cast<float>(momentum),
              fwd = static_cast<float>(weight_decay);
  const bool use_b = momentum != 0;
  if (p.is_cpu() && p.is_contiguous() && g.is_contiguous() &&
      (!use_b || (b.is_contiguous() && b.scalar_type() == torch::kFloat32)) &&
      p.scalar_type() == torch::kFloat32 && g.scalar_type() == torch::kFloat32) {
    SgdLoop(p.data_ptr<float>(), g.data_ptr<float>(), use_b ? b.data_ptr<float>() : nullptr,
            p.numel(), flr, fm, fwd, started);
    return;
  }
  torch::Tensor d = g;
  if (weight_decay != 0) d = d.add(p, weight_decay);
  if (momentum != 0) {
    if (started) {
      b.mul_(momentum).add_(d);
    } else {
      b.copy_(d);
    }
    d = b;
  }
  p.add_(d, -lr);
  g.zero_();
}

}  // namespace joule::worker
