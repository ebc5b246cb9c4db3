#include "worker/data/open_beneath.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text.h"

namespace joule::worker {

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

namespace {

absl::Status Errno(const std::string& path, int err) {
  const std::string message =
      absl::StrCat("cannot open ", SanitizeUtf8(path, 512), ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

// Opens `rel` beneath the directory `root_fd` without openat2: each component with
// O_NOFOLLOW, refusing "..", so no symlink is followed anywhere.
int OpenNoFollow(int root_fd, const std::filesystem::path& rel) {
  int dir = dup(root_fd);
  if (dir < 0) return -1;
  auto it = rel.begin();
  while (it != rel.end()) {
    const std::string part = it->string();
    const bool last = std::next(it) == rel.end();
    ++it;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      close(dir);
      errno = EXDEV;
      return -1;
    }
    const int flags = O_NOFOLLOW | O_CLOEXEC |
                      (last ? O_RDONLY | O_NONBLOCK | O_NOCTTY : (O_PATH | O_DIRECTORY));
    const int next = openat(dir, part.c_str(), flags);
    const int err = errno;
    close(dir);
    if (next < 0) {
      errno = err == ELOOP ? EXDEV : err;
      return -1;
    }
    dir = next;
  }
  return dir;
}

// Keeps `fd` only when it is a regular file, in blocking mode again.
absl::StatusOr<int> RegularFile(const std::string& path, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::NotFoundError(
        absl::StrCat(SanitizeUtf8(path, 512), " is not a regular file"));
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

// Files are opened O_NONBLOCK: opening a FIFO for reading blocks until a writer comes,
// which would hang the training thread where no cancel reaches it.
constexpr int kOpenFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;

absl::StatusOr<int> OpenPlain(const std::string& path) {
  const int fd = open(path.c_str(), kOpenFlags);
  if (fd < 0) return Errno(path, errno);
  return RegularFile(path, fd);
}

absl::StatusOr<int> OpenBeneath(const std::string& path, const std::vector<std::string>& roots) {
  namespace fs = std::filesystem;
  const fs::path p = fs::path(path).lexically_normal();
  if (!p.is_absolute()) {
    return absl::PermissionDeniedError(
        absl::StrCat("path \"", SanitizeUtf8(path, 512), "\" is not absolute"));
  }
  std::vector<std::string> resolved;
  for (const std::string& root : roots) {
    std::error_code ec;
    const fs::path r = fs::weakly_canonical(fs::absolute(root, ec), ec);
    if (ec) continue;
    resolved.push_back(r.string());
    const fs::path rel = p.lexically_relative(r);
    if (rel.empty() || *rel.begin() == "..") continue;
    const int root_fd = open(r.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) continue;
    open_how how{};
    how.flags = kOpenFlags;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    int fd = static_cast<int>(syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof(how)));
    // Kernels before 5.6 have no openat2; older seccomp profiles (Docker's before 20.10)
    // refuse it with EPERM.
    if (fd < 0 && (errno == ENOSYS || errno == EPERM)) fd = OpenNoFollow(root_fd, rel);
    const int err = errno;
    close(root_fd);
    if (fd >= 0) return RegularFile(path, fd);
    if (err == EXDEV || err == ELOOP) {
      return absl::PermissionDeniedError(absl::StrCat(
          "\"", SanitizeUtf8(path, 512), "\" leads out of the data root ", r.string(),
          " (through a symlink or \"..\"); refused"));
    }
    return Errno(path, err);
  }
  return absl::PermissionDeniedError(
      absl::StrCat("\"", SanitizeUtf8(path, 512), "\" is outside the allowed data roots (",
                   absl::StrJoin(resolved.empty() ? roots : resolved, ", "), ")"));
}

FileOpener MakeFileOpener(std::vector<std::string> roots) {
  if (roots.empty()) return OpenPlain;
  return [roots = std::move(roots)](const std::string& path) { return OpenBeneath(path, roots); };
}

}  // namespace joule::worker
