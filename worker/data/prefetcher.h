#ifndef JOULE_WORKER_DATA_PREFETCHER_H_
#define JOULE_WORKER_DATA_PREFETCHER_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace joule::worker {

// Gathers the examples of upcoming steps on a thread of its own, so that the training
// thread finds each step's batch ready (PyTorch's DataLoader with one worker and a
// prefetch factor, without the process). Requests are served in order.
//
// `images` [N, ...] and `labels` [N] stay owned by the caller and must outlive this
// object. Submit() and Next() are called from one thread.
class BatchPrefetcher {
 public:
  BatchPrefetcher(torch::Tensor images, torch::Tensor labels);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Queues the gather of `indices` (each in [0, N)).
  void Submit(std::vector<int64_t> indices);
  // The oldest queued batch: (images[indices], labels[indices]), contiguous. Blocks until
  // it is gathered. Precondition: more Submit() than Next() calls. Throws
  // std::runtime_error if the gather failed (LibTorch's error).
  std::pair<torch::Tensor, torch::Tensor> Next();
  // Drops whatever is queued or gathered (e.g. at the end of an epoch).
  void Clear();

 private:
  struct Request {
    std::vector<int64_t> indices;
    torch::Tensor x, y;
    std::string error;  // of a gather that threw
    bool done = false;
  };
  void Loop();

  torch::Tensor images_, labels_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;  // submitted, oldest first
  size_t next_to_gather_ = 0;                   // index into queue_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_PREFETCHER_H_
