#ifndef JOULE_WORKER_DATA_PREFETCHER_H_
#define JOULE_WORKER_DATA_PREFETCHER_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace joule::worker {

// Gathers the examples of upcoming steps on a thread of its own, so that the training
// thread finds each step's batch ready (PyTorch's DataLoader with one worker and a
// prefetch factor, without the process). Requests are served in order.
//
// Submit(), Next() and Clear() are called from one thread.
class BatchPrefetcher {
 public:
  using Batch = std::pair<torch::Tensor, torch::Tensor>;
  // Makes the batch of `indices`; `tag` is what Submit() was given with them (e.g. the
  // epoch). Runs on the prefetcher's thread; may fail (the error reaches Next()).
  using Gather =
      std::function<absl::StatusOr<Batch>(const std::vector<int64_t>& indices, int64_t tag)>;

  // Gathers rows of `images` [N, ...] and `labels` [N] (owned by the caller, who keeps
  // them alive) by index.
  BatchPrefetcher(torch::Tensor images, torch::Tensor labels);
  explicit BatchPrefetcher(Gather gather);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Queues the gather of `indices` (each in [0, N) for the tensor form).
  void Submit(std::vector<int64_t> indices, int64_t tag = 0);
  // The oldest queued batch, contiguous. Blocks until it is gathered. Precondition: more
  // Submit() than Next() calls. Errors: the gather's (an exception it threw becomes
  // INTERNAL with its message).
  absl::StatusOr<Batch> Next();
  // Drops whatever is queued or gathered (e.g. at the end of an epoch).
  void Clear();

 private:
  struct Request {
    std::vector<int64_t> indices;
    int64_t tag = 0;
    absl::StatusOr<Batch> batch;
    bool done = false;
  };
  void Loop();

  Gather gather_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;  // submitted, oldest first
  size_t next_to_gather_ = 0;                   // index into queue_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_PREFETCHER_H_
