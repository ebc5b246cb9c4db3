#ifndef JOULE_WORKER_DATA_OPEN_BENEATH_H_
#define JOULE_WORKER_DATA_OPEN_BENEATH_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace joule::worker {

// Opens a file a job names for reading; returns a file descriptor the caller owns
// (O_RDONLY | O_CLOEXEC). The data loaders take one, so that where files may come from is
// decided in one place.
using FileOpener = std::function<absl::StatusOr<int>(const std::string& path)>;

// Closes a file descriptor (an opener's) when it goes out of scope. Not copyable.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Opens `path` as given. Errors: NOT_FOUND for a missing file, UNAVAILABLE otherwise,
// naming the path and the reason.
absl::StatusOr<int> OpenPlain(const std::string& path);

// Opens `path` only beneath one of `roots`, resolved by the kernel as it opens
// (openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS from the root's directory):
// ".." and relative symlinks may move within the root but never out of it (symlinks with
// an absolute target are refused, wherever they point), so a file swapped for a
// symlink after the coordinator checked its path cannot lead outside (a time-of-check,
// time-of-use race closed by the kernel). On kernels without openat2 (before Linux 5.6),
// every component is opened with O_NOFOLLOW instead (no symlinks at all).
//
// `path` must be absolute (the coordinator makes job paths absolute and canonical at
// submit). Roots are trusted configuration: symlinks in them are resolved first.
// Errors: PERMISSION_DENIED when `path` is not absolute, lies under none of the roots, or
// leads out of its root; NOT_FOUND for a missing file; UNAVAILABLE for other failures.
// Thread-safe.
absl::StatusOr<int> OpenBeneath(const std::string& path, const std::vector<std::string>& roots);

// OpenBeneath with `roots`, or OpenPlain when `roots` is empty.
FileOpener MakeFileOpener(std::vector<std::string> roots);

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_OPEN_BENEATH_H_
