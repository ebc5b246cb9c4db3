#include "worker/comm/gloo_process_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/comm/half.h"
#include "worker/comm/shm_sync.h"

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

// Thrown on the communication thread when the ranks' calls differ (Agree); Loop turns it
// into FAILED_PRECONDITION.
class Disagreement : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Exchanges every rank's `call` (a fixed-size allgather, which cannot itself mismatch)
// and throws Disagreement on every rank when they differ, before the collective runs:
// Gloo would otherwise fail on its own transport thread, or mix up buffers.
void Agree(const std::shared_ptr<gloo::Context>& c, uint32_t tag, const CollectiveCall& call,
           const char* what) {
  uint64_t mine[3] = {call.kind, call.count, call.arg};
  std::vector<uint64_t> all(3 * static_cast<size_t>(c->size));
  gloo::AllgatherOptions opts(c);
  opts.setInput(mine, 3);
  opts.setOutput(all.data(), all.size());
  opts.setTag(tag);
  gloo::allgather(opts);
  std::vector<CollectiveCall> calls(c->size);
  for (int r = 0; r < c->size; ++r) calls[r] = {all[3 * r], all[3 * r + 1], all[3 * r + 2]};
  absl::Status s = CompareCalls("gloo", what, c->rank, calls);
  if (!s.ok()) throw Disagreement(std::string(s.message()));
}

absl::Status FromGloo(const std::exception& e, const char* what, int rank) {
  const std::string msg = e.what();
  const std::string text = absl::StrCat("gloo ", what, " on rank ", rank, ": ", msg);
  if (msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos) {
    return absl::DeadlineExceededError(text);
  }
  return absl::UnavailableError(text);
}

}  // namespace

// Spins up to kSpin for `ready` before the caller sleeps on a condition variable: a
// collective or the next queued one often completes within a few tens of microseconds of
// the wait, and sleeping costs a context switch and a wake-up on each side.
constexpr std::chrono::microseconds kSpin{50};
template <typename Ready>
void SpinUntil(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= until) return;
    CpuRelax();
  }
}

struct GlooProcessGroup::State {
  std::shared_ptr<gloo::Context> context;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Op>> queue;  // issued, not started
  bool busy = false;                      // an operation runs on the thread
  bool stop = false;
  bool aborted = false;
  std::atomic<bool> abort_flag{false};  // aborted, readable without the lock (spinning)
  std::atomic<size_t> queued{0};        // queue.size(), readable without the lock

  // The communication thread's loop. Holds `self` so the state outlives an abandoned op.
  static void Loop(std::shared_ptr<State> self);
};

class GlooProcessGroup::Op final : public Work {
 public:
  Op(std::shared_ptr<State> state, const char* what, int rank,
     std::function<void(const std::shared_ptr<gloo::Context>&)> fn)
      : state_(std::move(state)), what_(what), rank_(rank), fn_(std::move(fn)) {}

  absl::Status Wait() override {
    SpinUntil([&] {
      return finished_.load(std::memory_order_acquire) ||
             state_->abort_flag.load(std::memory_order_acquire);
    });
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return done_ || state_->aborted; });
    // The first answer is the answer: an op abandoned at Abort() stays ABORTED even if it
    // later completes on the communication thread.
    if (!answer_) answer_ = Answer();
    return *answer_;
  }

 private:
  absl::Status Answer() const {
    if (!done_) {
      return absl::AbortedError(absl::StrCat("gloo ", what_, " on rank ", rank_,
                                             ": aborted while waiting for a peer"));
    }
    if (!ran_) return absl::AbortedError(absl::StrCat("gloo ", what_, " on rank ", rank_, ": ", error_));
    if (disagreement_) return absl::FailedPreconditionError(error_);
    if (!error_.empty()) return FromGloo(std::runtime_error(error_), what_, rank_);
    return absl::OkStatus();
  }

  friend struct GlooProcessGroup::State;
  friend class GlooProcessGroup;
  std::shared_ptr<State> state_;
  const char* what_;
  int rank_;
  std::function<void(const std::shared_ptr<gloo::Context>&)> fn_;
  bool done_ = false;  // guarded by state_->mu
  std::atomic<bool> finished_{false};  // done_, readable without the lock (spinning)
  bool ran_ = false;   // guarded by state_->mu: false when skipped (aborted, destroyed)
  std::string error_;  // guarded by state_->mu
  bool disagreement_ = false;  // guarded by state_->mu: error_ is the ranks' calls differing
  std::optional<absl::Status> answer_;  // guarded by state_->mu: what Wait() returned
};

