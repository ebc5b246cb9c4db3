#ifndef JOULE_COMMON_JOB_SPEC_H_
#define JOULE_COMMON_JOB_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace joule {

// Upper bounds on what one job may ask for. A spec past a bound is refused at submit,
// so a typo (epochs=1e9) never occupies the cluster. Defaults suit one rack.
struct SpecLimits {
  int32_t max_workers = 256;
  int32_t max_epochs = 10000;
  int32_t max_batch_size = 1 << 20;  // per rank and global, samples
  double max_lr = 100.0;
  int32_t max_hidden_width = 1 << 16;
  int32_t max_hidden_layers = 16;
  int32_t max_intra_op_threads = 1024;
  size_t max_name_bytes = 256;
  size_t max_labels = 64;
  size_t max_label_key_bytes = 128;
  size_t max_label_value_bytes = 1024;
  size_t max_path_bytes = 4096;  // model and dataset strings (PATH_MAX on Linux)
  int32_t max_restarts = 100;
};

// Every string and map field of a spec is bounded (above), so a spec that passes
// NormalizeAndValidateSpec serializes to at most this many bytes, far below the 4 MiB
// gRPC message limit of the workers' sessions, whatever an Assignment adds around it.
// Checked again on the serialized size, so a future unbounded field cannot slip past.
inline constexpr size_t kMaxSpecBytes = 256 * 1024;

// Fills the defaults of `spec` in place and checks it against `limits`.
//
// Defaults: device_kind CPU, optimizer "sgd", sync ALLREDUCE, seed kept as given, mlp
// hidden_sizes {512, 256}, keep_checkpoints 2, max_restarts 3 (0 with no_restarts). Batch sizes follow Huber et al. (arXiv 2508.07706):
// global = local x workers; given one, the other is derived; given both, they must agree.
//
// Strings (name, model, dataset, label keys and values, ...) must be valid UTF-8 without
// control characters and within their byte bounds.
//
// Errors: INVALID_ARGUMENT naming the field and the offending value, e.g.
// "global_batch_size 100 is not divisible by workers 3". On error `spec` may be
// partly normalised; callers store nothing.
absl::Status NormalizeAndValidateSpec(v1::JobSpec& spec, const SpecLimits& limits = {});

// Why a checkpoint of a job with spec `from` cannot start a job with spec `to`
// (resume_from_job): the first field the checkpoint depends on that differs, as "FIELD A
// against B"; "" when it fits. The fields are those of the workers' checkpoint spec hash
// (worker/train/checkpoint.cc, SpecHash), both specs normalized.
std::string CheckpointMismatch(const v1::JobSpec& from, const v1::JobSpec& to);

// A job with an energy budget: its ranks agree every this many global steps (and at each
// epoch's last step) whether any was asked to stop (worker/train/trainer.h); the
// coordinator counts those steps in what a stop still costs (EnforceBudgetLocked).
inline constexpr int64_t kStopCheckInterval = 8;

// The learning rate a job trains at once any warm-up is over: `base_lr` x global batch / 256
// when `linear` (lr_scaling "linear": Goyal et al. 2017, "Accurate, Large Minibatch SGD"),
// else `base_lr`. The one formula the trainer's schedule and every summary use.
double TargetLearningRate(double base_lr, bool linear, int64_t global_batch);

// True for the model names the worker knows: "logreg", "mlp", "cnn", "resnet18",
// "resnet50", or "torchscript:FILE" (a module saved with torch.jit.save).
bool IsKnownModel(const std::string& model);

// The user-supplied files and directories a spec names (idx:DIR and csv:FILE datasets,
// torchscript:FILE models), which must lie under the configured data roots.
std::vector<std::string> UserPaths(const v1::JobSpec& spec);

