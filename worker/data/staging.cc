#include "worker/data/staging.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

constexpr char kMarker[] = ".joule-staged";

// Holds an exclusive flock on `path` (created) for its life.
class DirLock {
 public:
  explicit DirLock(const std::string& path)
      : fd_(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ >= 0) {
      while (flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~DirLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Copies the file `from` (opened with `open`) to `to`.
absl::Status CopyFile(const std::string& from, const fs::path& to, const FileOpener& open,
                      int64_t* bytes) {
  absl::StatusOr<int> in = open(from);
  if (!in.ok()) return in.status();
  const ScopedFd closer(*in);
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  std::vector<char> buffer(1 << 20);
  while (out) {
    const ssize_t n = read(*in, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat(from, ": read failed: ", std::strerror(errno)));
    }
    if (n == 0) break;
    out.write(buffer.data(), n);
    *bytes += n;
  }
  out.close();
  if (!out) {
    return absl::UnavailableError(absl::StrCat(to.string(), ": cannot write the staged copy"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StagedData> StageLocal(const std::string& source, const std::string& dir,
                                      const FileOpener& open) {
  std::error_code ec;
  fs::create_directories(fs::path(dir).parent_path(), ec);
  DirLock lock(dir + ".lock");
  if (!lock.ok()) {
    return absl::UnavailableError(absl::StrCat(dir, ".lock: cannot create: ",
                                               std::strerror(errno)));
  }
  const bool directory = fs::is_directory(source, ec);
  StagedData staged;
  staged.path = directory ? dir : (fs::path(dir) / fs::path(source).filename()).string();
  if (fs::exists(fs::path(dir) / kMarker, ec)) return staged;  // staged before, whole
  fs::remove_all(dir, ec);  // a half-made copy of a crashed attempt
  fs::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  if (!directory) {
    if (absl::Status s = CopyFile(source, staged.path, open, &staged.bytes); !s.ok()) return s;
    staged.files = 1;
  } else {
    // The image folder's parts only: the splits and the class index.
    for (const char* part : {"train", "val", "test"}) {
      const fs::path root = fs::path(source) / part;
      if (!fs::is_directory(root, ec)) continue;
      // Symlinked class directories and files (as ImageNet trees often have) are followed,
      // as the folder scan follows them; the copy's paths are the links' own.
      for (auto it = fs::recursive_directory_iterator(
               root, fs::directory_options::follow_directory_symlink, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (!it->is_regular_file(ec)) continue;
        const fs::path rel = it->path().lexically_relative(source);
        if (absl::Status s = CopyFile(it->path().string(), fs::path(dir) / rel, open,
                                      &staged.bytes);
            !s.ok()) {
          return s;
        }
        ++staged.files;
      }
      if (ec) return absl::UnavailableError(absl::StrCat(root.string(), ": ", ec.message()));
    }
    const fs::path index = fs::path(source) / "classes.txt";
    if (fs::is_regular_file(index, ec)) {
      if (absl::Status s = CopyFile(index.string(), fs::path(dir) / "classes.txt", open,
                                    &staged.bytes);
          !s.ok()) {
        return s;
      }
      ++staged.files;
    }
  }
  std::ofstream marker(fs::path(dir) / kMarker);
  marker << staged.files << " files, " << staged.bytes << " bytes from " << source << "\n";
  marker.close();
  if (!marker) return absl::UnavailableError(absl::StrCat(dir, ": cannot write ", kMarker));
  staged.copied = true;
  return staged;
}

void RemoveStaged(const std::string& dir) {
  DirLock lock(dir + ".lock");
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::remove(dir + ".lock", ec);
}

}  // namespace joule::worker
