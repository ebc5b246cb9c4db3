#include "worker/train/optimizer.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "worker/train/sgd.h"

namespace joule::worker {
namespace {

// LibTorch's state of parameter `p` in `optimizer`. Its key is the parameter's TensorImpl:
// printed as a string up to LibTorch 1.13 (Debian 12's), the pointer itself since 2.x.
// (A template, so that the branch of the other LibTorch is discarded, not compiled.)
template <typename Optimizer>
torch::optim::OptimizerParamState& StateOf(Optimizer& optimizer, const torch::Tensor& p) {
  auto& state = optimizer.state();
  using Key = std::decay_t<decltype(state.begin()->first)>;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return *state.at(key.str());
  } else {
    return *state.at(p.unsafeGetTensorImpl());
  }
}

OptimizerOptions Sgd(double momentum, double weight_decay) {
  OptimizerOptions o;
  o.momentum = momentum;
  o.weight_decay = weight_decay;
  return o;
}

struct Case {
  double momentum;
  double weight_decay;
  bool strided_gradient;  // a non-contiguous gradient takes the tensor fallback path
  bool nesterov = false;  // the tensor path always
  std::string Name() const {
    return absl::StrCat("momentum ", momentum, " weight_decay ", weight_decay,
                        strided_gradient ? " strided" : " contiguous",
                        nesterov ? " nesterov" : "");
  }
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (double m : {0.0, 0.9}) {
    for (double wd : {0.0, 1e-2}) {
      for (bool strided : {false, true}) {
        cases.push_back({m, wd, strided});
        if (m != 0) cases.push_back({m, wd, strided, /*nesterov=*/true});
      }
    }
  }
  return cases;
}

// A [7, 5] gradient drawn from the current RNG, contiguous or a transposed view.
torch::Tensor Gradient(bool strided) {
  return strided ? torch::randn({5, 7}).t() : torch::randn({7, 5});
}

void ExpectClose(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  EXPECT_TRUE(torch::allclose(a, b, /*rtol=*/1e-6, /*atol=*/1e-7))
      << what << ": max difference " << (a - b).abs().max().item<double>();
}

TEST(OptimizerSgdTest, FollowsTorchOptimSgd) {
  // Momentum, weight decay, the first step (b = d) and later ones (b = m b + d), on the
  // single-pass kernel and on the tensor fallback, against LibTorch's own optimizer.
  for (const Case& c : AllCases()) {
    torch::manual_seed(7);
    const torch::Tensor init = torch::randn({7, 5});
    torch::Tensor ours = init.clone().requires_grad_(true);
    torch::Tensor theirs = init.clone().requires_grad_(true);
    OptimizerOptions options = Sgd(c.momentum, c.weight_decay);
    options.nesterov = c.nesterov;
    Optimizer sgd({ours}, options);
    torch::optim::SGD reference({theirs}, torch::optim::SGDOptions(0.1)
                                              .momentum(c.momentum)
                                              .weight_decay(c.weight_decay)
                                              .nesterov(c.nesterov));
    for (int step = 0; step < 6; ++step) {
      const double lr = 0.1 / (step + 1);  // the schedule changes the rate between steps
      for (auto& group : reference.param_groups()) {
        static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
      }
      torch::Tensor g = Gradient(c.strided_gradient);
      ours.mutable_grad() = g.clone();  // keeps the strides
      ASSERT_EQ(ours.grad().is_contiguous(), !c.strided_gradient);
      theirs.mutable_grad() = g.clone();
      sgd.Step(lr);
      reference.step();
      ExpectClose(ours.detach(), theirs.detach(), absl::StrCat(c.Name(), " step ", step));
      EXPECT_TRUE(ours.grad().eq(0).all().item<bool>()) << c.Name() << ": gradient not cleared";
      EXPECT_EQ(sgd.started(), c.momentum != 0) << c.Name();
    }
  }
}

TEST(OptimizerSgdTest, TheFirstStepIgnoresWhateverTheBuffersHold) {
  // PyTorch's first step sets b = d; a buffer holding anything must not leak into it.
  for (double wd : {0.0, 1e-2}) {
    torch::manual_seed(3);
    const torch::Tensor init = torch::randn({4, 3});
    const torch::Tensor g = torch::randn({4, 3});
    torch::Tensor ours = init.clone().requires_grad_(true);
    torch::Tensor theirs = init.clone().requires_grad_(true);
    Optimizer sgd({ours}, Sgd(0.9, wd));
    sgd.state()[0][0].fill_(1000.0f);
    torch::optim::SGD reference({theirs},
                                torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(wd));
    ours.mutable_grad() = g.clone();
    theirs.mutable_grad() = g.clone();
    sgd.Step(0.05);
    reference.step();
    ExpectClose(ours.detach(), theirs.detach(), absl::StrCat("weight_decay ", wd));
    // b = d = g + wd p
    ExpectClose(sgd.state()[0][0], g + wd * init, "buffer after the first step");
  }
}

TEST(OptimizerSgdTest, AMissingGradientCountsAsZero) {
  // A parameter that got no gradient still decays and coasts on its momentum, as if its
  // gradient were zeros (torch::optim::SGD would skip it: here it is given zeros).
  torch::manual_seed(5);
  const torch::Tensor init = torch::randn({6});
  torch::Tensor ours = init.clone().requires_grad_(true);
  torch::Tensor theirs = init.clone().requires_grad_(true);
  Optimizer sgd({ours}, Sgd(0.9, 1e-2));
  torch::optim::SGD reference({theirs},
                              torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-2));
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor g = torch::randn({6});
    ours.mutable_grad() = step == 1 ? torch::Tensor() : g.clone();
    theirs.mutable_grad() = step == 1 ? torch::zeros({6}) : g.clone();
    sgd.Step(0.1);
    reference.step();
    ExpectClose(ours.detach(), theirs.detach(), absl::StrCat("step ", step));
    ASSERT_TRUE(ours.grad().defined());
    EXPECT_TRUE(ours.grad().eq(0).all().item<bool>());
  }
}

