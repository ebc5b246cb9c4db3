#ifndef JOULE_WORKER_MODELS_MODELS_H_
#define JOULE_WORKER_MODELS_MODELS_H_

// Includes LibTorch: only worker/train and worker/models .cc files include this header.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace joule::worker {

struct InputShape {
  int channels = 1;
  int height = 28;
  int width = 28;
  int classes = 10;
};

// Builds a freshly initialised model (LibTorch's default initialisers, from the current
// torch RNG state). Input: [batch, channels, height, width] float; output: [batch, classes]
// logits. Architectures (the reference workloads of bench/README.md):
//   logreg: Flatten, Linear(C*H*W, classes)
//   mlp:    Flatten, Linear(C*H*W, h1), ReLU, ..., Linear(hk, classes)   (hidden = {h1..hk})
//   cnn:    Conv(C,32,3) ReLU Conv(32,64,3) ReLU MaxPool(2) Flatten
//           Linear(64*((H-4)/2)*((W-4)/2), 128) ReLU Linear(128, classes)
// Errors: INVALID_ARGUMENT for an unknown name or an input too small for the cnn.
absl::StatusOr<torch::nn::Sequential> BuildModel(const std::string& name,
                                                 const std::vector<int>& hidden,
                                                 const InputShape& shape);

}  // namespace joule::worker

#endif  // JOULE_WORKER_MODELS_MODELS_H_