void GlooProcessGroup::State::Loop(std::shared_ptr<State> self) {
  std::unique_lock<std::mutex> lock(self->mu);
  while (true) {
    if (self->queue.empty() && !self->stop) {
      lock.unlock();
      SpinUntil([&] { return self->queued.load(std::memory_order_acquire) > 0; });
      lock.lock();
    }
    self->cv.wait(lock, [&] { return self->stop || !self->queue.empty(); });
    if (self->stop) {  // the group is being destroyed: nothing queued will run
      for (auto& op : self->queue) {
        op->done_ = true;
        op->error_ = "the process group was destroyed";
        op->fn_ = nullptr;
      }
      self->queue.clear();
      self->cv.notify_all();
      return;
    }
    std::shared_ptr<Op> op = std::move(self->queue.front());
    self->queue.pop_front();
    self->queued.store(self->queue.size(), std::memory_order_release);
    if (self->aborted) {  // issued, then abandoned before it started: skip it
      op->done_ = true;
      op->error_ = "aborted before it started";
      self->cv.notify_all();
      continue;
    }
    self->busy = true;
    op->ran_ = true;
    lock.unlock();
    std::string error;
    bool disagreement = false;
    // Nothing escapes this thread: every failure becomes the op's status.
    try {
      op->fn_(self->context);
    } catch (const Disagreement& e) {
      error = e.what();
      disagreement = true;
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    op->fn_ = nullptr;  // drops the buffers it held
    lock.lock();
    self->busy = false;
    op->done_ = true;
    op->error_ = std::move(error);
    op->disagreement_ = disagreement;
    // A hint for Wait's spin only (it reads the op under the lock): set last all the same.
    op->finished_.store(true, std::memory_order_release);
    self->cv.notify_all();
  }
}

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
    abandoned = state_->busy;
    state_->aborted = true;  // releases waiters; nothing queued starts
    state_->abort_flag.store(true, std::memory_order_release);
    state_->cv.notify_all();
  }
  if (abandoned) {
    // An operation still waits on a peer: let it finish on its own (Gloo's timeout bounds
    // it); the thread co-owns everything it touches.
    thread_.detach();
  } else {
    thread_.join();
  }
}

void GlooProcessGroup::Abort() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->aborted) return;
  state_->aborted = true;
  state_->abort_flag.store(true, std::memory_order_release);
  state_->cv.notify_all();
}

std::shared_ptr<Work> GlooProcessGroup::Enqueue(const char* what,
                                                std::function<void(const std::shared_ptr<gloo::Context>&)> fn) {
  auto op = std::make_shared<Op>(state_, what, rank_, std::move(fn));
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->aborted) {
    op->done_ = true;
    op->error_ = "aborted";
    op->fn_ = nullptr;
    return op;
  }
  state_->queue.push_back(op);
  state_->queued.store(state_->queue.size(), std::memory_order_release);
  state_->cv.notify_all();
  return op;
}