TEST(OptimizerSgdTest, RestoredBuffersContinueTheTrajectoryExactly) {
  // What a resumed attempt does: copy parameters and buffers into a fresh optimizer and
  // mark it started. The continuation is bit-identical to the uninterrupted run.
  torch::manual_seed(11);
  const torch::Tensor init = torch::randn({8, 3});
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(torch::randn({8, 3}));
  torch::Tensor whole = init.clone().requires_grad_(true);
  Optimizer uninterrupted({whole}, Sgd(0.9, 1e-3));
  torch::Tensor first = init.clone().requires_grad_(true);
  Optimizer before({first}, Sgd(0.9, 1e-3));
  for (int i = 0; i < 6; ++i) {
    whole.mutable_grad() = grads[i].clone();
    uninterrupted.Step(0.05);
    if (i < 3) {
      first.mutable_grad() = grads[i].clone();
      before.Step(0.05);
    }
  }
  torch::Tensor resumed = first.detach().clone().requires_grad_(true);
  Optimizer after({resumed}, Sgd(0.9, 1e-3));
  after.state()[0][0].copy_(before.state()[0][0]);
  after.set_steps(before.steps());
  for (int i = 3; i < 6; ++i) {
    resumed.mutable_grad() = grads[i].clone();
    after.Step(0.05);
  }
  EXPECT_TRUE(torch::equal(resumed.detach(), whole.detach()));
  EXPECT_TRUE(torch::equal(after.state()[0][0], uninterrupted.state()[0][0]));
}

