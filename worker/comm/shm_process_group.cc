#include "worker/comm/shm_process_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "worker/comm/half.h"

namespace joule::worker {
namespace {

constexpr uint64_t kMagic = 0x4a4f554c45534d31;  // "JOULESM1"
constexpr int kMaxRanks = kShmMaxRanks;

// A rank's CollectiveCall, published before the first synchronisation of a collective.
struct alignas(64) CallSlot {
  std::atomic<uint64_t> kind;
  std::atomic<uint64_t> count;
  std::atomic<uint64_t> arg;
};

// out[i] = scale x (slots[0][i] + ... + slots[n-1][i]) for i in [begin, end): the same
// summation order on every rank, so every rank gets bit-identical results.
void ReduceRange(float* __restrict out, float* const* slots, int n, size_t begin, size_t end,
                 float scale) {
  const float* __restrict s0 = slots[0];
  for (size_t i = begin; i < end; ++i) out[i] = s0[i];
  for (int r = 1; r < n; ++r) {
    const float* __restrict s = slots[r];
    for (size_t i = begin; i < end; ++i) out[i] += s[i];
  }
  if (scale != 1.0f) {
    for (size_t i = begin; i < end; ++i) out[i] *= scale;
  }
}

// The group's segment, agreed on through the KV store: rank 0 publishes its name under
// "shm/name" ("!reason" when it could not create it, so that nobody waits for a segment
// that will not come), every rank its verdict under "shm/attached/RANK" ("ok" or why).
class KvSegmentExchange final : public SegmentExchange {
 public:
  KvSegmentExchange(KvClient& kv, int rank, int size, std::chrono::milliseconds timeout)
      : kv_(kv), rank_(rank), size_(size), timeout_(timeout) {}

