#ifndef JOULE_WORKER_DATA_DATASET_H_
#define JOULE_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/data/open_beneath.h"

namespace joule::worker {

// A labelled image classification split held in memory, or named by files.
// `images` holds `size` images, each channels x height x width floats in [0, 1]
// (bytes / 255), in NCHW order; `labels` holds `size` class indices in [0, classes).
// A split of image files (image_folder.h) has `files` (size paths) instead of `images`:
// each example is decoded and transformed as it is drawn, to channels x height x width
// (the transform's output).
struct ImageDataset {
  int64_t size = 0;
  int channels = 1;
  int height = 0;
  int width = 0;
  int classes = 0;
  std::vector<float> images;
  std::vector<int64_t> labels;
  std::vector<std::string> files;
  bool file_backed() const { return !files.empty(); }
  // A regression split (hdf5_arrays.h): `images` holds size x sample_shape input values,
  // `targets` size x target_shape float targets, and `labels` is empty. An empty
  // sample_shape means channels x height x width.
  std::vector<int64_t> sample_shape;
  std::vector<float> targets;
  std::vector<int64_t> target_shape;
  bool regression() const { return !target_shape.empty(); }
  // A rank's shard of a split of `total` examples that every rank reads only its part of
  // (hdf5_arrays.h); each rank draws min_shard of its examples per epoch.
  bool sharded = false;
  int64_t total = 0;
  int64_t min_shard = 0;
  // The split's examples over all ranks.
  int64_t examples() const { return sharded ? total : size; }

  int64_t features() const { return int64_t{channels} * height * width; }
};

enum class Split { kTrain, kTest };

// Loads the MNIST-layout IDX pair of `split` from `dir`: train-images-idx3-ubyte and
// train-labels-idx1-ubyte (t10k-* for the test split), each gzip-compressed (".gz") or
// raw. Keeps the first `max_samples` examples when it is > 0. Classes = the largest
// label + 1 over the whole file (10 for (Fashion-)MNIST).
// Errors: NOT_FOUND for a missing file; DATA_LOSS (naming the file) for a corrupt one,
// image and label counts that differ, or images that are not 3-D.
// Files are opened with `open` (see open_beneath.h).
absl::StatusOr<ImageDataset> LoadIdxDataset(const std::string& dir, Split split,
                                            int64_t max_samples,
                                            const FileOpener& open = OpenPlain);

// Random images in [0, 1) and uniform labels from a fixed seed per split (the same on
// every rank): `spec.size` training images, max(1, size / 10) test images.
ImageDataset MakeSyntheticDataset(const SyntheticSpec& spec, Split split);

// Keeps every k-th example of each class, in order (a stratified 1/k subset); k <= 1
// keeps everything. Works on file-backed splits too.
void KeepStratifiedFraction(ImageDataset& d, int k);

// Which examples rank `rank` of `world` trains on in each step of an epoch.
//
// Every epoch is a fresh permutation of [0, dataset_size) drawn from (seed, epoch), the
// same on every rank. Step s uses the global batch perm[s*G, (s+1)*G) and rank r takes
// its slice [r*L, (r+1)*L) of it (G = global batch, L = G / world). The remainder of
// dataset_size / G is dropped, so every rank runs the same number of steps and the ranks'
// examples are disjoint within an epoch.
class EpochSharder {
 public:
  // `global_batch` = local batch x world x micro-batches; Batch() returns this rank's
  // whole share of a step (local batch x micro-batches examples).
  EpochSharder(int64_t dataset_size, int64_t global_batch, int rank, int world, uint64_t seed);
  // For a sharded split (each rank holds only its own examples): each epoch is a fresh
  // permutation of the rank's `shard_size` examples drawn from (seed, epoch, rank), of
  // which min_shard / local_batch steps are taken (every rank the same count; the rest of
  // a larger shard waits for another epoch's draw). Batch() then gives indices into the
  // rank's shard.
  static EpochSharder Local(int64_t shard_size, int64_t min_shard, int64_t global_batch,
                            int rank, int world, uint64_t seed);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t local_batch() const { return local_batch_; }
  // Shuffles for `epoch` (0-based). Then Batch(s) gives step s's local indices.
  void StartEpoch(int epoch);
  // The `local_batch()` example indices of step `step` (0 <= step < steps_per_epoch()).
  std::vector<int64_t> Batch(int64_t step) const;

 private:
  int64_t size_;
  int64_t global_batch_;
  int64_t local_batch_;
  int rank_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
  std::vector<int64_t> perm_;
  bool local_ = false;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_DATASET_H_
