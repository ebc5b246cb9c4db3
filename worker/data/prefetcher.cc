#include "worker/data/prefetcher.h"

#include <stdexcept>
#include <string>

namespace joule::worker {

BatchPrefetcher::BatchPrefetcher(torch::Tensor images, torch::Tensor labels)
    : images_(std::move(images)), labels_(std::move(labels)), thread_([this] { Loop(); }) {}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchPrefetcher::Submit(std::vector<int64_t> indices) {
  auto r = std::make_shared<Request>();
  r->indices = std::move(indices);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(r));
  }
  cv_.notify_all();
}

std::pair<torch::Tensor, torch::Tensor> BatchPrefetcher::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() && queue_.front()->done; });
  std::shared_ptr<Request> r = std::move(queue_.front());
  queue_.pop_front();
  --next_to_gather_;
  if (!r->error.empty()) throw std::runtime_error("gathering a batch: " + r->error);
  return {std::move(r->x), std::move(r->y)};
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
    torch::Tensor x, y;
    std::string error;
    try {
      torch::NoGradGuard no_grad;
      torch::Tensor idx = torch::from_blob(
          r->indices.data(), {static_cast<int64_t>(r->indices.size())}, torch::kLong);
      x = images_.index_select(0, idx);
      y = labels_.index_select(0, idx);
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {  // nothing may escape this thread: it would end the process
      error = "an unknown exception while gathering a batch";
    }
    lock.lock();
    r->error = std::move(error);
    r->x = std::move(x);
    r->y = std::move(y);
    r->done = true;
    cv_.notify_all();
  }
}

}  // namespace joule::worker