absl::StatusOr<std::unique_ptr<GlooProcessGroup>> GlooProcessGroup::Create(
    int rank, int size, KvClient& kv, const GlooOptions& options) {
  // Gloo writes to its peers' sockets with plain writes: a peer that died would deliver
  // SIGPIPE and end this process instead of failing the collective. Ignore it once, as
  // Python (and so PyTorch) does at start-up, unless the program chose a handler.
  static std::once_flag sigpipe_once;
  std::call_once(sigpipe_once, [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
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


namespace {

static_assert(sizeof(gloo::float16) == sizeof(Half));

// Gloo's reduce-function signature for gloo::sum<gloo::float16>, with the same results
// (half.h: SumHalves), vectorised: Gloo's own converts one element at a time.
void SumHalfReduce(void* c, const void* a, const void* b, size_t n) {
  SumHalves(static_cast<const Half*>(a), static_cast<const Half*>(b), static_cast<Half*>(c), n);
}

// Two ranks: each sends its whole buffer to the other and receives the other's into
// this thread's scratch, in one round, where Gloo's ring takes two (a reduce-scatter and
// an allgather of half the buffer each, a wait between them); the bytes sent are the same,
// n elements each way. Returns the peer's values; the caller sums. The scratch belongs to
// the communication thread (one per group), which runs one collective at a time.
template <typename T>
const T* ReceiveFromPeer(const std::shared_ptr<gloo::Context>& c, uint32_t tag, T* data,
                         size_t n) {
  thread_local std::vector<T> scratch;
  if (scratch.size() < n) scratch.resize(n);
  const int peer = 1 - c->rank;
  const uint64_t slot = gloo::Slot::build(gloo::kAllreduceSlotPrefix, tag);
  std::unique_ptr<gloo::transport::UnboundBuffer> in =
      c->createUnboundBuffer(scratch.data(), n * sizeof(T));
  std::unique_ptr<gloo::transport::UnboundBuffer> out = c->createUnboundBuffer(data, n * sizeof(T));
  in->recv(peer, slot);
  out->send(peer, slot);
  // Gloo throws its IoException ("Timed out ...") past the context's timeout, and
  // returns false when the wait was aborted.
  const bool received = in->waitRecv(c->getTimeout());
  const bool sent = out->waitSend(c->getTimeout());  // never leave a send pending
  if (!received || !sent) throw std::runtime_error("the exchange with the peer was aborted");
  return scratch.data();
}

// A Gloo sum allreduce of `n` floats at `data`: for two ranks one exchange and a + b on
// each side (IEEE addition is commutative: both ranks hold the same bits, those of Gloo's
// ring for two ranks), else Gloo's ring.
void AllreduceFloatsOn(const std::shared_ptr<gloo::Context>& c, uint32_t tag, float* data,
                       size_t n) {
  if (c->size == 2) {
    const float* theirs = ReceiveFromPeer(c, tag, data, n);
    for (size_t i = 0; i < n; ++i) data[i] += theirs[i];
    return;
  }
  gloo::AllreduceOptions opts(c);
  opts.setOutput(data, n);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  opts.setTag(tag);
  gloo::allreduce(opts);
}

// A Gloo sum allreduce of `n` half values at `data`, scaled by `scale` when it is not 1
// (two ranks: one exchange, as AllreduceFloatsOn).
void AllreduceHalfOn(const std::shared_ptr<gloo::Context>& c, uint32_t tag, gloo::float16* data,
                     size_t n, float scale) {
  if (c->size == 2) {
    const gloo::float16* theirs = ReceiveFromPeer(c, tag, data, n);
    SumHalfReduce(data, data, theirs, n);
    if (scale != 1.0f) ScaleHalves(reinterpret_cast<Half*>(data), n, scale);
    return;
  }
  gloo::AllreduceOptions opts(c);
  opts.setOutput(data, n);
  opts.setReduceFunction(&SumHalfReduce);
  opts.setTag(tag);
  gloo::allreduce(opts);
  if (scale != 1.0f) ScaleHalves(reinterpret_cast<Half*>(data), n, scale);
}

}  // namespace

std::shared_ptr<Work> GlooProcessGroup::AllreduceAsync(SharedBuffer data, ReduceOp op,
                                                       Precision wire) {
  return StartAllreduce(std::move(data), op, wire, NextTags(), /*check=*/true);
}

std::shared_ptr<Work> GlooProcessGroup::AllreduceAgreedAsync(SharedBuffer data, ReduceOp op,
                                                             Precision wire) {
  return StartAllreduce(std::move(data), op, wire, NextAgreedTag(), /*check=*/false);
}

std::shared_ptr<Work> GlooProcessGroup::StartAllreduce(SharedBuffer data, ReduceOp op,
                                                       Precision wire, uint32_t first_tag,
                                                       bool check) {
  const int world = size_;
  return Enqueue("allreduce", [first_tag, check, op, world, wire, data = std::move(data)](
                                  const std::shared_ptr<gloo::Context>& c) {
    if (world == 1) return;
    uint32_t tag = first_tag;
    if (check) {
      Agree(c, tag,
            {wire == Precision::kFloat16 ? CollectiveCall::kAllreduceFp16Wire
                                         : CollectiveCall::kAllreduce,
             data->size(), static_cast<uint64_t>(op)},
            "allreduce");
      ++tag;
    }
    if (data->empty()) return;
    const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(world) : 1.0f;
    if (wire == Precision::kFloat16) {
      // Compressed on this (the communication) thread, so backward is not held up. As
      // DDP's fp16_compress_hook: to half, divided by the world size *before* the half
      // sum (so N large gradients do not overflow it), summed, back to float.
      std::vector<gloo::float16> half(data->size());
      Half* values = reinterpret_cast<Half*>(half.data());
      ToFp16Wire(data->data(), scale, values, half.size());
      AllreduceHalfOn(c, tag, half.data(), half.size(), 1.0f);
      HalvesToFloats(values, data->data(), half.size());
      return;
    }
    AllreduceFloatsOn(c, tag, data->data(), data->size());
    if (scale != 1.0f) {
      for (float& x : *data) x *= scale;
    }
  });
}

absl::Status GlooProcessGroup::AllreduceHalf(std::span<Half> data, ReduceOp op) {
  if (size_ == 1) return absl::OkStatus();
  auto buffer = std::make_shared<std::vector<gloo::float16>>(data.size());
  std::memcpy(static_cast<void*>(buffer->data()), data.data(), data.size_bytes());
  const uint32_t tag = NextTags();
  const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(size_) : 1.0f;
  auto fn = [tag, scale, op, buffer](const std::shared_ptr<gloo::Context>& c) {
    Agree(c, tag, {CollectiveCall::kAllreduceHalf, buffer->size(), static_cast<uint64_t>(op)},
          "allreduce");
    if (buffer->empty()) return;
    AllreduceHalfOn(c, tag + 1, buffer->data(), buffer->size(), scale);
  };
  absl::Status s = Enqueue("allreduce", std::move(fn))->Wait();
  if (s.ok()) std::memcpy(data.data(), buffer->data(), data.size_bytes());
  return s;
}

absl::Status GlooProcessGroup::Allreduce(std::span<float> data, ReduceOp op) {
  if (size_ == 1) return absl::OkStatus();
  auto buffer = std::make_shared<Buffer>(data.begin(), data.end());
  if (absl::Status s = AllreduceAsync(buffer, op, Precision::kFloat32)->Wait(); !s.ok()) return s;
  std::copy(buffer->begin(), buffer->end(), data.begin());
  return absl::OkStatus();
}

absl::Status GlooProcessGroup::Broadcast(std::span<float> data, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " of world size ", size_));
  }
  if (size_ == 1) return absl::OkStatus();
  auto buffer = std::make_shared<Buffer>(data.begin(), data.end());
  const uint32_t tag = NextTags();
  absl::Status s = Enqueue("broadcast", [tag, root, buffer](const std::shared_ptr<gloo::Context>& c) {
    Agree(c, tag, {CollectiveCall::kBroadcast, buffer->size(), static_cast<uint64_t>(root)},
          "broadcast");
    if (buffer->empty()) return;
    gloo::BroadcastOptions opts(c);
    opts.setOutput(buffer->data(), buffer->size());
    opts.setRoot(root);
    opts.setTag(tag + 1);
    gloo::broadcast(opts);
  })->Wait();
  if (s.ok()) std::copy(buffer->begin(), buffer->end(), data.begin());
  return s;
}

