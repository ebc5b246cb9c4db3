#include "worker/data/prefetcher.h"

#include <string>
#include <utility>

namespace joule::worker {

BatchPrefetcher::BatchPrefetcher(torch::Tensor images, torch::Tensor labels)
    : BatchPrefetcher([images = std::move(images), labels = std::move(labels)](
                          const std::vector<int64_t>& indices, int64_t) -> absl::StatusOr<Batch> {
        torch::Tensor idx =
            torch::from_blob(const_cast<int64_t*>(indices.data()),
                             {static_cast<int64_t>(indices.size())}, torch::kLong);
        return Batch{images.index_select(0, idx), labels.index_select(0, idx)};
      }) {}

BatchPrefetcher::BatchPrefetcher(Gather gather)
    : gather_(std::move(gather)), thread_([this] { Loop(); }) {}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchPrefetcher::Submit(std::vector<int64_t> indices, int64_t tag) {
  auto r = std::make_shared<Request>();
  r->indices = std::move(indices);
  r->tag = tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(r));
  }
  cv_.notify_all();
}

absl::StatusOr<BatchPrefetcher::Batch> BatchPrefetcher::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() && queue_.front()->done; });
  std::shared_ptr<Request> r = std::move(queue_.front());
  queue_.pop_front();
  --next_to_gather_;
  return std::move(r->batch);
}

void BatchPrefetcher::Clear() {
  std::unique_lock<std::mutex> lock(mu_);
  // Let a gather in progress finish (it writes into its own request), then drop all.
  cv_.wait(lock, [&] { return next_to_gather_ == 0 || queue_[next_to_gather_ - 1]->done; });
  queue_.clear();
  next_to_gather_ = 0;
}

void BatchPrefetcher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || next_to_gather_ < queue_.size(); });
    if (stop_) return;
    std::shared_ptr<Request> r = queue_[next_to_gather_++];
    lock.unlock();
    absl::StatusOr<Batch> batch;
    try {
      torch::NoGradGuard no_grad;
      batch = gather_(r->indices, r->tag);
    } catch (const std::exception& e) {
      batch = absl::InternalError(std::string("gathering a batch: ") + e.what());
    } catch (...) {  // nothing may escape this thread: it would end the process
      batch = absl::InternalError("gathering a batch: an unknown exception");
    }
    lock.lock();
    r->batch = std::move(batch);
    r->done = true;
    cv_.notify_all();
  }
}

}  // namespace joule::worker
