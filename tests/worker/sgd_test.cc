#include "worker/train/sgd.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

struct Case {
  double momentum;
  double weight_decay;
  bool strided_gradient;  // a non-contiguous gradient takes the tensor fallback path
  std::string Name() const {
    return absl::StrCat("momentum ", momentum, " weight_decay ", weight_decay,
                        strided_gradient ? " strided" : " contiguous");
  }
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (double m : {0.0, 0.9}) {
    for (double wd : {0.0, 1e-2}) {
      for (bool strided : {false, true}) cases.push_back({m, wd, strided});
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

TEST(SgdTest, FollowsTorchOptimSgd) {
  // Momentum, weight decay, the first step (b = d) and later ones (b = m b + d), on the
  // single-pass kernel and on the tensor fallback, against LibTorch's own optimizer.
  for (const Case& c : AllCases()) {
    torch::manual_seed(7);
    const torch::Tensor init = torch::randn({7, 5});
    torch::Tensor ours = init.clone().requires_grad_(true);
    torch::Tensor theirs = init.clone().requires_grad_(true);
    Sgd sgd({ours}, SgdOptions{c.momentum, c.weight_decay});
    torch::optim::SGD reference(
        {theirs},
        torch::optim::SGDOptions(0.1).momentum(c.momentum).weight_decay(c.weight_decay));
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

TEST(SgdTest, TheFirstStepIgnoresWhateverTheBuffersHold) {
  // PyTorch's first step sets b = d; a buffer holding anything must not leak into it.
  for (double wd : {0.0, 1e-2}) {
    torch::manual_seed(3);
    const torch::Tensor init = torch::randn({4, 3});
    const torch::Tensor g = torch::randn({4, 3});
    torch::Tensor ours = init.clone().requires_grad_(true);
    torch::Tensor theirs = init.clone().requires_grad_(true);
    Sgd sgd({ours}, SgdOptions{0.9, wd});
    sgd.momentum_buffers()[0].fill_(1000.0f);
    torch::optim::SGD reference({theirs},
                                torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(wd));
    ours.mutable_grad() = g.clone();
    theirs.mutable_grad() = g.clone();
    sgd.Step(0.05);
    reference.step();
    ExpectClose(ours.detach(), theirs.detach(), absl::StrCat("weight_decay ", wd));
    // b = d = g + wd p
    ExpectClose(sgd.momentum_buffers()[0], g + wd * init, "buffer after the first step");
  }
}

TEST(SgdTest, AMissingGradientCountsAsZero) {
  // A parameter that got no gradient still decays and coasts on its momentum, as if its
  // gradient were zeros (torch::optim::SGD would skip it: here it is given zeros).
  torch::manual_seed(5);
  const torch::Tensor init = torch::randn({6});
  torch::Tensor ours = init.clone().requires_grad_(true);
  torch::Tensor theirs = init.clone().requires_grad_(true);
  Sgd sgd({ours}, SgdOptions{0.9, 1e-2});
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

TEST(SgdTest, RestoredBuffersContinueTheTrajectoryExactly) {
  // What a resumed attempt does: copy parameters and buffers into a fresh optimizer and
  // mark it started. The continuation is bit-identical to the uninterrupted run.
  torch::manual_seed(11);
  const torch::Tensor init = torch::randn({8, 3});
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(torch::randn({8, 3}));
  torch::Tensor whole = init.clone().requires_grad_(true);
  Sgd uninterrupted({whole}, SgdOptions{0.9, 1e-3});
  torch::Tensor first = init.clone().requires_grad_(true);
  Sgd before({first}, SgdOptions{0.9, 1e-3});
  for (int i = 0; i < 6; ++i) {
    whole.mutable_grad() = grads[i].clone();
    uninterrupted.Step(0.05);
    if (i < 3) {
      first.mutable_grad() = grads[i].clone();
      before.Step(0.05);
    }
  }
  torch::Tensor resumed = first.detach().clone().requires_grad_(true);
  Sgd after({resumed}, SgdOptions{0.9, 1e-3});
  after.momentum_buffers()[0].copy_(before.momentum_buffers()[0]);
  after.set_started(before.started());
  for (int i = 3; i < 6; ++i) {
    resumed.mutable_grad() = grads[i].clone();
    after.Step(0.05);
  }
  EXPECT_TRUE(torch::equal(resumed.detach(), whole.detach()));
  EXPECT_TRUE(torch::equal(after.momentum_buffers()[0], uninterrupted.momentum_buffers()[0]));
}

TEST(SgdTest, WithoutMomentumTheBuffersStayUnused) {
  torch::Tensor p = torch::ones({3}).requires_grad_(true);
  Sgd sgd({p}, SgdOptions{0.0, 0.0});
  p.mutable_grad() = torch::full({3}, 2.0f);
  sgd.Step(0.5);
  EXPECT_FALSE(sgd.started());
  EXPECT_TRUE(torch::equal(p.detach(), torch::zeros({3})));  // 1 - 0.5 x 2
  EXPECT_TRUE(torch::equal(sgd.momentum_buffers()[0], torch::zeros({3})));
}

}  // namespace
}  // namespace joule::worker
