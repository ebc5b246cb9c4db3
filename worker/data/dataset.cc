#include "worker/data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/data/idx.h"

namespace joule::worker {
namespace {

// Reads DIR/STEM.gz, or DIR/STEM when there is no compressed file; sets `*path` to the
// one read.
absl::StatusOr<IdxArray> ReadEither(const std::string& dir, const std::string& stem,
                                   const FileOpener& open, std::string* path) {
  *path = absl::StrCat(dir, "/", stem, ".gz");
  absl::StatusOr<IdxArray> gz = ReadIdxFile(*path, open);
  if (gz.ok() || gz.status().code() != absl::StatusCode::kNotFound) return gz;
  *path = absl::StrCat(dir, "/", stem);
  absl::StatusOr<IdxArray> raw = ReadIdxFile(*path, open);
  if (raw.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(*path, ": no such file (nor ", *path, ".gz)"));
  }
  return raw;
}

}  // namespace

absl::StatusOr<ImageDataset> LoadIdxDataset(const std::string& dir, Split split,
                                            int64_t max_samples, const FileOpener& open) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  std::string images_path, labels_path;
  absl::StatusOr<IdxArray> images = ReadEither(dir, prefix + "-images-idx3-ubyte", open, &images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxArray> labels = ReadEither(dir, prefix + "-labels-idx1-ubyte", open, &labels_path);
  if (!labels.ok()) return labels.status();
  if (images->dims.size() != 3) {
    return absl::DataLossError(absl::StrCat(images_path, ": images have ", images->dims.size(),
                                            " dimensions, want 3 (count, height, width)"));
  }
  if (labels->dims.size() != 1) {
    return absl::DataLossError(absl::StrCat(labels_path, ": labels have ", labels->dims.size(),
                                            " dimensions, want 1"));
  }
  if (images->dims[0] != labels->dims[0]) {
    return absl::DataLossError(absl::StrCat(images_path, " holds ", images->dims[0],
                                            " images but ", labels_path, " holds ",
                                            labels->dims[0], " labels"));
  }
  ImageDataset d;
  d.height = static_cast<int>(images->dims[1]);
  d.width = static_cast<int>(images->dims[2]);
  d.channels = 1;
  int max_label = 0;
  for (uint8_t l : labels->data) max_label = std::max<int>(max_label, l);
  d.classes = max_label + 1;
  d.size = images->dims[0];
  if (max_samples > 0) d.size = std::min<int64_t>(d.size, max_samples);
  const int64_t features = d.features();
  d.images.resize(d.size * features);
  for (int64_t i = 0; i < d.size * features; ++i) d.images[i] = images->data[i] / 255.0f;
  d.labels.assign(labels->data.begin(), labels->data.begin() + d.size);
  return d;
}

ImageDataset MakeSyntheticDataset(const SyntheticSpec& spec, Split split) {
  ImageDataset d;
  d.channels = spec.channels;
  d.height = spec.height;
  d.width = spec.width;
  d.classes = spec.classes;
  d.size = split == Split::kTrain ? spec.size : std::max<int64_t>(1, spec.size / 10);
  std::mt19937_64 rng(split == Split::kTrain ? 0x5EED : 0x7E57);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> label(0, spec.classes - 1);
  d.images.resize(d.size * d.features());
  for (float& v : d.images) v = pixel(rng);
  d.labels.resize(d.size);
  for (int64_t& l : d.labels) l = label(rng);
  return d;
}

void KeepStratifiedFraction(ImageDataset& d, int k) {
  if (k <= 1) return;
  const int64_t f = d.features();
  std::vector<int64_t> seen(d.classes, 0);
  int64_t out = 0;
  for (int64_t i = 0; i < d.size; ++i) {
    const int64_t c = d.labels[i];
    if (seen[c]++ % k != 0) continue;
    if (out != i) {
      if (d.file_backed()) {
        d.files[out] = std::move(d.files[i]);
      } else {
        std::copy(d.images.begin() + i * f, d.images.begin() + (i + 1) * f,
                  d.images.begin() + out * f);
      }
      d.labels[out] = c;
    }
    ++out;
  }
  d.size = out;
  if (d.file_backed()) {
    d.files.resize(out);
  } else {
    d.images.resize(out * f);
  }
  d.labels.resize(out);
}

EpochSharder::EpochSharder(int64_t dataset_size, int64_t global_batch, int rank, int world,
                           uint64_t seed)
    : size_(dataset_size),
      global_batch_(global_batch),
      local_batch_(global_batch / world),
      rank_(rank),
      seed_(seed),
      steps_per_epoch_(global_batch > 0 ? dataset_size / global_batch : 0),
      perm_(dataset_size) {}

EpochSharder EpochSharder::Local(int64_t shard_size, int64_t min_shard, int64_t global_batch,
                                 int rank, int world, uint64_t seed) {
  EpochSharder s(shard_size, global_batch, rank, world, seed);
  s.local_ = true;
  s.steps_per_epoch_ = s.local_batch_ > 0 ? min_shard / s.local_batch_ : 0;
  return s;
}

void EpochSharder::StartEpoch(int epoch) {
  std::iota(perm_.begin(), perm_.end(), 0);
  // Seeded per (seed, epoch) so every rank draws the same permutation; per (seed, epoch,
  // rank) for a rank's own shard.
  uint64_t key = seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1;
  if (local_) key = key * 0xBF58476D1CE4E5B9ull + static_cast<uint64_t>(rank_) + 1;
  std::mt19937_64 rng(key);
  std::shuffle(perm_.begin(), perm_.end(), rng);
}

std::vector<int64_t> EpochSharder::Batch(int64_t step) const {
  const int64_t begin =
      local_ ? step * local_batch_ : step * global_batch_ + rank_ * local_batch_;
  return std::vector<int64_t>(perm_.begin() + begin, perm_.begin() + begin + local_batch_);
}

}  // namespace joule::worker
