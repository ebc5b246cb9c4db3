#include "worker/data/image_batches.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/data/image_folder.h"

namespace joule::worker {

ImageBatchLoader::ImageBatchLoader(const ImageDataset& split, ImageBatchOptions options)
    : split_(split), options_(std::move(options)) {
  options_.threads = std::max(1, options_.threads);
}

int64_t ImageBatchLoader::corrupt_files() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(corrupt_.size());
}

std::vector<absl::Status> ImageBatchLoader::ForEach(
    int64_t n, const std::function<absl::Status(int64_t)>& one) const {
  std::vector<absl::Status> status(static_cast<size_t>(n));
  // Nothing may escape a pool thread (it would end the process): an exception (bad_alloc,
  // a LibTorch error) becomes the slot's error.
  auto guarded = [&](int64_t i) {
    try {
      status[i] = one(i);
    } catch (const std::exception& e) {
      status[i] = absl::InternalError(e.what());
    } catch (...) {
      status[i] = absl::InternalError("an unknown exception");
    }
  };
  const int64_t threads = std::min<int64_t>(options_.threads, n);
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) guarded(i);
    return status;
  }
  std::atomic<int64_t> next{0};
  auto run = [&] {
    for (int64_t i = next++; i < n; i = next++) guarded(i);
  };
  {
    std::vector<std::jthread> pool;
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(run);
    run();
  }
  return status;
}

absl::Status ImageBatchLoader::CountCorrupt(int64_t index, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (corrupt_.insert(index).second) {
    spdlog::warn("skipping an image that does not load ({} of at most {}): {}", corrupt_.size(),
                 options_.max_corrupt, std::string(why.message()));
  }
  if (static_cast<int64_t>(corrupt_.size()) > options_.max_corrupt) {
    return absl::DataLossError(absl::StrCat(
        corrupt_.size(), " images failed to load, more than max_corrupt_images ",
        options_.max_corrupt, "; the last: ", why.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ImageBatchLoader::Batch> ImageBatchLoader::Train(
    const std::vector<int64_t>& indices, int64_t epoch) {
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t side = split_.height;
  torch::Tensor x = torch::empty({n, 3, side, side}, torch::kFloat32);
  torch::Tensor y = torch::empty({n}, torch::kLong);
  const std::vector<absl::Status> failed = ForEach(n, [&](int64_t slot) -> absl::Status {
    const int64_t index = indices[slot];
    const std::string& path = split_.files[index];
    y[slot] = split_.labels[index];
    absl::StatusOr<std::vector<uint8_t>> bytes =
        ReadWholeFile(path, options_.open, kMaxImageFileBytes);
    if (!bytes.ok()) return bytes.status();
    ExampleRng rng(options_.seed, epoch, index);
    absl::StatusOr<torch::Tensor> image = TrainTransform(*bytes, path, options_.transform, rng);
    if (!image.ok()) return image.status();
    x[slot].copy_(*image);
    return absl::OkStatus();
  });
  std::vector<int64_t> bad;
  for (int64_t slot = 0; slot < n; ++slot) {
    if (failed[slot].ok()) continue;
    bad.push_back(slot);
    if (absl::Status s = CountCorrupt(indices[slot], failed[slot]); !s.ok()) return s;
  }
  if (static_cast<int64_t>(bad.size()) == n && n > 0) {
    return absl::DataLossError(
        absl::StrCat("no image of a batch of ", n, " loads; the first: ", failed[0].message()));
  }
  for (int64_t slot : bad) {
    int64_t from = (slot + 1) % n;
    while (!failed[from].ok()) from = (from + 1) % n;
    x[slot].copy_(x[from]);
    y[slot] = y[from];
  }
  return Batch{x, y};
}

absl::StatusOr<ImageBatchLoader::Batch> ImageBatchLoader::Eval(
    const std::vector<int64_t>& indices) {
  const int64_t n = static_cast<int64_t>(indices.size());
  std::vector<torch::Tensor> images(static_cast<size_t>(n));
  const std::vector<absl::Status> failed = ForEach(n, [&](int64_t slot) -> absl::Status {
    const std::string& path = split_.files[indices[slot]];
    absl::StatusOr<std::vector<uint8_t>> bytes =
        ReadWholeFile(path, options_.open, kMaxImageFileBytes);
    if (!bytes.ok()) return bytes.status();
    // The paper's quirk, when asked: the training pipeline with draws fixed per example
    // (epoch -1), the same at every evaluation.
    ExampleRng rng(options_.seed, -1, indices[slot]);
    absl::StatusOr<torch::Tensor> image =
        options_.transform.eval_uses_train_transform
            ? TrainTransform(*bytes, path, options_.transform, rng)
            : EvalTransform(*bytes, path, options_.transform);
    if (!image.ok()) return image.status();
    images[slot] = *std::move(image);
    return absl::OkStatus();
  });
  std::vector<torch::Tensor> kept;
  std::vector<int64_t> labels;
  for (int64_t slot = 0; slot < n; ++slot) {
    if (!failed[slot].ok()) {
      if (absl::Status s = CountCorrupt(indices[slot], failed[slot]); !s.ok()) return s;
      continue;
    }
    kept.push_back(std::move(images[slot]));
    labels.push_back(split_.labels[indices[slot]]);
  }
  const int64_t side = split_.height;
  torch::Tensor x = kept.empty() ? torch::empty({0, 3, side, side}) : torch::stack(kept);
  return Batch{x, torch::tensor(labels, torch::kLong).reshape({-1})};
}

}  // namespace joule::worker
