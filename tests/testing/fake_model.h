#ifndef JOULE_TESTS_TESTING_FAKE_MODEL_H_
#define JOULE_TESTS_TESTING_FAKE_MODEL_H_

#include <torch/torch.h>

#include <functional>
#include <utility>

#include "worker/models/models.h"

namespace joule::testing {

// A Model whose tensors and forward pass the test sets: `parameters` and `buffers` are
// returned as given (handles sharing storage), `forward` maps a batch to logits. Records
// the training mode Forward ran in. Not thread-safe.
class FakeModel final : public worker::Model {
 public:
  worker::NamedTensors parameters;
  worker::NamedTensors buffers;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  bool training = true;
  bool forward_saw_training = false;

  torch::Tensor Forward(const torch::Tensor& x) override {
    forward_saw_training = forward_saw_training || training;
    return forward(x);
  }
  worker::NamedTensors Parameters() override { return parameters; }
  worker::NamedTensors Buffers() override { return buffers; }
  void SetTraining(bool t) override { training = t; }
  void To(const torch::Device&) override {}
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FAKE_MODEL_H_