TEST(OptimizerSgdTest, WithoutMomentumTheBuffersStayUnused) {
  torch::Tensor p = torch::ones({3}).requires_grad_(true);
  Optimizer sgd({p}, Sgd(0.0, 0.0));
  p.mutable_grad() = torch::full({3}, 2.0f);
  sgd.Step(0.5);
  EXPECT_FALSE(sgd.started());
  EXPECT_TRUE(torch::equal(p.detach(), torch::zeros({3})));  // 1 - 0.5 x 2
  EXPECT_TRUE(sgd.state().empty());  // no momentum buffers kept at all
}

TEST(OptimizerSgdTest, DecoupledWeightDecayShrinksThenSteps) {
  // SGDW (Loshchilov & Hutter, Algorithm 1): p *= 1 - lr wd, then the SGD step on the
  // gradient alone, here against the closed form computed in double.
  for (double m : {0.0, 0.9}) {
    torch::manual_seed(13);
    const torch::Tensor init = torch::randn({5, 4});
    torch::Tensor ours = init.clone().requires_grad_(true);
    OptimizerOptions o = Sgd(m, 0.05);
    o.decoupled_weight_decay = true;
    Optimizer sgd({ours}, o);
    torch::Tensor p = init.to(torch::kFloat64), b = torch::zeros_like(p);
    for (int step = 0; step < 5; ++step) {
      const double lr = 0.2 / (step + 1);
      const torch::Tensor g = torch::randn({5, 4});
      ours.mutable_grad() = g.clone();
      sgd.Step(lr);
      p = p * (1 - lr * 0.05);
      torch::Tensor d = g.to(torch::kFloat64);
      if (m != 0) {
        b = step == 0 ? d : b * m + d;
        d = b;
      }
      p = p - lr * d;
      ExpectClose(ours.detach(), p.to(torch::kFloat32), absl::StrCat("m ", m, " step ", step));
    }
  }
}

TEST(OptimizerAdamWTest, FollowsTorchOptimAdamW) {
  // Betas, eps, decoupled weight decay, bias correction over steps, a rate that changes
  // between steps and a parameter with no gradient on one step (zeros: LibTorch would
  // skip it, so it gets zeros), against LibTorch's own AdamW.
  struct AdamCase {
    double beta1, beta2, eps, wd;
  };
  for (const AdamCase& c : {AdamCase{0.9, 0.999, 1e-8, 0.0}, AdamCase{0.9, 0.999, 1e-8, 0.05},
                            AdamCase{0.8, 0.95, 1e-6, 0.1}}) {
    torch::manual_seed(17);
    const torch::Tensor init_w = torch::randn({6, 3}), init_b = torch::randn({6});
    std::vector<torch::Tensor> ours = {init_w.clone().requires_grad_(true),
                                       init_b.clone().requires_grad_(true)};
    std::vector<torch::Tensor> theirs = {init_w.clone().requires_grad_(true),
                                         init_b.clone().requires_grad_(true)};
    OptimizerOptions o;
    o.kind = OptimizerOptions::Kind::kAdamW;
    o.beta1 = c.beta1;
    o.beta2 = c.beta2;
    o.eps = c.eps;
    o.weight_decay = c.wd;
    Optimizer adamw(ours, o);
    torch::optim::AdamW reference(theirs, torch::optim::AdamWOptions(1e-2)
                                              .betas({c.beta1, c.beta2})
                                              .eps(c.eps)
                                              .weight_decay(c.wd));
    const std::string name = absl::StrCat("betas ", c.beta1, ",", c.beta2, " eps ", c.eps,
                                          " wd ", c.wd);
    for (int step = 0; step < 8; ++step) {
      const double lr = 1e-2 * (step + 1) / 8;  // a warm-up
      for (auto& group : reference.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      }
      for (size_t i = 0; i < ours.size(); ++i) {
        const torch::Tensor g = torch::randn(ours[i].sizes());
        const bool missing = i == 1 && step == 3;
        ours[i].mutable_grad() = missing ? torch::Tensor() : g.clone();
        theirs[i].mutable_grad() = missing ? torch::zeros_like(g) : g.clone();
      }
      adamw.Step(lr);
      reference.step();
      for (size_t i = 0; i < ours.size(); ++i) {
        EXPECT_TRUE(torch::allclose(ours[i].detach(), theirs[i].detach(), 1e-5, 1e-6))
            << name << " step " << step << " parameter " << i << ": max difference "
            << (ours[i] - theirs[i]).abs().max().item<double>();
        EXPECT_TRUE(ours[i].grad().eq(0).all().item<bool>());
      }
    }
    ASSERT_EQ(adamw.state().size(), 2u);
    EXPECT_EQ(adamw.steps(), 8);
    EXPECT_TRUE(adamw.started());
    // LibTorch's moments, by its own state keys.
    auto& state = static_cast<torch::optim::AdamWParamState&>(StateOf(reference, theirs[0]));
    EXPECT_TRUE(torch::allclose(adamw.state()[0][0], state.exp_avg(), 1e-5, 1e-7)) << name;
    EXPECT_TRUE(torch::allclose(adamw.state()[1][0], state.exp_avg_sq(), 1e-5, 1e-9)) << name;
  }
}

