#include "worker/train/optimizer.h"

#include <cmath>
#include <utility>

#include "worker/train/sgd.h"

namespace joule::worker {

OptimizerOptions OptimizerOptions::FromSpec(const v1::OptimizerSpec& spec) {
  OptimizerOptions o;
  o.kind = spec.name() == "adamw" ? Kind::kAdamW : spec.name() == "lars" ? Kind::kLars : Kind::kSgd;
  o.momentum = spec.momentum();
  o.weight_decay = spec.weight_decay();
  o.nesterov = spec.nesterov();
  o.decoupled_weight_decay = spec.decoupled_weight_decay();
  if (spec.beta1() != 0) o.beta1 = spec.beta1();
  if (spec.beta2() != 0) o.beta2 = spec.beta2();
  if (spec.eps() != 0) o.eps = spec.eps();
  if (spec.trust_coefficient() != 0) o.trust_coefficient = spec.trust_coefficient();
  return o;
}

Optimizer::Optimizer(std::vector<torch::Tensor> params, OptimizerOptions options)
    : params_(std::move(params)), options_(options) {
  const int slots = options_.kind == OptimizerOptions::Kind::kAdamW ? 2
                    : options_.momentum != 0                        ? 1
                                                                    : 0;
  state_.resize(slots);
  for (auto& slot : state_) {
    slot.reserve(params_.size());
    for (const auto& p : params_) slot.push_back(torch::zeros_like(p));
  }
}

std::vector<torch::Tensor> Optimizer::StateTensors() const {
  std::vector<torch::Tensor> all;
  for (const auto& slot : state_) all.insert(all.end(), slot.begin(), slot.end());
  return all;
}

void Optimizer::Step(double lr) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    torch::Tensor& g = p.mutable_grad();
    if (!g.defined()) g = torch::zeros_like(p);
    switch (options_.kind) {
      case OptimizerOptions::Kind::kSgd:
        StepSgd(p, g, i, lr);
        break;
      case OptimizerOptions::Kind::kAdamW:
        StepAdamW(p, g, i, lr);
        g.zero_();
        break;
      case OptimizerOptions::Kind::kLars:
        StepLars(p, g, i, lr);
        g.zero_();
        break;
    }
  }
  ++steps_;
}

void Optimizer::StepSgd(torch::Tensor& p, torch::Tensor& g, size_t i, double lr) {
  const OptimizerOptions& o = options_;
  const bool first = steps_ == 0;
  torch::Tensor none;
  torch::Tensor& b = state_.empty() ? none : state_[0][i];
  if (!o.nesterov && !o.decoupled_weight_decay) {
    SgdStep(p, g, b, lr, o.momentum, o.weight_decay, !first);
    return;
  }
  if (o.decoupled_weight_decay && o.weight_decay != 0) p.mul_(1 - lr * o.weight_decay);
  torch::Tensor d = g;
  if (!o.decoupled_weight_decay && o.weight_decay != 0) d = d.add(p, o.weight_decay);
  if (o.momentum != 0) {
    if (first) {
      b.copy_(d);
    } else {
      b.mul_(o.momentum).add_(d);
    }
    d = o.nesterov ? d.add(b, o.momentum) : b;
  }
  p.add_(d, -lr);
  g.zero_();
}

void Optimizer::StepAdamW(torch::Tensor& p, const torch::Tensor& g, size_t i, double lr) {
  const OptimizerOptions& o = options_;
  torch::Tensor& m1 = state_[0][i];
  torch::Tensor& m2 = state_[1][i];
  const double t = static_cast<double>(steps_ + 1);
  p.mul_(1 - lr * o.weight_decay);
  m1.lerp_(g, 1 - o.beta1);  // m1 + (1 - b1)(g - m1): PyTorch's own form
  m2.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  const double bias1 = 1 - std::pow(o.beta1, t);
  const double bias2_sqrt = std::sqrt(1 - std::pow(o.beta2, t));
  torch::Tensor denom = (m2.sqrt() / bias2_sqrt).add_(o.eps);
  p.addcdiv_(m1, denom, -lr / bias1);
}

void Optimizer::StepLars(torch::Tensor& p, torch::Tensor& g, size_t i, double lr) {
  const OptimizerOptions& o = options_;
  const bool adapted = p.dim() > 1;  // not biases and BatchNorm's weights
  const double wd = adapted ? o.weight_decay : 0.0;
  double ratio = 1;
  if (adapted) {
    const double w_norm = p.norm().item<double>();
    const double g_norm = g.norm().item<double>();
    if (w_norm > 0 && g_norm > 0) {
      ratio = o.trust_coefficient * w_norm / (g_norm + w_norm * wd + o.eps);
    }
  }
  torch::Tensor d = g;
  if (wd != 0) d = d.add(p, wd);
  d = d.mul(ratio);
  if (o.momentum != 0) {
    torch::Tensor& b = state_[0][i];
    if (steps_ == 0) {
      b.copy_(d);
    } else {
      b.mul_(o.momentum).add_(d);
    }
    d = b;
  }
  p.add_(d, -lr);
}

}  // namespace joule::worker
