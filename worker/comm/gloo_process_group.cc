#include "worker/comm/gloo_process_group.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

// Gloo's rendezvous store over a KvClient. Gloo expects exceptions on failure.
class KvStore final : public gloo::rendezvous::Store {
 public:
  KvStore(KvClient& kv, std::chrono::milliseconds timeout) : kv_(kv), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = kv_.Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = kv_.Get(key, timeout_);
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    absl::Status s = kv_.Wait(keys, timeout);
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }

 private:
  KvClient& kv_;
  std::chrono::milliseconds timeout_;
};

absl::Status FromGloo(const std::exception& e, const char* what, int rank) {
  const std::string msg = e.what();
  const std::string text = absl::StrCat("gloo ", what, " on rank ", rank, ": ", msg);
  if (msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos) {
    return absl::DeadlineExceededError(text);
  }
  return absl::UnavailableError(text);
}

}  // namespace

struct GlooProcessGroup::State {
  std::shared_ptr<gloo::Context> context;
  std::vector<float> buffer;  // what collectives read and write
  std::mutex mu;
  std::condition_variable cv;
  std::function<void(State&)> op;  // the pending operation
  bool running = false;            // op handed over and not finished
  bool stop = false;
  bool aborted = false;
  std::string error;               // of the last operation

  // The communication thread's loop. Holds `self` so the state outlives an abandoned op.
  static void Loop(std::shared_ptr<State> self) {
    std::unique_lock<std::mutex> lock(self->mu);
    while (true) {
      self->cv.wait(lock, [&] { return self->stop || self->op; });
      if (!self->op) return;
      auto op = std::move(self->op);
      self->op = nullptr;
      if (self->aborted) {  // handed over, then abandoned before it started: skip it
        self->running = false;
        self->cv.notify_all();
        continue;
      }
      lock.unlock();
      std::string error;
      try {
        op(*self);
      } catch (const std::exception& e) {
        error = e.what();
      }
      lock.lock();
      self->error = std::move(error);
      self->running = false;
      self->cv.notify_all();
      if (self->stop) return;
    }
  }
};

GlooProcessGroup::GlooProcessGroup(int rank, int size, std::shared_ptr<gloo::Context> context)
    : rank_(rank), size_(size), state_(std::make_shared<State>()) {
  state_->context = std::move(context);
  thread_ = std::thread(&State::Loop, state_);
}

GlooProcessGroup::~GlooProcessGroup() {
  bool abandoned;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
    abandoned = state_->running;
    state_->cv.notify_all();
  }
  if (abandoned) {
    // An aborted operation still waits on a peer: let it finish on its own (Gloo's
    // timeout bounds it); the thread owns what it touches.
    thread_.detach();
  } else {
    thread_.join();
  }
}

void GlooProcessGroup::Abort() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->aborted) return;
  state_->aborted = true;
  state_->cv.notify_all();
}

absl::Status GlooProcessGroup::Run(const char* what, std::function<void(State&)> op) {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (state_->aborted) {
    return absl::AbortedError(absl::StrCat("gloo ", what, " on rank ", rank_, ": aborted"));
  }
  state_->op = std::move(op);
  state_->running = true;
  state_->cv.notify_all();
  state_->cv.wait(lock, [&] { return !state_->running || state_->aborted; });
  if (state_->running) {
    return absl::AbortedError(absl::StrCat("gloo ", what, " on rank ", rank_,
                                           ": aborted while waiting for a peer"));
  }
  if (!state_->error.empty()) {
    const std::runtime_error e(state_->error);
    return FromGloo(e, what, rank_);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GlooProcessGroup>> GlooProcessGroup::Create(
    int rank, int size, KvClient& kv, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of world size ", size));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    KvStore store(kv, options.timeout);
    context->connectFullMesh(store, device);
    return std::unique_ptr<GlooProcessGroup>(new GlooProcessGroup(rank, size, context));
  } catch (const std::exception& e) {
    return FromGloo(e, "rendezvous", rank);
  }
}

bool GlooProcessGroup::aborted() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->aborted;
}

absl::Status GlooProcessGroup::AllreduceSum(std::span<float> data) {
  if (size_ == 1 || data.empty()) return absl::OkStatus();
  // Once aborted, an abandoned operation may still own the buffer: do not touch it.
  if (aborted()) return absl::AbortedError(absl::StrCat("gloo allreduce on rank ", rank_, ": aborted"));
  state_->buffer.assign(data.begin(), data.end());
  const uint32_t tag = next_tag_++;
  absl::Status s = Run("allreduce", [tag](State& st) {
    gloo::AllreduceOptions opts(st.context);
    opts.setOutput(st.buffer.data(), st.buffer.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag);
    gloo::allreduce(opts);
  });
  if (s.ok()) std::copy(state_->buffer.begin(), state_->buffer.end(), data.begin());
  return s;
}

absl::Status GlooProcessGroup::Broadcast(std::span<float> data, int root) {
  if (size_ == 1 || data.empty()) return absl::OkStatus();
  if (aborted()) return absl::AbortedError(absl::StrCat("gloo broadcast on rank ", rank_, ": aborted"));
  state_->buffer.assign(data.begin(), data.end());
  const uint32_t tag = next_tag_++;
  absl::Status s = Run("broadcast", [tag, root](State& st) {
    gloo::BroadcastOptions opts(st.context);
    opts.setOutput(st.buffer.data(), st.buffer.size());
    opts.setRoot(root);
    opts.setTag(tag);
    gloo::broadcast(opts);
  });
  if (s.ok()) std::copy(state_->buffer.begin(), state_->buffer.end(), data.begin());
  return s;
}

absl::Status GlooProcessGroup::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  const uint32_t tag = next_tag_++;
  return Run("barrier", [tag](State& st) {
    gloo::BarrierOptions opts(st.context);
    opts.setTag(tag);
    gloo::barrier(opts);
  });
}

}  // namespace joule::worker
