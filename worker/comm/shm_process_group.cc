#include "worker/comm/shm_process_group.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include <gloo/types.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace joule::worker {
namespace {

constexpr uint64_t kMagic = 0x4a4f554c45534d31;  // "JOULESM1"
constexpr int kMaxRanks = 64;
using Clock = std::chrono::steady_clock;

struct alignas(64) Counter {
  std::atomic<uint64_t> value;
};

// A rank's CollectiveCall, published before the first synchronisation of a collective.
struct alignas(64) CallSlot {
  std::atomic<uint64_t> kind;
  std::atomic<uint64_t> count;
  std::atomic<uint64_t> arg;
};

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

std::string FreeSpace(const std::string& dir) {
  struct statvfs v;
  if (statvfs(dir.c_str(), &v) != 0) return "";
  return absl::StrFormat(" (%s has %.1f MiB free)", dir,
                         static_cast<double>(v.f_bavail) * v.f_frsize / (1 << 20));
}

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

}  // namespace

struct ShmProcessGroup::Header {
  uint64_t magic;
  uint32_t world;
  uint32_t pad0;
  uint64_t slot_floats;
  alignas(64) std::atomic<uint32_t> bell;  // futex word: bumped by every publish
  std::atomic<uint32_t> sleepers;          // ranks blocked in FUTEX_WAIT on `bell`
  std::atomic<int32_t> broken_by;          // 1 + the first rank that left or failed; 0: none
  alignas(64) std::atomic<int32_t> pid[kMaxRanks];
  Counter arrived[kMaxRanks];  // round whose inputs this rank has staged
  Counter reduced[kMaxRanks];  // round whose reduction this rank has finished
  // NewBuffer: the segment rank 0 made ("" when it could not), and each rank's verdict,
  // 2 x round + 1 when it mapped it, 2 x round when it could not.
  char registration_name[96];
  Counter registration_ok[kMaxRanks];
  CallSlot call[kMaxRanks];  // what each rank passes to its current collective
};

size_t ShmProcessGroup::HeaderBytes() { return (sizeof(Header) + 4095) / 4096 * 4096; }

ShmProcessGroup::ShmProcessGroup(int rank, int size, void* base, size_t bytes,
                                 const ShmOptions& options)
    : rank_(rank), size_(size), base_(base), bytes_(bytes), options_(options),
      header_(static_cast<Header*>(base)) {}

ShmProcessGroup::~ShmProcessGroup() {
  // Peers still waiting for this rank (it failed, or it is leaving early) stop waiting now.
  // A peer whose collective already completed does not look at this.
  int32_t none = 0;
  header_->broken_by.compare_exchange_strong(none, rank_ + 1);
  header_->bell.fetch_add(1);
  Futex(&header_->bell, FUTEX_WAKE, INT_MAX, nullptr);
  munmap(base_, bytes_);
}

float* ShmProcessGroup::slot(int r) const {
  return reinterpret_cast<float*>(static_cast<char*>(base_) + HeaderBytes()) +
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
  auto fail = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat("shared memory on rank ", rank, ": ", why));
  };

  // Maps `fd` (closing it) and checks its size.
  void* base = MAP_FAILED;
  std::string error;
  auto map = [&](int fd, const std::string& name) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
      error = Errno(absl::StrCat("fstat ", name));
    } else if (static_cast<size_t>(st.st_size) != bytes) {
      error = absl::StrCat(name, " holds ", st.st_size, " bytes, expected ", bytes);
    } else {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) error = Errno(absl::StrCat("mmap ", name));
    }
    close(fd);
  };

  // Rank 0 creates, maps and initialises the segment, then publishes its name (or
  // "!reason", so that nobody waits for a segment that will not come).
  std::string name;
  if (rank == 0) {
    std::random_device rd;
    name = absl::StrFormat("/joule-%d-%08x%08x", getpid(), rd(), rd());
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      error = Errno(absl::StrCat("shm_open ", name));
    } else if (int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
      error = absl::StrCat("reserving ", bytes, " bytes for ", name, ": ", std::strerror(e),
                           FreeSpace(options.shm_dir));
      close(fd);
    } else {
      map(fd, name);
    }
    if (error.empty()) {
      // The segment is zero-filled, so every counter and atomic starts at 0.
      auto* h = static_cast<Header*>(base);
      h->world = static_cast<uint32_t>(size);
      h->slot_floats = options.slot_floats;
      reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic);
      h->pid[0].store(getpid());
    } else {
      shm_unlink(name.c_str());
    }
    (void)kv.Set("shm/name", error.empty() ? name : "!" + error);
    if (!error.empty()) return fail(error);
  } else {
    absl::StatusOr<std::string> v = kv.Get("shm/name", options.timeout);
    if (!v.ok()) return v.status();
    if (!v->empty() && (*v)[0] == '!') return fail(absl::StrCat("rank 0: ", v->substr(1)));
    name = *v;
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      error = Errno(absl::StrCat("shm_open ", name));
    } else {
      map(fd, name);
    }
    if (error.empty()) {
      auto* h = static_cast<Header*>(base);
      const uint64_t magic = reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->load();
      if (magic != kMagic || h->world != static_cast<uint32_t>(size) ||
          h->slot_floats != options.slot_floats) {
        error = absl::StrCat(name, " is not a segment of this group (world ", h->world,
                             ", slot ", h->slot_floats, ")");
      } else {
        h->pid[rank].store(getpid());
      }
    }
  }
  // Every rank reports, so all ranks agree on the outcome.
  (void)kv.Set(absl::StrCat("shm/attached/", rank), error.empty() ? "ok" : error);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat("shm/attached/", r));
  absl::Status waited = kv.Wait(keys, options.timeout);
  if (rank == 0) shm_unlink(name.c_str());  // every rank has mapped it (or given up)
  auto unmap = [&] {
    if (base != MAP_FAILED) munmap(base, bytes);
  };
  if (!waited.ok()) {
    unmap();
    return waited;
  }
  if (!error.empty()) {
    unmap();
    return fail(error);
  }
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::string> v = kv.Get(keys[r], options.timeout);
    if (!v.ok()) {
      unmap();
      return v.status();
    }
    if (*v != "ok") {
      unmap();
      return fail(absl::StrCat("rank ", r, ": ", *v));
    }
  }
  return std::unique_ptr<ShmProcessGroup>(new ShmProcessGroup(rank, size, base, bytes, options));
}

