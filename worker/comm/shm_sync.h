#ifndef JOULE_WORKER_COMM_SHM_SYNC_H_
#define JOULE_WORKER_COMM_SHM_SYNC_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/status/status.h"

namespace joule::worker {

// One pause of a spin-wait loop (x86 PAUSE, Arm YIELD): cheaper for the core's other
// hardware thread and for power than an empty loop.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The most ranks a shared-memory group holds.
inline constexpr int kShmMaxRanks = 64;

// The words ShmSync shares between the ranks, placed in memory every rank maps (a
// ShmSegment). All zero is the initial state, so a fresh (zero-filled) segment needs no
// initialisation.
struct ShmSyncWords {
  struct alignas(64) Line {
    std::atomic<uint64_t> value;
  };
  alignas(64) std::atomic<uint32_t> bell;  // futex word: bumped by every publish
  std::atomic<uint32_t> sleepers;          // ranks blocked in FUTEX_WAIT on `bell`
  std::atomic<int32_t> broken_by;          // 1 + the first rank that left; 0: none
  alignas(64) std::atomic<int32_t> pid[kShmMaxRanks];  // 0 until the rank Join()s
  // Per rank, on cache lines of their own: the last round it published on each line.
  Line lines[2][kShmMaxRanks];
};

// The synchronisation points of a shared-memory group, one rank's view: each rank
// publishes a per-round counter on one of two lines (the shared-memory group uses line 0
// for "inputs staged", line 1 for "reduction done") and waits until every rank's counter
// on that line reached the round. Waiters spin for 50 us, then sleep on a futex in the
// shared words that every publisher rings. Sleeps wake at least every 100 ms to check the
// deadline, Abort(), and whether the peers still live (kill(pid, 0) on the pids they
// Join()ed with), so a dead peer is an error within ~100 ms and a stopped one within the
// timeout. A rank that Leave()s (it failed, aborted or is going away) marks the words, so
// its peers stop waiting for it at once.
//
// The words may be shared by threads of one process as well as by processes (the futex is
// not process-private). Arrive() is called by one thread at a time; Leave() and Abort()
// from any thread.
class ShmSync {
 public:
  // `words` outlives this object; `size` <= kShmMaxRanks.
  ShmSync(ShmSyncWords* words, int rank, int size, std::chrono::milliseconds timeout)
      : words_(words), rank_(rank), size_(size), timeout_(timeout) {}
  ShmSync(const ShmSync&) = delete;
  ShmSync& operator=(const ShmSync&) = delete;

  // Records this process's pid as this rank's, for its peers' liveness checks.
  void Join();

  // Publishes `round` on this rank's counter of `line` (0 or 1) and waits until every
  // rank's counter on it reached `round` (rounds only grow). `what` names the collective
  // in errors, which read "shared-memory WHAT on rank R: ...":
  //   ABORTED "aborted while waiting for rank M" after Abort();
  //   UNAVAILABLE "rank B left the group (...)" when a peer Leave()s before publishing,
  //   or "rank M (pid P) exited" when a peer's process is gone;
  //   DEADLINE_EXCEEDED "rank M did not arrive within T ms".
  absl::Status Arrive(int line, uint64_t round, const char* what);

  // Marks the words as left by this rank (the first rank to leave is kept) and wakes every
  // waiter: peers waiting for a round this rank has not published fail at once.
  void Leave();
  // Makes the wait in progress, if any, and every later one fail with ABORTED; Leave()s.
  void Abort();
  bool aborted() const { return aborted_.load(); }

  // The round rank `r` last published on `line`.
  uint64_t published(int line, int r) const { return words_->lines[line][r].value.load(); }
  // 1 + the first rank that left, or 0.
  int32_t broken_by() const { return words_->broken_by.load(); }

 private:
  void Ring();

  ShmSyncWords* words_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborted_{false};
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_SHM_SYNC_H_
