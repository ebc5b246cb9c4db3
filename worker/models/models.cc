#include "worker/models/models.h"

#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

#include <torch/script.h>

#include <filesystem>
#include <unordered_set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace joule::worker {
namespace {

namespace nn = torch::nn;

// Keeps each tensor once (by storage identity), in order.
NamedTensors Once(NamedTensors in) {
  NamedTensors out;
  std::unordered_set<const void*> seen;
  for (auto& [name, t] : in) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

// Keeps float32 tensors, each once (a module may list a tied tensor under two names; it
// must get one gradient slot and one update). Other dtypes are left to the module.
NamedTensors Float32Once(NamedTensors in) {
  NamedTensors out;
  std::unordered_set<const void*> seen;
  for (auto& [name, t] : in) {
    if (t.scalar_type() != torch::kFloat32) continue;
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

// A LibTorch module (a ModuleHolder such as nn::Sequential) as a Model.
template <typename Holder>
class NnModel final : public Model {
 public:
  explicit NnModel(Holder module) : module_(std::move(module)) {}
  torch::Tensor Forward(const torch::Tensor& x) override { return module_->forward(x); }
  NamedTensors Parameters() override {
    NamedTensors out;
    for (const auto& item : module_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  NamedTensors Buffers() override {
    NamedTensors out;
    for (const auto& item : module_->named_buffers()) out.emplace_back(item.key(), item.value());
    return Float32Once(std::move(out));
  }
  void SetTraining(bool training) override { module_->train(training); }
  void To(const torch::Device& device) override { module_->to(device); }

 private:
  Holder module_;
};

// A TorchScript module loaded from a file.
class ScriptModel final : public Model {
 public:
  explicit ScriptModel(torch::jit::Module module) : module_(std::move(module)) {}
  torch::Tensor Forward(const torch::Tensor& x) override {
    return module_.forward({x}).toTensor();
  }
  NamedTensors Parameters() override {
    NamedTensors out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return Once(std::move(out));
  }
  NamedTensors Buffers() override {
    NamedTensors out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return Float32Once(std::move(out));
  }
  void SetTraining(bool training) override { module_.train(training); }
  void To(const torch::Device& device) override { module_.to(device); }

 private:
  torch::jit::Module module_;
};

// --- ResNet, after torchvision/models/resnet.py -------------------------------------

nn::Conv2d Conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

// 1x1 convolution and BatchNorm on the shortcut when the shape changes.
nn::Sequential Downsample(int64_t in, int64_t out, int64_t stride) {
  return nn::Sequential(Conv(in, out, 1, stride, 0), nn::BatchNorm2d(out));
}

struct BasicBlockImpl : nn::Module {
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t in, int64_t planes, int64_t stride)
      : conv1(register_module("conv1", Conv(in, planes, 3, stride, 1))),
        bn1(register_module("bn1", nn::BatchNorm2d(planes))),
        conv2(register_module("conv2", Conv(planes, planes, 3, 1, 1))),
        bn2(register_module("bn2", nn::BatchNorm2d(planes))) {
    if (stride != 1 || in != planes) {
      downsample = register_module("downsample", Downsample(in, planes, stride));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    return torch::relu(out + (downsample ? downsample->forward(x) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

// ResNet v1.5: the stride sits on the 3x3 convolution (as in torchvision).
struct BottleneckImpl : nn::Module {
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t in, int64_t planes, int64_t stride)
      : conv1(register_module("conv1", Conv(in, planes, 1, 1, 0))),
        bn1(register_module("bn1", nn::BatchNorm2d(planes))),
        conv2(register_module("conv2", Conv(planes, planes, 3, stride, 1))),
        bn2(register_module("bn2", nn::BatchNorm2d(planes))),
        conv3(register_module("conv3", Conv(planes, planes * kExpansion, 1, 1, 0))),
        bn3(register_module("bn3", nn::BatchNorm2d(planes * kExpansion))) {
    if (stride != 1 || in != planes * kExpansion) {
      downsample = register_module("downsample", Downsample(in, planes * kExpansion, stride));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = torch::relu(bn1(conv1(x)));
    out = torch::relu(bn2(conv2(out)));
    out = bn3(conv3(out));
    return torch::relu(out + (downsample ? downsample->forward(x) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Conv2d conv3;
  nn::BatchNorm2d bn3;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

template <typename Block>
struct ResNetImpl : nn::Module {
  ResNetImpl(const std::array<int, 4>& layers, int64_t channels, int64_t classes)
      : conv1(register_module("conv1", Conv(channels, 64, 7, 2, 3))),
        bn1(register_module("bn1", nn::BatchNorm2d(64))),
        maxpool(register_module("maxpool",
                                nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)))) {
    int64_t in = 64;
    const int64_t planes[4] = {64, 128, 256, 512};
    for (int i = 0; i < 4; ++i) {
      nn::Sequential stage;
      for (int b = 0; b < layers[i]; ++b) {
        const int64_t stride = (b == 0 && i > 0) ? 2 : 1;
        stage->push_back(Block(in, planes[i], stride));
        in = planes[i] * Block::Impl::kExpansion;
      }
      stages.push_back(register_module(absl::StrCat("layer", i + 1), stage));
    }
    fc = register_module("fc", nn::Linear(in, classes));
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<nn::Conv2d>()) {
        nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
        nn::init::ones_(bn->weight);
        nn::init::zeros_(bn->bias);
      }
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = maxpool(torch::relu(bn1(conv1(x))));
    for (auto& stage : stages) out = stage->forward(out);
    out = torch::adaptive_avg_pool2d(out, {1, 1}).flatten(1);
    return fc(out);
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::MaxPool2d maxpool;
  std::vector<nn::Sequential> stages;
  nn::Linear fc{nullptr};
};
using ResNet18Impl = ResNetImpl<BasicBlock>;
using ResNet50Impl = ResNetImpl<Bottleneck>;
TORCH_MODULE(ResNet18);
TORCH_MODULE(ResNet50);

// The telling line of a LibTorch error: TorchScript's interpreter puts a traceback first
// and the cause ("RuntimeError: mat1 and mat2 shapes cannot be multiplied ...") last.
// LibTorch appends a C++ backtrace ("Exception raised from ...", "frame #0: ...") whose
// frames name c10::Error::Error: never the cause.
std::string Summary(const std::string& what) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(what, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    if (absl::StartsWith(line, "frame #") || absl::StartsWith(line, "Exception raised from")) {
      continue;
    }
    lines.emplace_back(line);
  }
  if (lines.empty()) return SanitizeUtf8(what, 500);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (it->find("Error:") != std::string::npos) return SanitizeUtf8(*it, 500);
  }
  return SanitizeUtf8(lines.front(), 500);
}

std::string Shape(const torch::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

absl::StatusOr<std::unique_ptr<Model>> LoadTorchScript(const std::string& path,
                                                       const InputShape& shape,
                                                       const FileOpener& open,
                                                       const RegressionShape* regression) {
  // Read through the opener (beneath the data roots), then parse from memory.
  absl::StatusOr<int> fd = open(path);
  if (!fd.ok()) return fd.status();
  std::string bytes;
  {
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(*fd);
      return absl::NotFoundError(absl::StrCat("torchscript model ", path, " is not a file"));
    }
    constexpr int64_t kMaxModelBytes = int64_t{16} << 30;
    if (st.st_size > kMaxModelBytes) {
      close(*fd);
      return absl::InvalidArgumentError(absl::StrCat("torchscript model ", path, " is ",
                                                     st.st_size, " bytes, more than ",
                                                     kMaxModelBytes));
    }
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = read(*fd, bytes.data() + got, bytes.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    close(*fd);
    if (got != bytes.size()) {
      return absl::DataLossError(absl::StrCat("torchscript model ", path, ": short read"));
    }
  }
  torch::jit::Module module;
  try {
    std::istringstream in(std::move(bytes));
    module = torch::jit::load(in, torch::kCPU);
  } catch (const std::exception& e) {
    const std::string what = ErrorLine(e);
    return absl::DataLossError(absl::StrCat("torchscript model ", path, " cannot be loaded: ", what));
  }
  auto model = std::make_unique<ScriptModel>(std::move(module));
  NamedTensors params = model->Parameters();
  if (params.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("torchscript model ", path, " has no parameters"));
  }
  for (const auto& [name, p] : params) {
    if (p.scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("torchscript model ", path, ": parameter ",
                                                     name, " is ", c10::toString(p.scalar_type()),
                                                     ", not Float"));
    }
    p.set_requires_grad(true);
  }
  // A dry run in evaluation mode (running statistics untouched) checks the shapes.
  std::vector<int64_t> in_shape{2, shape.channels, shape.height, shape.width};
  std::vector<int64_t> want{2, shape.classes};
  if (regression != nullptr) {
    in_shape = {2};
    in_shape.insert(in_shape.end(), regression->inputs.begin(), regression->inputs.end());
    want = {2};
    want.insert(want.end(), regression->targets.begin(), regression->targets.end());
  }
  torch::Tensor probe = torch::zeros(in_shape);
  try {
    torch::NoGradGuard no_grad;
    model->SetTraining(false);
    torch::Tensor out = model->Forward(probe);
    model->SetTraining(true);
    if (regression != nullptr && out.sizes() != c10::IntArrayRef(want)) {
      return absl::InvalidArgumentError(
          absl::StrCat("torchscript model ", path, " maps ", Shape(probe), " to ", Shape(out),
                       "; the regression's targets are [", absl::StrJoin(want, ", "), "]"));
    }
    if (regression == nullptr &&
        (out.dim() != 2 || out.size(0) != 2 || out.size(1) != shape.classes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "torchscript model ", path, " maps ", Shape(probe), " to ", Shape(out),
          "; the dataset needs [2, ", shape.classes, "] logits"));
    }
  } catch (const std::exception& e) {
    const std::string what = ErrorLine(e);
    return absl::InvalidArgumentError(absl::StrCat("torchscript model ", path, " fails on a ",
                                                   Shape(probe), " batch: ", what));
  }
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> BuildModel(const std::string& name,
                                                  const std::vector<int>& hidden,
                                                  const InputShape& shape,
                                                  const FileOpener& open,
                                                  const RegressionShape* regression) {
  const int64_t in = int64_t{shape.channels} * shape.height * shape.width;
  if (absl::StartsWith(name, "torchscript:")) {
    return LoadTorchScript(name.substr(12), shape, open, regression);
  }
  if (regression != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", name, " is a classifier: a regression needs a torchscript: model"));
  }
  if (name == "resnet18") {
    return std::unique_ptr<Model>(new NnModel<ResNet18>(
        ResNet18(std::array<int, 4>{2, 2, 2, 2}, shape.channels, shape.classes)));
  }
  if (name == "resnet50") {
    return std::unique_ptr<Model>(new NnModel<ResNet50>(
        ResNet50(std::array<int, 4>{3, 4, 6, 3}, shape.channels, shape.classes)));
  }
  nn::Sequential model;
  if (name == "logreg") {
    model->push_back(nn::Flatten());
    model->push_back(nn::Linear(in, shape.classes));
  } else if (name == "mlp") {
    model->push_back(nn::Flatten());
    int64_t width = in;
    for (int h : hidden) {
      model->push_back(nn::Linear(width, h));
      model->push_back(nn::ReLU());
      width = h;
    }
    model->push_back(nn::Linear(width, shape.classes));
  } else if (name == "cnn") {
    if (shape.height < 6 || shape.width < 6) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cnn needs images of at least 6x6, got ", shape.height, "x", shape.width));
    }
    const int64_t h = (shape.height - 4) / 2, w = (shape.width - 4) / 2;
    model->push_back(nn::Conv2d(nn::Conv2dOptions(shape.channels, 32, 3)));
    model->push_back(nn::ReLU());
    model->push_back(nn::Conv2d(nn::Conv2dOptions(32, 64, 3)));
    model->push_back(nn::ReLU());
    model->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
    model->push_back(nn::Flatten());
    model->push_back(nn::Linear(64 * h * w, 128));
    model->push_back(nn::ReLU());
    model->push_back(nn::Linear(128, shape.classes));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model \"", name, "\" is unknown (want logreg, mlp, cnn, resnet18, resnet50 or "
                          "torchscript:FILE)"));
  }
  return std::unique_ptr<Model>(new NnModel<nn::Sequential>(std::move(model)));
}

std::string ErrorLine(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    return Summary(c10->what_without_backtrace());
  }
  return Summary(e.what());
}

}  // namespace joule::worker