int ShmProcessGroup::SweepStaleSegments(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int pid = 0;
    if (std::sscanf(name.c_str(), "joule-%d-", &pid) != 1 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

void ShmProcessGroup::Abort() {
  aborted_.store(true);
  int32_t none = 0;
  header_->broken_by.compare_exchange_strong(none, rank_ + 1);  // releases the peers too
  header_->bell.fetch_add(1);
  Futex(&header_->bell, FUTEX_WAKE, INT_MAX, nullptr);
}

absl::Status ShmProcessGroup::Check(const char* what) const {
  if (broken_ || aborted_.load()) {
    return absl::AbortedError(absl::StrCat(
        "shared-memory ", what, " on rank ", rank_, ": ",
        aborted_.load() ? "aborted" : "the group is broken by an earlier error: " + first_error_));
  }
  return absl::OkStatus();
}

absl::Status ShmProcessGroup::Break(absl::Status s) {
  if (!broken_) first_error_ = std::string(s.message());
  broken_ = true;
  // Tell the peers: they stop waiting for this rank at once instead of at their timeout.
  int32_t none = 0;
  header_->broken_by.compare_exchange_strong(none, rank_ + 1);  // keeps the first culprit
  header_->bell.fetch_add(1);
  Futex(&header_->bell, FUTEX_WAKE, INT_MAX, nullptr);
  return s;
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

absl::Status ShmProcessGroup::Sync(int which, const char* what) {
  Counter* lines = which == 0 ? header_->arrived : header_->reduced;
  lines[rank_].value.store(round_);
  header_->bell.fetch_add(1);
  if (header_->sleepers.load() > 0) Futex(&header_->bell, FUTEX_WAKE, INT_MAX, nullptr);

  const auto start = Clock::now();
  const auto deadline = start + options_.timeout;
  auto last_liveness = start;
  constexpr auto kSpin = std::chrono::microseconds(50);
  constexpr auto kSlice = std::chrono::milliseconds(100);
  // The first rank whose counter has not reached this round, or -1.
  auto first_missing = [&] {
    for (int r = 0; r < size_; ++r) {
      if (lines[r].value.load() < round_) return r;
    }
    return -1;
  };
  while (true) {
    const uint32_t bell = header_->bell.load();
    const int missing = first_missing();
    if (missing < 0) return absl::OkStatus();
    const auto now = Clock::now();
    if (aborted_.load()) {
      return Break(absl::AbortedError(absl::StrCat("shared-memory ", what, " on rank ", rank_,
                                                   ": aborted while waiting for rank ", missing)));
    }
    if (const int32_t by = header_->broken_by.load(); by != 0 && by != rank_ + 1) {
      // A peer marks the segment only after its last publish: if it completed this round
      // before leaving, its counter is visible now.
      if (first_missing() < 0) return absl::OkStatus();
      return Break(absl::UnavailableError(absl::StrCat(
          "shared-memory ", what, " on rank ", rank_, ": rank ", by - 1,
          " left the group (an error, an abort, or it finished early)")));
    }
    if (now - start < kSpin) {
      CpuRelax();
      continue;
    }
    if (now >= deadline) {
      return Break(absl::DeadlineExceededError(absl::StrCat(
          "shared-memory ", what, " on rank ", rank_, ": rank ", missing, " did not arrive within ",
          options_.timeout.count(), " ms")));
    }
    if (now - last_liveness >= kSlice) {
      last_liveness = now;
      for (int r = 0; r < size_; ++r) {
        if (lines[r].value.load() >= round_) continue;
        const int32_t pid = header_->pid[r].load();
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH &&
            lines[r].value.load() < round_) {  // not a peer that published, then exited
          return Break(absl::UnavailableError(absl::StrCat(
              "shared-memory ", what, " on rank ", rank_, ": rank ", r, " (pid ", pid, ") exited")));
        }
      }
    }
    header_->sleepers.fetch_add(1);
    const timespec slice{0, 100'000'000};
    Futex(&header_->bell, FUTEX_WAIT, bell, &slice);
    header_->sleepers.fetch_sub(1);
  }
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
  std::string name;
  int fd = -1;
  if (rank_ == 0 && want) {
    std::random_device rd;
    name = absl::StrFormat("/joule-%d-%08x%08x", getpid(), rd(), rd());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      shm_unlink(name.c_str());
      fd = -1;
    }
    if (fd < 0) name.clear();
    std::snprintf(header_->registration_name, sizeof(header_->registration_name), "%s",
                  name.c_str());
  }
  if (!Sync(0, "buffer registration").ok()) {
    if (rank_ == 0 && fd >= 0) {  // nobody will map it
      close(fd);
      shm_unlink(name.c_str());
    }
    return heap();  // the group is broken; its next collective reports why
  }
  if (!Agree("buffer registration").ok()) {
    if (rank_ == 0 && fd >= 0) {
      close(fd);
      shm_unlink(name.c_str());
    }
    return heap();  // the group is broken; its next collective reports the difference
  }
  if (!want) {  // too small or over the limit on every rank alike: one round, no segment
    (void)Sync(1, "buffer registration");  // an error breaks the group; the next call says why
    return heap();
  }
  name = header_->registration_name;
  void* base = MAP_FAILED;
  if (!name.empty()) {
    if (rank_ != 0) fd = shm_open(name.c_str(), O_RDWR, 0);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (fd >= 0) close(fd);
  }
  header_->registration_ok[rank_].value.store(2 * round_ + (base != MAP_FAILED ? 1 : 0));
  const absl::Status synced = Sync(1, "buffer registration");
  if (rank_ == 0 && !name.empty()) shm_unlink(name.c_str());  // all have mapped it or given up
  bool all = synced.ok();
  for (int r = 0; r < size_ && all; ++r) {
    all = header_->registration_ok[r].value.load() == 2 * round_ + 1;
  }
  if (!all) {
    if (base != MAP_FAILED) munmap(base, bytes);
    return heap();
  }
  static std::atomic<uint64_t> next_registration{1};
  const uint64_t id = next_registration.fetch_add(1);
  float* floats = static_cast<float*>(base);
  regions_[id] = Region{floats, stride, n};
  registered_bytes_ += bytes;
  std::shared_ptr<void> keep(base, [bytes](void* p) { munmap(p, bytes); });
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
  auto to_half_and_back = [](float x) { return gloo::cpu_half2float(gloo::cpu_float2half_rn(x)); };
  const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(size_) : 1.0f;
  Buffer& d = *data;
  return std::make_shared<CompletedWork>(Rounds(
      CollectiveCall{CollectiveCall::kAllreduceFp16Wire, d.size(), static_cast<uint64_t>(op)},
      ReduceOp::kSum,
      [&](float* slot, size_t off, size_t len) {
        for (size_t i = 0; i < len; ++i) {
          slot[i] = to_half_and_back(to_half_and_back(d[off + i]) * scale);
        }
      },
      [&](const float* result, size_t off, size_t len) {
        for (size_t i = 0; i < len; ++i) d[off + i] = to_half_and_back(result[i]);
      }));
}

absl::Status ShmProcessGroup::AllreduceHalf(std::span<Half> data, ReduceOp op) {
  if (size_ == 1) return Check("allreduce");
  auto* h = reinterpret_cast<gloo::float16*>(data.data());
  return Rounds(
      CollectiveCall{CollectiveCall::kAllreduceHalf, data.size(), static_cast<uint64_t>(op)}, op,
      [&](float* slot, size_t off, size_t len) {
        for (size_t i = 0; i < len; ++i) slot[i] = gloo::cpu_half2float(h[off + i]);
      },
      [&](const float* result, size_t off, size_t len) {
        for (size_t i = 0; i < len; ++i) h[off + i] = gloo::cpu_float2half_rn(result[i]);
      });
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
