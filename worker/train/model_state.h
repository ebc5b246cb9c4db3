#ifndef JOULE_WORKER_TRAIN_MODEL_STATE_H_
#define JOULE_WORKER_TRAIN_MODEL_STATE_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "worker/comm/process_group.h"
#include "worker/models/models.h"

namespace joule::worker {

// The tensors of a model that training keeps equal across ranks, as handles that share the
// model's storage (writing into them writes the model). Collected once, after the model
// was moved to its device.
struct ModelTensors {
  // Model::Parameters(), in order: float32, requires_grad.
  std::vector<torch::Tensor> parameters;
  std::vector<std::string> parameter_names;
  // Model::Buffers() (BatchNorm running statistics), in order: float32. Not trained by
  // gradients, so each rank's drift with its own batches; they start as rank 0's and are
  // averaged before every evaluation and checkpoint (PyTorch DDP instead broadcasts rank
  // 0's before every forward).
  std::vector<torch::Tensor> statistics;
  std::vector<std::string> statistic_names;

  // Scalars over all parameters: the length of the flat buffers that carry them.
  int64_t parameter_count() const;
};
ModelTensors CollectModelTensors(Model& model);

// Copies `tensors` (any shapes, numel summing to at most flat.numel()) one after the
// other into the 1-D `flat`, from index 0; Unpack copies them back. Same dtype and device
// rules as Tensor::copy_.
void Pack(const std::vector<torch::Tensor>& tensors, torch::Tensor& flat);
void Unpack(const torch::Tensor& flat, std::vector<torch::Tensor>& tensors);

// Collective: rank 0's values (average = false) or the average over ranks (average =
// true) of the float tensors `ts` (any device), in place, through one flat host buffer.
// Nothing to do for an empty list or one rank. Errors: the group's (`ts` then unchanged).
absl::Status SyncTensors(ProcessGroup& pg, std::vector<torch::Tensor>& ts, bool average);

// What on_collective hears (see TrainHooks): the collective's name, bytes of this rank's
// buffer, wall seconds. May be empty.
using CollectiveObserver = std::function<void(const char* op, int64_t bytes, double seconds)>;

// Moves lists of tensors shaped like the parameters (the parameters themselves, or SGD's
// momentum buffers) between ranks through one reused flat float32 CPU buffer of
// `parameter_count` floats. Collectives: every rank calls the same methods in the same
// order. Not thread-safe.
class ParameterExchange {
 public:
  // The collectives are timed by `clock` (not owned; outlives this).
  ParameterExchange(int64_t parameter_count, CollectiveObserver on_collective,
                    const joule::Clock& clock = *joule::Clock::Real());
  // Every rank's `tensors` become rank 0's (reported as "broadcast").
  absl::Status Broadcast(ProcessGroup& pg, std::vector<torch::Tensor>& tensors);
  // Every rank's `tensors` become the sum over ranks times the float 1 / world (reported
  // as "average"). Errors: the group's (`tensors` then unchanged).
  absl::Status Average(ProcessGroup& pg, std::vector<torch::Tensor>& tensors);

 private:
  torch::Tensor flat_;
  CollectiveObserver on_collective_;
  const joule::Clock& clock_;
};

// "world=2 input=1x28x28 classes=10 | train=60000 test=10000 | 1.weight:512x784:Float | ...
// | buffer bn1.running_mean:64:Float | ..." (the data's shape and size, then the names,
// shapes and dtypes of the parameters and of the float buffers). Ranks whose fingerprints
// differ would misalign every flat buffer.
std::string Fingerprint(Model& model, const InputShape& shape, int world, int64_t train_size,
                        int64_t test_size);
// The first " | "-separated field where `b` differs from rank 0's `a`:
// "<b's field> where rank 0 has <a's field>" ("(nothing)" past the end of one); "identical".
std::string FirstDifference(const std::string& a, const std::string& b);
// OK when every rank's fingerprint (in rank order) equals rank 0's; else
// FAILED_PRECONDITION "rank <r> differs from rank 0: <FirstDifference>" for the first such r.
absl::Status CheckFingerprints(const std::vector<std::string>& fingerprints);

// CRC-32 (zlib) of the parameters and then the float buffers, each as its float32 bytes
// in Model order (on any device: copied to the host).
uint32_t ParameterHash(Model& model);
// Eight lowercase hex digits, zero-padded: what RankResult.parameter_hash shows.
std::string HashText(uint32_t hash);

// Collective: every rank passes its ParameterHash. OK when all ranks' are equal; DATA_LOSS
// naming every rank whose hash differs from rank 0's (on every rank); else the group's
// error. The hash travels as two 16-bit halves, exact in float32.
absl::Status CompareParameterHashes(ProcessGroup& pg, uint32_t hash);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_MODEL_STATE_H_