absl::Status GlooProcessGroup::Allgather(std::span<const float> input, std::span<float> output) {
  if (absl::Status s = CheckAllgatherSizes(input.size(), output.size(), size_); !s.ok()) {
    return s;
  }
  if (size_ == 1) {
    std::copy(input.begin(), input.end(), output.begin());
    return absl::OkStatus();
  }
  auto in = std::make_shared<Buffer>(input.begin(), input.end());
  auto out = std::make_shared<Buffer>(output.size());
  const uint32_t tag = NextTags();
  absl::Status s = Enqueue("allgather", [tag, in, out](const std::shared_ptr<gloo::Context>& c) {
    Agree(c, tag, {CollectiveCall::kAllgather, in->size(), 0}, "allgather");
    if (in->empty()) return;
    gloo::AllgatherOptions opts(c);
    opts.setInput(in->data(), in->size());
    opts.setOutput(out->data(), out->size());
    opts.setTag(tag + 1);
    gloo::allgather(opts);
  })->Wait();
  if (s.ok()) std::copy(out->begin(), out->end(), output.begin());
  return s;
}

absl::Status GlooProcessGroup::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  const uint32_t tag = NextTags();
  // The agreement's allgather is itself a barrier.
  return Enqueue("barrier", [tag](const std::shared_ptr<gloo::Context>& c) {
    Agree(c, tag, {CollectiveCall::kBarrier, 0, 0}, "barrier");
  })->Wait();
}

