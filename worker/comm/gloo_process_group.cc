#include "worker/comm/gloo_process_group.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

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
  return absl::UnavailableError(absl::StrCat("gloo ", what, " on rank ", rank, ": ", e.what()));
}

}  // namespace

GlooProcessGroup::GlooProcessGroup(int rank, int size, std::shared_ptr<gloo::Context> context)
    : rank_(rank), size_(size), context_(std::move(context)) {}

GlooProcessGroup::~GlooProcessGroup() = default;

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

absl::Status GlooProcessGroup::AllreduceSum(std::span<float> data) {
  if (size_ == 1 || data.empty()) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(next_tag_++);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "allreduce", rank_);
  }
  return absl::OkStatus();
}

absl::Status GlooProcessGroup::Broadcast(std::span<float> data, int root) {
  if (size_ == 1 || data.empty()) return absl::OkStatus();
  try {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setRoot(root);
    opts.setTag(next_tag_++);
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "broadcast", rank_);
  }
  return absl::OkStatus();
}

absl::Status GlooProcessGroup::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  try {
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag_++);
    gloo::barrier(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "barrier", rank_);
  }
  return absl::OkStatus();
}

}  // namespace joule::worker
