#ifndef JOULE_WORKER_DATA_IMAGE_BATCHES_H_
#define JOULE_WORKER_DATA_IMAGE_BATCHES_H_

// Includes LibTorch: only worker/train .cc files, worker/data and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/image_transform.h"
#include "worker/data/open_beneath.h"

namespace joule::worker {

// The largest image file a job may name: larger ones count as corrupt.
inline constexpr int64_t kMaxImageFileBytes = int64_t{64} << 20;

struct ImageBatchOptions {
  ImageTransformOptions transform;
  uint64_t seed = 0;              // the job's: ExampleRng keys (seed, epoch, index)
  int threads = 1;                // decoding threads per batch, >= 1
  int64_t max_corrupt = 10;       // distinct failing files tolerated
  FileOpener open = OpenPlain;    // how files are opened (beneath the worker's roots)
};

// Decodes and transforms the examples of a file-backed split (image_folder.h) into
// batches, `threads` images at a time. Thread-safe (the corrupt-file count is shared).
class ImageBatchLoader {
 public:
  // `split` (file-backed) is not owned and must outlive this.
  ImageBatchLoader(const ImageDataset& split, ImageBatchOptions options);

  using Batch = std::pair<torch::Tensor, torch::Tensor>;  // [n, 3, S, S] float, [n] int64

  // The training batch of `indices` in `epoch` (TrainTransform, ExampleRng(seed, epoch,
  // index)): exactly indices.size() examples. A file that fails to read or decode is
  // counted and logged once, and its slot takes the next good example of the batch
  // (cyclically), so batches keep their size. Errors: DATA_LOSS naming the file when
  // more than max_corrupt distinct files have failed, or when no example of the batch
  // decodes.
  absl::StatusOr<Batch> Train(const std::vector<int64_t>& indices, int64_t epoch);

  // The evaluation batch of `indices` (EvalTransform, or TrainTransform with
  // ExampleRng(seed, -1, index) when transform.eval_uses_train_transform), without the files that fail
  // (counted as for Train): n <= indices.size() examples. Errors: as Train's threshold.
  absl::StatusOr<Batch> Eval(const std::vector<int64_t>& indices);

  int64_t size() const { return split_.size; }
  // Distinct files that failed so far.
  int64_t corrupt_files() const;

 private:
  // Runs `one(slot)` for every slot in [0, n) on up to `threads` threads; each slot's
  // status (an exception it threw: INTERNAL with its message).
  std::vector<absl::Status> ForEach(int64_t n,
                                    const std::function<absl::Status(int64_t)>& one) const;
  // Records a failed file; the error to return once past the threshold, else OK.
  absl::Status CountCorrupt(int64_t index, const absl::Status& why);

  const ImageDataset& split_;
  ImageBatchOptions options_;
  mutable std::mutex mu_;
  std::set<int64_t> corrupt_;  // example indices whose file failed
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_IMAGE_BATCHES_H_