  absl::Status Publish(const std::string& name, const std::string& error) override {
    (void)kv_.Set("shm/name", error.empty() ? name : "!" + error);
    return error.empty() ? absl::OkStatus() : Fail(error);
  }
  absl::StatusOr<std::string> ReadName() override {
    absl::StatusOr<std::string> v = kv_.Get("shm/name", timeout_);
    if (!v.ok()) return v.status();
    if (!v->empty() && (*v)[0] == '!') return Fail(absl::StrCat("rank 0: ", v->substr(1)));
    return *v;
  }
  absl::Status Vote(const std::string& error) override {
    // Every rank reports, so all ranks agree on the outcome.
    (void)kv_.Set(absl::StrCat("shm/attached/", rank_), error.empty() ? "ok" : error);
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(absl::StrCat("shm/attached/", r));
    if (absl::Status waited = kv_.Wait(keys, timeout_); !waited.ok()) return waited;
    if (!error.empty()) return Fail(error);
    for (int r = 0; r < size_; ++r) {
      absl::StatusOr<std::string> v = kv_.Get(keys[r], timeout_);
      if (!v.ok()) return v.status();
      if (*v != "ok") return Fail(absl::StrCat("rank ", r, ": ", *v));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Fail(const std::string& why) const {
    return absl::UnavailableError(absl::StrCat("shared memory on rank ", rank_, ": ", why));
  }
  KvClient& kv_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

struct ShmProcessGroup::Header {
  uint64_t magic;
  uint32_t world;
  uint32_t pad0;
  uint64_t slot_floats;
  ShmSyncWords sync;  // the counters, futex word and pids of ShmSync
  // NewBuffer: the segment rank 0 made ("" when it could not), and each rank's verdict,
  // 2 x round + 1 when it mapped it, 2 x round when it could not.
  char registration_name[96];
  ShmSyncWords::Line registration_ok[kMaxRanks];
  CallSlot call[kMaxRanks];  // what each rank passes to its current collective
};

// A NewBuffer segment, agreed on through the group's own segment within one round: rank 0
// writes the name into the header before the round's first synchronisation, after which
// the ranks compare their calls (Agree); the verdicts are published next to the counters
// before the second.
class ShmProcessGroup::RegistrationExchange final : public SegmentExchange {
 public:
  explicit RegistrationExchange(ShmProcessGroup& group) : g_(group) {}

  absl::Status Publish(const std::string& name, const std::string& error) override {
    std::snprintf(g_.header_->registration_name, sizeof(g_.header_->registration_name), "%s",
                  name.c_str());
    if (absl::Status s = Agree(); !s.ok()) return s;
    if (error.empty()) return absl::OkStatus();
    (void)Vote(error);  // the peers finish the round too
    return absl::UnavailableError(error);
  }
  absl::StatusOr<std::string> ReadName() override {
    if (absl::Status s = Agree(); !s.ok()) return s;
    std::string name = g_.header_->registration_name;
    if (!name.empty()) return name;
    const std::string error = "rank 0 could not create the buffer's segment";
    (void)Vote(error);
    return absl::UnavailableError(error);
  }
  absl::Status Vote(const std::string& error) override {
    const uint64_t round = g_.round_;
    g_.header_->registration_ok[g_.rank_].value.store(2 * round + (error.empty() ? 1 : 0));
    // An error breaks the group; its next collective says why.
    if (absl::Status s = g_.Sync(1, "buffer registration"); !s.ok()) return s;
    for (int r = 0; r < g_.size_; ++r) {
      if (g_.header_->registration_ok[r].value.load() != 2 * round + 1) {
        return absl::UnavailableError(absl::StrCat("rank ", r, " could not map the buffer"));
      }
    }
    return absl::OkStatus();
  }

 private:
  // The round's first synchronisation and the comparison of the ranks' calls.
  absl::Status Agree() {
    if (absl::Status s = g_.Sync(0, "buffer registration"); !s.ok()) return s;
    return g_.Agree("buffer registration");
  }
  ShmProcessGroup& g_;
};

size_t ShmProcessGroup::HeaderBytes() { return (sizeof(Header) + 4095) / 4096 * 4096; }

ShmProcessGroup::ShmProcessGroup(int rank, int size, ShmSegment segment,
                                 const ShmOptions& options)
    : rank_(rank), size_(size), segment_(std::move(segment)), options_(options),
      header_(static_cast<Header*>(segment_.data())),
      sync_(&header_->sync, rank, size, options.timeout) {}

ShmProcessGroup::~ShmProcessGroup() {
  // Peers still waiting for this rank (it failed, or it is leaving early) stop waiting now.
  // A peer whose collective already completed does not look at this.
  sync_.Leave();
}

float* ShmProcessGroup::slot(int r) const {
  return reinterpret_cast<float*>(static_cast<char*>(segment_.data()) + HeaderBytes()) +
         static_cast<size_t>(r) * options_.slot_floats;
}

float* ShmProcessGroup::result() const { return slot(size_); }

absl::StatusOr<std::unique_ptr<ShmProcessGroup>> ShmProcessGroup::Create(
    int rank, int size, KvClient& kv, const ShmOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of world size ", size));
  }
  if (size > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory groups hold at most ", kMaxRanks, " ranks, not ", size));
  }
  if (options.slot_floats < 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot_floats ", options.slot_floats, " is below 1024"));
  }
  const size_t bytes =
      HeaderBytes() + (static_cast<size_t>(size) + 1) * options.slot_floats * sizeof(float);
  ShmSegment::Hooks hooks;
  hooks.init = [&](ShmSegment& segment) {
    // The segment is zero-filled, so every counter and atomic starts at 0.
    auto* h = static_cast<Header*>(segment.data());
    h->world = static_cast<uint32_t>(size);
    h->slot_floats = options.slot_floats;
    reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic);
    h->sync.pid[0].store(getpid());
  };
  hooks.check = [&](ShmSegment& segment) -> std::string {
    auto* h = static_cast<Header*>(segment.data());
    const uint64_t magic = reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->load();
    if (magic != kMagic || h->world != static_cast<uint32_t>(size) ||
        h->slot_floats != options.slot_floats) {
      return absl::StrCat(segment.name(), " is not a segment of this group (world ", h->world,
                          ", slot ", h->slot_floats, ")");
    }
    h->sync.pid[rank].store(getpid());
    return "";
  };
  KvSegmentExchange exchange(kv, rank, size, options.timeout);
  absl::StatusOr<ShmSegment> segment =
      ShmSegment::Establish(rank, bytes, exchange, hooks, options.shm_dir);
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<ShmProcessGroup>(
      new ShmProcessGroup(rank, size, *std::move(segment), options));
}

void ShmProcessGroup::Abort() { sync_.Abort(); }

absl::Status ShmProcessGroup::Check(const char* what) const {
  if (broken_ || sync_.aborted()) {
    return absl::AbortedError(absl::StrCat(
        "shared-memory ", what, " on rank ", rank_, ": ",
        sync_.aborted() ? "aborted" : "the group is broken by an earlier error: " + first_error_));
  }
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::Break(absl::Status s) {
  if (!broken_) first_error_ = std::string(s.message());
  broken_ = true;
  // Tell the peers: they stop waiting for this rank at once instead of at their timeout.
  sync_.Leave();
  return s;
}

absl::Status ShmProcessGroup::Sync(int which, const char* what) {
  absl::Status s = sync_.Arrive(which, round_, what);
  return s.ok() ? s : Break(std::move(s));
}

void ShmProcessGroup::Announce(const CollectiveCall& call) {
  CallSlot& mine = header_->call[rank_];
  mine.kind.store(call.kind);
  mine.count.store(call.count);
  mine.arg.store(call.arg);
}

absl::Status ShmProcessGroup::Agree(const char* what) {
  // Every rank announced before the Sync(0) just passed, and none announces again before
  // every rank has passed the Sync(1) below.
  std::vector<CollectiveCall> calls(size_);
  for (int r = 0; r < size_; ++r) {
    const CallSlot& c = header_->call[r];
    calls[r] = CollectiveCall{c.kind.load(), c.count.load(), c.arg.load()};
  }
  absl::Status differ = CompareCalls("shared-memory", what, rank_, calls);
  if (differ.ok()) return differ;
  // Every rank sees the same announcements, so every rank is here: complete the round
  // together, so that each reports the difference rather than "a peer left".
  if (absl::Status s = Sync(1, what); !s.ok()) return s;
  return Break(std::move(differ));
}

absl::Status ShmProcessGroup::Rounds(const CollectiveCall& call, ReduceOp op, const Load& load,
                                     const Store& store) {
  if (absl::Status s = Check("allreduce"); !s.ok()) return s;
  const size_t n = call.count;
  const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(size_) : 1.0f;
  float* slots[kMaxRanks];
  for (int r = 0; r < size_; ++r) slots[r] = slot(r);
  Announce(call);
  // At least one round, even for no elements: the calls are compared in the first.
  for (size_t off = 0; off == 0 || off < n; off += options_.slot_floats) {
    const size_t len = std::min(options_.slot_floats, n - off);
    ++round_;
    load(slot(rank_), off, len);
    if (absl::Status s = Sync(0, "allreduce"); !s.ok()) return s;
    if (off == 0) {
      if (absl::Status s = Agree("allreduce"); !s.ok()) return s;
    }
    // Reduce-scatter: this rank sums its 1/N of the round over every slot.
    const size_t begin = len * rank_ / size_, end = len * (rank_ + 1) / size_;
    ReduceRange(result(), slots, size_, begin, end, scale);
    if (absl::Status s = Sync(1, "allreduce"); !s.ok()) return s;
    // Allgather: every rank copies the whole result. Nobody writes it again before every
    // rank has arrived in the next round, i.e. finished this copy.
    store(result(), off, len);
  }
  return absl::OkStatus();
}

SharedBuffer ShmProcessGroup::NewBuffer(size_t n) {
  auto heap = [n] { return std::make_shared<Buffer>(n); };
  if (size_ == 1 || !Check("buffer registration").ok()) return heap();
  const size_t stride = (n * sizeof(float) + 4095) / 4096 * 4096 / sizeof(float);
  const size_t bytes = stride * sizeof(float) * static_cast<size_t>(size_);
  // The same arithmetic on every rank (when the calls agree): all register or none does.
  const bool want = n > 0 && registered_bytes_ + bytes <= options_.registered_bytes_limit;
  Announce(CollectiveCall{CollectiveCall::kNewBuffer, n, want ? 1u : 0u});
  ++round_;
  // Every failure below leaves the group broken (its next collective says why) or heap
  // memory on every rank alike.
  if (!want) {  // too small or over the limit on every rank alike: one round, no segment
    if (!Sync(0, "buffer registration").ok() || !Agree("buffer registration").ok()) {
      return heap();
    }
    (void)Sync(1, "buffer registration");
    return heap();
  }
  RegistrationExchange exchange(*this);
  absl::StatusOr<ShmSegment> segment =
      ShmSegment::Establish(rank_, bytes, exchange, {}, options_.shm_dir);
  if (!segment.ok()) return heap();
  static std::atomic<uint64_t> next_registration{1};
  const uint64_t id = next_registration.fetch_add(1);
  float* floats = static_cast<float*>(segment->data());
  regions_[id] = Region{floats, stride, n};
  registered_bytes_ += bytes;
  std::shared_ptr<void> keep = std::move(*segment).Share();
  return std::make_shared<Buffer>(floats + static_cast<size_t>(rank_) * stride, n,
                                  std::move(keep), id);
}

absl::Status ShmProcessGroup::RegisteredAllreduce(uint64_t registration, ReduceOp op) {
  if (absl::Status s = Check("allreduce"); !s.ok()) return s;
  const Region& region = regions_.at(registration);
  Announce(CollectiveCall{CollectiveCall::kRegisteredAllreduce, region.n,
                          static_cast<uint64_t>(op)});
  ++round_;
  // Every rank has written its region.
  if (absl::Status s = Sync(0, "allreduce"); !s.ok()) return s;
  if (absl::Status s = Agree("allreduce"); !s.ok()) return s;
  const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(size_) : 1.0f;
  const size_t begin = region.n * rank_ / size_, end = region.n * (rank_ + 1) / size_;
  float* slots[kMaxRanks];
  for (int r = 0; r < size_; ++r) slots[r] = region.base + static_cast<size_t>(r) * region.stride;
  constexpr size_t kChunk = 4096;  // 16 KiB of sums, in L1, then written to every region
  float sums[kChunk];
  float* rebased[kMaxRanks] = {};
  for (size_t i0 = begin; i0 < end; i0 += kChunk) {
    const size_t len = std::min(kChunk, end - i0);
    for (int r = 0; r < size_; ++r) rebased[r] = slots[r] + i0;
    ReduceRange(sums, rebased, size_, 0, len, scale);
    for (int r = 0; r < size_; ++r) std::memcpy(slots[r] + i0, sums, len * sizeof(float));
  }
  // Every rank has written its sums into every region; nobody writes a region again
  // before the next round's first synchronisation.
  return Sync(1, "allreduce");
}

absl::Status ShmProcessGroup::Allreduce(std::span<float> data, ReduceOp op) {
  if (size_ == 1) return Check("allreduce");
  return Rounds(
      CollectiveCall{CollectiveCall::kAllreduce, data.size(), static_cast<uint64_t>(op)}, op,
      [&](float* slot, size_t off, size_t len) {
        std::memcpy(slot, data.data() + off, len * sizeof(float));
      },
      [&](const float* result, size_t off, size_t len) {
        std::memcpy(data.data() + off, result, len * sizeof(float));
      });
}

std::shared_ptr<Work> ShmProcessGroup::AllreduceAsync(SharedBuffer data, ReduceOp op,
                                                      Precision wire) {
  if (wire == Precision::kFloat32 && size_ > 1 && data->registration() != 0 &&
      regions_.count(data->registration()) > 0 &&
      regions_.at(data->registration()).n == data->size()) {
    return std::make_shared<CompletedWork>(RegisteredAllreduce(data->registration(), op));
  }
  if (wire == Precision::kFloat32 || size_ == 1) {
    return std::make_shared<CompletedWork>(Allreduce(std::span<float>(*data), op));
  }
  // As DDP's fp16_compress_hook: each value to half, divided by the world size in half
  // before the sum; the sum (float32 here, so it cannot overflow) back to half.
  const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(size_) : 1.0f;
  Buffer& d = *data;
  return std::make_shared<CompletedWork>(Rounds(
      CollectiveCall{CollectiveCall::kAllreduceFp16Wire, d.size(), static_cast<uint64_t>(op)},
      ReduceOp::kSum,
      [&](float* slot, size_t off, size_t len) {
        // Through a small half buffer: slot[i] = HalfToFloat(Fp16WireValue(d[off + i])).
        Half wire[1024];
        for (size_t done = 0; done < len; done += std::size(wire)) {
          const size_t k = std::min(len - done, std::size(wire));
          ToFp16Wire(d.data() + off + done, scale, wire, k);
          HalvesToFloats(wire, slot + done, k);
        }
      },
      [&](const float* result, size_t off, size_t len) {
        std::copy(result, result + len, d.data() + off);
        RoundToHalves(d.data() + off, len);
      }));
}

absl::Status ShmProcessGroup::AllreduceHalf(std::span<Half> data, ReduceOp op) {
  if (size_ == 1) return Check("allreduce");
  Half* h = data.data();
  return Rounds(
      CollectiveCall{CollectiveCall::kAllreduceHalf, data.size(), static_cast<uint64_t>(op)}, op,
      [&](float* slot, size_t off, size_t len) { HalvesToFloats(h + off, slot, len); },
      [&](const float* result, size_t off, size_t len) { FloatsToHalves(result, h + off, len); });
}

absl::Status ShmProcessGroup::Broadcast(std::span<float> data, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " of world size ", size_));
  }
  if (absl::Status s = Check("broadcast"); !s.ok()) return s;
  if (size_ == 1) return absl::OkStatus();
  Announce(CollectiveCall{CollectiveCall::kBroadcast, data.size(), static_cast<uint64_t>(root)});
  for (size_t off = 0; off == 0 || off < data.size(); off += options_.slot_floats) {
    const size_t len = std::min(options_.slot_floats, data.size() - off);
    ++round_;
    if (rank_ == root) std::memcpy(slot(root), data.data() + off, len * sizeof(float));
    if (absl::Status s = Sync(0, "broadcast"); !s.ok()) return s;
    if (off == 0) {
      if (absl::Status s = Agree("broadcast"); !s.ok()) return s;
    }
    if (rank_ != root) std::memcpy(data.data() + off, slot(root), len * sizeof(float));
    // The root must not overwrite its slot before everyone copied it.
    if (absl::Status s = Sync(1, "broadcast"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::Allgather(std::span<const float> input, std::span<float> output) {
  if (absl::Status s = CheckAllgatherSizes(input.size(), output.size(), size_); !s.ok()) {
    return s;
  }
  if (absl::Status s = Check("allgather"); !s.ok()) return s;
  const size_t n = input.size();
  if (size_ == 1) {
    std::copy(input.begin(), input.end(), output.begin());
    return absl::OkStatus();
  }
  Announce(CollectiveCall{CollectiveCall::kAllgather, n, 0});
  for (size_t off = 0; off == 0 || off < n; off += options_.slot_floats) {
    const size_t len = std::min(options_.slot_floats, n - off);
    ++round_;
    std::memcpy(slot(rank_), input.data() + off, len * sizeof(float));
    if (absl::Status s = Sync(0, "allgather"); !s.ok()) return s;
    if (off == 0) {
      if (absl::Status s = Agree("allgather"); !s.ok()) return s;
    }
    for (int r = 0; r < size_; ++r) {
      std::memcpy(output.data() + r * n + off, slot(r), len * sizeof(float));
    }
    if (absl::Status s = Sync(1, "allgather"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::Barrier() {
  if (absl::Status s = Check("barrier"); !s.ok()) return s;
  if (size_ == 1) return absl::OkStatus();
  Announce(CollectiveCall{CollectiveCall::kBarrier, 0, 0});
  ++round_;
  if (absl::Status s = Sync(0, "barrier"); !s.ok()) return s;
  if (absl::Status s = Agree("barrier"); !s.ok()) return s;
  return Sync(1, "barrier");
}

}  // namespace joule::worker
