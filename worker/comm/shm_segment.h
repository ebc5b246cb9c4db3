#ifndef JOULE_WORKER_COMM_SHM_SEGMENT_H_
#define JOULE_WORKER_COMM_SHM_SEGMENT_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace joule::worker {

// How the ranks of a gang agree on one segment (ShmSegment::Establish): in a KV store (the
// shared-memory group's own segment), or in a segment they already share (the buffers
// of ShmProcessGroup::NewBuffer). Every rank calls the exchange's methods in the order
// Establish does; the calls block until the peers' side is there. Not thread-safe.
class SegmentExchange {
 public:
  virtual ~SegmentExchange() = default;
  // Rank 0: tells the others the name of the segment it created, or with `error` non-empty
  // (and `name` empty) why it could not. Returns what Establish returns on rank 0: OK to
  // go on to the vote; with `error`, the error to report (the exchange completes whatever
  // its peers wait for first).
  virtual absl::Status Publish(const std::string& name, const std::string& error) = 0;
  // Other ranks: the name rank 0 published, or the error Establish returns (rank 0's
  // reason, or the exchange's own failure).
  virtual absl::StatusOr<std::string> ReadName() = 0;
  // Every rank, after mapping the segment (`error` empty) or failing to (why): publishes
  // the verdict and waits for every rank's. OK when every rank mapped it; else the error
  // Establish returns.
  virtual absl::Status Vote(const std::string& error) = 0;
};

// A POSIX shared-memory segment mapped into this process, named /joule-PID-RANDOM after
// the process that created it (SweepStale reads that pid). Moves only; destroying it
// unmaps the segment and, when this process created it and has not unlinked it yet,
// removes the name, so no path through the life cycle below leaves it in /dev/shm.
//
// The life cycle of a segment a gang shares (Establish): rank 0 creates it and publishes
// its name; the others attach it; every rank votes whether it mapped it; then rank 0
// unlinks the name (every rank has mapped it or given up), so that only the mappings are
// left and nothing remains in /dev/shm when the processes die. Only a creator killed
// between creating and unlinking leaves its segment behind: SweepStale removes those.
//
// Thread-compatible (one owner); the memory itself is shared with the peers.
class ShmSegment {
 public:
  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Creates a new segment of `bytes` bytes (reserved with posix_fallocate, so a full
  // /dev/shm is an error now rather than a SIGBUS later; zero-filled) and maps it.
  // Errors: UNAVAILABLE "shm_open NAME: why", "reserving N bytes for NAME: why (DIR has
  // X MiB free)" (`free_space_dir` is only read for that message), "mmap NAME: why".
  static absl::StatusOr<ShmSegment> Create(size_t bytes,
                                           const std::string& free_space_dir = "/dev/shm");
  // Maps the existing segment `name` ("/joule-..."), which must hold exactly `bytes`.
  // Errors: UNAVAILABLE "shm_open NAME: why", "fstat NAME: why", "NAME holds N bytes,
  // expected M", "mmap NAME: why".
  static absl::StatusOr<ShmSegment> Attach(const std::string& name, size_t bytes);

  // Hooks of Establish, run on the mapped segment. `init` on rank 0 before the name is
  // published; `check` on the other ranks after attaching, returning why the segment is
  // not the one expected ("" when it is), which becomes that rank's vote.
  struct Hooks {
    std::function<void(ShmSegment& segment)> init;
    std::function<std::string(ShmSegment& segment)> check;
  };
  // The life cycle above for rank `rank` of a gang, through `exchange`: the mapped
  // segment when every rank mapped it; else the exchange's error (every rank fails; the
  // name is gone from /dev/shm and this rank's mapping is released).
  static absl::StatusOr<ShmSegment> Establish(int rank, size_t bytes, SegmentExchange& exchange,
                                              const Hooks& hooks,
                                              const std::string& free_space_dir = "/dev/shm");

  // Removes the name (if this process created it and it is still there); the mapping
  // stays. Idempotent.
  void Unlink();

  // Moves the mapping into a shared owner: it is unmapped when the last copy goes.
  std::shared_ptr<void> Share() &&;

  void* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  bool mapped() const { return base_ != nullptr; }
  // Whether this object will remove the name (it created the segment and has not yet).
  bool linked() const { return linked_; }

  // Removes segments in `dir` (/dev/shm) named by Joule (joule-PID-...) whose creating
  // process no longer exists: what a rank SIGKILLed between creating and unlinking a
  // segment leaves behind. Returns how many it removed. (Workers in other PID namespaces
  // that share this /dev/shm look dead from here; the gang's transport choice keeps such
  // ranks off shared memory, and unlinking a name never unmaps a segment in use.)
  static int SweepStale(const std::string& dir = "/dev/shm");

  // A fresh name for a segment of this process: "/joule-PID-" and 16 random hex digits.
  static std::string NewName();

 private:
  ShmSegment(void* base, size_t bytes, std::string name, bool linked)
      : base_(base), bytes_(bytes), name_(std::move(name)), linked_(linked) {}
  void Reset();

  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool linked_ = false;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_SHM_SEGMENT_H_