// Parses a dataset reference: "fashion-mnist" (Debian's dataset-fashion-mnist), "idx:DIR"
// (a directory holding the four MNIST-layout IDX files, e.g. MNIST itself), "csv:FILE"
// (see worker/data/csv.h) or "synthetic:CxHxW:CLASSES:N". Sets `*dir` to the directory or
// file (named datasets resolve under `data_root`, default /usr/share/datasets; empty for
// synthetic). Errors: INVALID_ARGUMENT for an unknown name or an empty path.
absl::Status ResolveDataset(const std::string& dataset, const std::string& data_root,
                            std::string* dir);

// A synthetic dataset "synthetic:CxHxW:CLASSES:N": N random training images of C x H x W
// (and N / 10, at least 1, test images) with uniformly random labels, for throughput runs
// like the standard synthetic ResNet-50 benchmark.
struct SyntheticSpec {
  int channels = 0, height = 0, width = 0, classes = 0;
  int64_t size = 0;
};
// Errors: INVALID_ARGUMENT naming the part that is malformed or out of range
// (1..64 channels, 1..1024 pixels a side, 2..100000 classes, 1..10,000,000 images).
absl::StatusOr<SyntheticSpec> ParseSynthetic(const std::string& dataset);

// "hdf5:FILE:INPUTS:TARGETS": the file and the two datasets in it (the last two
// ':'-separated fields are the dataset names, so FILE may hold ':'). Errors:
// INVALID_ARGUMENT for a malformed name.
struct Hdf5Dataset {
  std::string file;
  std::string inputs;
  std::string targets;
};
absl::StatusOr<Hdf5Dataset> ParseHdf5Dataset(const std::string& dataset);

// What a job needs on each worker, estimated from its spec before it runs (0 where the
// spec does not tell: torchscript models, idx/csv files whose size is read by workers).
struct ResourceEstimate {
  int64_t parameters = 0;       // trainable parameters of the model
  int64_t model_bytes = 0;      // parameters, gradients, momentum and the flat exchange
                                // buffer: 4 float32 copies (trainer.cc)
  int64_t dataset_bytes = 0;    // the train and test splits as float32 features plus int64
                                // labels: every rank holds the whole set (data/dataset.h)
  // algorithm ga: the weights of one island (parameters x population / workers); its
  // model_bytes are then 4 float32 copies of them, not of one model.
  int64_t ga_island_floats = 0;
  int64_t total_bytes() const { return model_bytes + dataset_bytes; }
};
// Errors: INVALID_ARGUMENT for a dataset or model the estimate cannot parse (validate
// the spec first).
absl::StatusOr<ResourceEstimate> EstimateResources(const v1::JobSpec& spec);

// The most weights a genetic algorithm's island may hold: 2^28 float32 (1 GiB), with
// Evolve's copies a few GiB (worker/train/ga.cc refuses more as well).
inline constexpr int64_t kMaxGaIslandFloats = int64_t{1} << 28;

// Above these a job cannot run on any machine Joule targets (one H200 has 141 GB; a large
// host 2 TiB), so it is refused whatever the workers report.
inline constexpr int64_t kMaxJobBytesPerWorker = int64_t{2} << 40;  // 2 TiB

// OK when `path`, made absolute and resolved (symlinks of the existing part, "."
// and ".."), lies inside one of `roots` (resolved the same way). Errors: INVALID_ARGUMENT
// naming the path and the roots.
absl::Status CheckUnderRoots(const std::string& path, const std::vector<std::string>& roots);

// CheckUnderRoots, returning the path as resolved there (absolute, canonical).
absl::StatusOr<std::string> ResolveUnderRoots(const std::string& path,
                                              const std::vector<std::string>& roots);

// Replaces each user path of `spec` (UserPaths) with ResolveUnderRoots' result, so every
// worker opens the file the coordinator checked, whatever its working directory.
// Errors: those of ResolveUnderRoots.
absl::Status ResolveUserPaths(v1::JobSpec& spec, const std::vector<std::string>& roots);

}  // namespace joule

#endif  // JOULE_COMMON_JOB_SPEC_H_
