#include "worker/models/export.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/atomic_file.h"

namespace joule::worker {
namespace {

torch::Tensor ToTensor(const v1::TensorData& t) {
  std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  return torch::from_blob(const_cast<float*>(t.values().data()), shape, torch::kFloat32).clone();
}

// LibTorch's messages may span lines (and without what_without_backtrace, a stack): one line.
std::string OneLine(const std::string& s) {
  std::string line = absl::StrReplaceAll(s, {{"\r", " "}, {"\n", " "}});
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line;
}

}  // namespace

absl::Status SaveLinearChainTorchScript(const std::string& model, const v1::Checkpoint& checkpoint,
                                        const std::string& path) {
  if (model != "logreg" && model != "mlp") {
    return absl::UnimplementedError(absl::StrCat(
        "TorchScript export is for logreg and mlp; model \"", model,
        "\" exports as a state dict (--format npz)"));
  }
  // index -> (weight, bias)
  std::map<int, std::pair<const v1::TensorData*, const v1::TensorData*>> layers;
  for (const v1::TensorData& t : checkpoint.parameters()) {
    const size_t dot = t.name().find('.');
    int index = 0;
    if (dot == std::string::npos || !absl::SimpleAtoi(t.name().substr(0, dot), &index)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name(), " is not a layer's"));
    }
    const std::string kind = t.name().substr(dot + 1);
    if (kind == "weight") {
      layers[index].first = &t;
    } else if (kind == "bias") {
      layers[index].second = &t;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name(), " is not a Linear's"));
    }
  }
  if (layers.empty()) return absl::InvalidArgumentError("the checkpoint holds no parameters");
  torch::jit::Module module("JouleLinearChain");
  std::string forward = "def forward(self, x):\n    x = x.flatten(1)\n";
  int64_t width = -1;
  int n = 0;
  for (const auto& [index, wb] : layers) {
    const auto [w, b] = wb;
    if (!w || !b || w->shape_size() != 2 || b->shape_size() != 1 || b->shape(0) != w->shape(0) ||
        (width >= 0 && w->shape(1) != width) ||
        w->values_size() != w->shape(0) * w->shape(1) || b->values_size() != b->shape(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", index, " is not a Linear that follows the previous one"));
    }
    width = w->shape(0);
    module.register_parameter(absl::StrCat("w", n), ToTensor(*w), false);
    module.register_parameter(absl::StrCat("b", n), ToTensor(*b), false);
    const bool last = n + 1 == static_cast<int>(layers.size());
    // x W^T + b (what nn.Linear computes), as builtins a C++-defined module can resolve.
    absl::StrAppend(&forward, "    x = torch.addmm(self.b", n, ", x, self.w", n, ".t())\n",
                    last ? "" : "    x = torch.relu(x)\n");
    ++n;
  }
  absl::StrAppend(&forward, "    return x\n");
  try {
    module.define(forward);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot define the TorchScript module: ",
                                            OneLine(e.what_without_backtrace())));
  }
  // Saved whole or not at all, never through a symlink (common/atomic_file.h).
  return WriteFileAtomicallyWith(path, [&](const std::string& tmp) -> absl::Status {
    try {
      module.save(tmp);
    } catch (const c10::Error& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot write ", path, ": ", OneLine(e.what_without_backtrace())));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", OneLine(e.what())));
    }
    return absl::OkStatus();
  });
}

}  // namespace joule::worker
