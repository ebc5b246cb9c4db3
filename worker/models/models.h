#ifndef JOULE_WORKER_MODELS_MODELS_H_
#define JOULE_WORKER_MODELS_MODELS_H_

// Includes LibTorch: only worker/train and worker/models .cc files include this header.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/open_beneath.h"

namespace joule::worker {

struct InputShape {
  int channels = 1;
  int height = 28;
  int width = 28;
  int classes = 10;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// A classifier the trainer trains: a LibTorch module built here, or a TorchScript module
// loaded from a file. Not thread-safe.
class Model {
 public:
  virtual ~Model() = default;
  // [batch, channels, height, width] float32 -> [batch, classes] logits.
  virtual torch::Tensor Forward(const torch::Tensor& x) = 0;
  // The trained tensors (float32, requires_grad), in a fixed order that every rank shares,
  // with their dotted names ("layer1.0.conv1.weight").
  virtual NamedTensors Parameters() = 0;
  // Float state that gradients do not train: BatchNorm running means and variances.
  // (Integer buffers such as num_batches_tracked are left out.)
  virtual NamedTensors Buffers() = 0;
  // Training mode (BatchNorm uses batch statistics and updates its running ones) or
  // evaluation mode.
  virtual void SetTraining(bool training) = 0;
  // Moves parameters and buffers to `device` (a CUDA GPU with a CUDA-enabled LibTorch).
  virtual void To(const torch::Device& device) = 0;
};

// Builds a freshly initialised model from the current torch RNG state (or loads one).
// Architectures (logreg/mlp/cnn are the reference workloads of bench/README.md):
//   logreg: Flatten, Linear(C*H*W, classes)
//   mlp:    Flatten, Linear(C*H*W, h1), ReLU, ..., Linear(hk, classes)   (hidden = {h1..hk})
//   cnn:    Conv(C,32,3) ReLU Conv(32,64,3) ReLU MaxPool(2) Flatten
//           Linear(64*((H-4)/2)*((W-4)/2), 128) ReLU Linear(128, classes)
//   resnet18, resnet50: torchvision's ResNet (He et al., CVPR 2016; torchvision
//           models/resnet.py: BasicBlock [2,2,2,2] and Bottleneck [3,4,6,3] with the stride
//           on the 3x3 convolution, "ResNet v1.5"), with C input channels and `classes`
//           outputs; torchvision's initialisation (Kaiming-normal fan-out convolutions,
//           BatchNorm weight 1 and bias 0). Any image of at least 1x1 works: the stem and
//           stages downsample by 32 and the head pools adaptively.
//   torchscript:FILE: a module saved with torch.jit.save; it must map a
//           [2, C, H, W] float batch to [2, classes] and hold float32 parameters; for a
//           regression (`regression` given), [2, inputs...] to [2, targets...].
//           Only a torchscript: model can be a regression's.
// Errors: INVALID_ARGUMENT for an unknown name, an input too small for the cnn, or a
// TorchScript module of the wrong shape or dtype; NOT_FOUND / DATA_LOSS when the
// TorchScript file is missing or cannot be loaded (naming it, in one line); those of
// `open`, which opens the TorchScript file (see worker/data/open_beneath.h).
// The shapes of one example of a regression (hdf5:): its inputs and its targets.
struct RegressionShape {
  std::vector<int64_t> inputs;
  std::vector<int64_t> targets;
};
absl::StatusOr<std::unique_ptr<Model>> BuildModel(const std::string& name,
                                                  const std::vector<int>& hidden,
                                                  const InputShape& shape,
                                                  const FileOpener& open = OpenPlain,
                                                  const RegressionShape* regression = nullptr);

// The telling line of an exception from LibTorch, without its C++ backtrace: a
// c10::Error's message alone, and of a TorchScript traceback its last "...Error: ..."
// line. At most 500 bytes, one line.
std::string ErrorLine(const std::exception& e);

}  // namespace joule::worker

#endif  // JOULE_WORKER_MODELS_MODELS_H_
