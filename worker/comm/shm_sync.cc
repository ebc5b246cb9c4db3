#include "worker/comm/shm_sync.h"

#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

using Clock = std::chrono::steady_clock;

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

void ShmSync::Join() { words_->pid[rank_].store(getpid()); }

void ShmSync::Ring() {
  words_->bell.fetch_add(1);
  Futex(&words_->bell, FUTEX_WAKE, INT_MAX, nullptr);
}

void ShmSync::Leave() {
  int32_t none = 0;
  words_->broken_by.compare_exchange_strong(none, rank_ + 1);  // keeps the first culprit
  Ring();
}

void ShmSync::Abort() {
  aborted_.store(true);
  Leave();  // releases the peers too
}

absl::Status ShmSync::Arrive(int line, uint64_t round, const char* what) {
  ShmSyncWords::Line* lines = words_->lines[line];
  lines[rank_].value.store(round);
  words_->bell.fetch_add(1);
  if (words_->sleepers.load() > 0) Futex(&words_->bell, FUTEX_WAKE, INT_MAX, nullptr);

  const auto start = Clock::now();
  const auto deadline = start + timeout_;
  auto last_liveness = start;
  constexpr auto kSpin = std::chrono::microseconds(50);
  constexpr auto kSlice = std::chrono::milliseconds(100);
  // The first rank whose counter has not reached this round, or -1.
  auto first_missing = [&] {
    for (int r = 0; r < size_; ++r) {
      if (lines[r].value.load() < round) return r;
    }
    return -1;
  };
  while (true) {
    const uint32_t bell = words_->bell.load();
    const int missing = first_missing();
    if (missing < 0) return absl::OkStatus();
    const auto now = Clock::now();
    if (aborted_.load()) {
      return absl::AbortedError(absl::StrCat("shared-memory ", what, " on rank ", rank_,
                                             ": aborted while waiting for rank ", missing));
    }
    if (const int32_t by = words_->broken_by.load(); by != 0 && by != rank_ + 1) {
      // A peer marks the words only after its last publish: if it completed this round
      // before leaving, its counter is visible now.
      if (first_missing() < 0) return absl::OkStatus();
      return absl::UnavailableError(absl::StrCat(
          "shared-memory ", what, " on rank ", rank_, ": rank ", by - 1,
          " left the group (an error, an abort, or it finished early)"));
    }
    if (now - start < kSpin) {
      CpuRelax();
      continue;
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("shared-memory ", what, " on rank ", rank_,
                                                      ": rank ", missing, " did not arrive within ",
                                                      timeout_.count(), " ms"));
    }
    if (now - last_liveness >= kSlice) {
      last_liveness = now;
      for (int r = 0; r < size_; ++r) {
        if (lines[r].value.load() >= round) continue;
        const int32_t pid = words_->pid[r].load();
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH &&
            lines[r].value.load() < round) {  // not a peer that published, then exited
          return absl::UnavailableError(absl::StrCat("shared-memory ", what, " on rank ", rank_,
                                                     ": rank ", r, " (pid ", pid, ") exited"));
        }
      }
    }
    words_->sleepers.fetch_add(1);
    const timespec slice{0, 100'000'000};
    Futex(&words_->bell, FUTEX_WAIT, bell, &slice);
    words_->sleepers.fetch_sub(1);
  }
}

}  // namespace joule::worker