absl::StatusOr<std::vector<LinkProbe>> GlooProcessGroup::ProbeLinks(int64_t bytes) {
  if (size_ == 1 || bytes <= 0) return std::vector<LinkProbe>{};
  const int rounds = RoundRobinRounds(size_);
  const uint32_t tag = NextTags();
  std::vector<uint32_t> round_tags;
  for (int r = 0; r < rounds; ++r) round_tags.push_back(NextTags());
  auto probes = std::make_shared<std::vector<LinkProbe>>();
  const int rank = rank_, size = size_;
  absl::Status s = Enqueue("link probe", [=](const std::shared_ptr<gloo::Context>& c) {
    Agree(c, tag, {CollectiveCall::kProbeLinks, static_cast<uint64_t>(bytes), 0}, "link probe");
    std::vector<char> out(static_cast<size_t>(bytes), 'j'), in(static_cast<size_t>(bytes));
    auto send = c->createUnboundBuffer(out.data(), out.size());
    auto recv = c->createUnboundBuffer(in.data(), in.size());
    for (int r = 0; r < rounds; ++r) {
      const int peer = RoundRobinPartner(rank, size, r);
      if (peer >= 0) {
        // A slot of its own (prefix 0x4a, "J", beside Gloo's collectives' 0x01..0x08).
        const uint64_t slot = gloo::Slot::build(0x4a, round_tags[r]);
        const auto t0 = std::chrono::steady_clock::now();
        recv->recv(peer, slot);
        send->send(peer, slot);
        if (!recv->waitRecv(nullptr, c->getTimeout())) throw gloo::IoException("aborted");
        const auto received = std::chrono::steady_clock::now();
        if (!send->waitSend(nullptr, c->getTimeout())) throw gloo::IoException("aborted");
        probes->push_back(
            {peer, bytes, std::chrono::duration<double>(received - t0).count()});
      }
      // The next round's pairs start together, and share no transfer with this one's.
      gloo::BarrierOptions barrier(c);
      barrier.setTag(round_tags[r] + 1);
      gloo::barrier(barrier);
    }
  })->Wait();
  if (!s.ok()) return s;
  return *probes;
}

}  // namespace joule::worker