// LARS in double precision, straight from the paper's Algorithm 1 with timm's form of the
// trust ratio (eps in the denominator, 1 for a zero norm), for one parameter tensor.
struct LarsReference {
  double eta, wd, m, eps;
  torch::Tensor p, b;
  int steps = 0;
  void Step(const torch::Tensor& g32, double lr) {
    const torch::Tensor g = g32.to(torch::kFloat64);
    // One-dimensional parameters (biases, norms) are neither adapted nor decayed.
    const bool adapted = p.dim() > 1;
    const double w = adapted ? wd : 0.0;
    const double w_norm = p.norm().item<double>(), g_norm = g.norm().item<double>();
    const double ratio = (adapted && w_norm > 0 && g_norm > 0)
                             ? eta * w_norm / (g_norm + w * w_norm + eps)
                             : 1.0;
    torch::Tensor d = (g + w * p) * ratio;
    if (m != 0) {
      b = steps == 0 ? d : m * b + d;
      d = b;
    }
    p = p - lr * d;
    ++steps;
  }
};

TEST(OptimizerLarsTest, FollowsTheLayerwiseTrustRatio) {
  // A weight matrix, a bias (not adapted), an all-zero matrix (ratio 1) and a matrix
  // whose gradient is zero on a step (ratio 1 there); with and without momentum and
  // weight decay.
  for (double m : {0.0, 0.9}) {
    for (double wd : {0.0, 5e-4}) {
      torch::manual_seed(19);
      const std::vector<torch::Tensor> inits = {torch::randn({8, 4}), torch::randn({8}),
                                                torch::zeros({3, 2}), torch::randn({2, 5})};
      std::vector<torch::Tensor> ours;
      std::vector<LarsReference> refs;
      for (const auto& t : inits) {
        ours.push_back(t.clone().requires_grad_(true));
        refs.push_back({0.02, wd, m, 1e-8, t.to(torch::kFloat64), torch::Tensor()});
      }
      OptimizerOptions o;
      o.kind = OptimizerOptions::Kind::kLars;
      o.momentum = m;
      o.weight_decay = wd;
      o.trust_coefficient = 0.02;
      Optimizer lars(ours, o);
      EXPECT_EQ(lars.state().size(), m != 0 ? 1u : 0u);
      for (int step = 0; step < 5; ++step) {
        const double lr = 2.0 / (step + 1);
        for (size_t i = 0; i < ours.size(); ++i) {
          const torch::Tensor g =
              (i == 3 && step == 2) ? torch::zeros(ours[i].sizes()) : torch::randn(ours[i].sizes());
          ours[i].mutable_grad() = g.clone();
          refs[i].Step(g, lr);
        }
        lars.Step(lr);
        for (size_t i = 0; i < ours.size(); ++i) {
          ExpectClose(ours[i].detach(), refs[i].p.to(torch::kFloat32),
                      absl::StrCat("m ", m, " wd ", wd, " step ", step, " parameter ", i));
        }
      }
    }
  }
}

