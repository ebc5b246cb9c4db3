#ifndef JOULE_WORKER_MODELS_EXPORT_H_
#define JOULE_WORKER_MODELS_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "joule/v1/checkpoint.pb.h"

namespace joule::worker {

// Writes a logreg or mlp checkpoint as a TorchScript module any PyTorch loads with
// torch.jit.load(path) and calls on [batch, C, H, W] images: forward flattens them and
// applies the Linear layers in order, with ReLU between them (the models' definitions in
// models.cc). The layers come from the checkpoint's "N.weight"/"N.bias" tensors (the
// nn::Sequential's indices), checked to chain: each weight [out, in], each bias [out], each
// in the previous out. Errors: UNIMPLEMENTED for another model (convolutional models keep
// the .npz state dict), INVALID_ARGUMENT for tensors that do not form the chain,
// UNAVAILABLE when the file cannot be written.
absl::Status SaveLinearChainTorchScript(const std::string& model, const v1::Checkpoint& checkpoint,
                                        const std::string& path);

}  // namespace joule::worker

#endif  // JOULE_WORKER_MODELS_EXPORT_H_