TEST(OptimizerLarsTest, TheTrustRatioMakesTheStepScaleFree) {
  // The point of LARS: a layer's step is eta |p| lr / (|g| + ...), whatever the gradient's
  // scale. Scaling the gradient by 1000 leaves the update (without weight decay) alone.
  for (double scale : {1e-3, 1.0, 1e3}) {
    torch::manual_seed(23);
    const torch::Tensor init = torch::randn({16, 16});
    const torch::Tensor g = torch::randn({16, 16});
    torch::Tensor p = init.clone().requires_grad_(true);
    OptimizerOptions o;
    o.kind = OptimizerOptions::Kind::kLars;
    Optimizer lars({p}, o);
    p.mutable_grad() = g * scale;
    lars.Step(1.0);
    const double moved = (p.detach() - init).norm().item<double>();
    EXPECT_NEAR(moved, 0.001 * init.norm().item<double>(), 1e-6) << "scale " << scale;
  }
}

TEST(OptimizerAdamWTest, RestoredStateAndStepsContinueTheTrajectoryExactly) {
  // A resumed attempt copies both moments and sets the steps (its global step): the bias
  // correction goes on where it was, bit-identical to the uninterrupted run. Without the
  // steps (a fresh bias correction) it would not be.
  torch::manual_seed(29);
  const torch::Tensor init = torch::randn({5, 5});
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(torch::randn({5, 5}));
  OptimizerOptions o;
  o.kind = OptimizerOptions::Kind::kAdamW;
  o.weight_decay = 0.01;
  torch::Tensor whole = init.clone().requires_grad_(true);
  Optimizer uninterrupted({whole}, o);
  torch::Tensor first = init.clone().requires_grad_(true);
  Optimizer before({first}, o);
  for (int i = 0; i < 6; ++i) {
    whole.mutable_grad() = grads[i].clone();
    uninterrupted.Step(1e-2);
    if (i < 3) {
      first.mutable_grad() = grads[i].clone();
      before.Step(1e-2);
    }
  }
  for (bool restore_steps : {true, false}) {
    torch::Tensor resumed = first.detach().clone().requires_grad_(true);
    Optimizer after({resumed}, o);
    for (size_t slot = 0; slot < 2; ++slot) after.state()[slot][0].copy_(before.state()[slot][0]);
    if (restore_steps) after.set_steps(before.steps());
    for (int i = 3; i < 6; ++i) {
      resumed.mutable_grad() = grads[i].clone();
      after.Step(1e-2);
    }
    EXPECT_EQ(torch::equal(resumed.detach(), whole.detach()), restore_steps);
  }
}

TEST(OptimizerOptionsTest, FromSpecFillsPyTorchsDefaults) {
  v1::OptimizerSpec spec;
  spec.set_name("adamw");
  spec.set_weight_decay(0.05);
  OptimizerOptions o = OptimizerOptions::FromSpec(spec);
  EXPECT_EQ(o.kind, OptimizerOptions::Kind::kAdamW);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.eps, 1e-8);
  EXPECT_EQ(o.weight_decay, 0.05);
  spec.set_name("lars");
  spec.set_trust_coefficient(0.02);
  spec.set_momentum(0.9);
  o = OptimizerOptions::FromSpec(spec);
  EXPECT_EQ(o.kind, OptimizerOptions::Kind::kLars);
  EXPECT_EQ(o.trust_coefficient, 0.02);
  EXPECT_EQ(o.momentum, 0.9);
  spec.set_name("sgd");
  spec.set_nesterov(true);
  o = OptimizerOptions::FromSpec(spec);
  EXPECT_EQ(o.kind, OptimizerOptions::Kind::kSgd);
  EXPECT_TRUE(o.nesterov);
}

}  // namespace
}  // namespace joule::worker
