#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace joule {
namespace {

std::string Shown(const std::string& path) { return SanitizeUtf8(path, 512); }

absl::Status SystemError(const std::string& path, const char* what, int err) {
  return absl::UnavailableError(
      absl::StrCat("cannot write ", Shown(path), ": ", what, ": ", std::strerror(err)));
}

absl::Status CheckTarget(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("cannot write a file with an empty name");
  if (path == "-") {
    return absl::InvalidArgumentError(
        "cannot write \"-\" as a file: standard output is not supported here; give a path");
  }
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", Shown(path), ": it is a directory; give a file name"));
  }
  return absl::OkStatus();
}

// The process's umask without changing it (umask(2) sets it as it reads it: another
// thread creating a file meanwhile would get the wrong mode). Linux >= 4.7 reports it in
// /proc/self/status; 022, the usual one, where it does not.
mode_t CurrentUmask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0) {
      return static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8) & 0777);
    }
  }
  return 022;
}

// Creates the temporary file beside `path`; its name in *temp, its descriptor returned
// (-1 with the error in *status).
int CreateTemp(const std::string& path, std::string* temp, absl::Status* status) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
  const std::string name = absl::StrCat(dir.string(), "/.", p.filename().string(), ".XXXXXX");
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  const int fd = mkstemp(buf.data());
  if (fd < 0) {
    *status = SystemError(path, "cannot create a temporary file beside it", errno);
    return -1;
  }
  *temp = buf.data();
  if (fchmod(fd, 0644 & ~CurrentUmask()) != 0) {
    const int err = errno;
    close(fd);
    unlink(temp->c_str());
    *status = SystemError(path, "chmod", err);
    return -1;
  }
  return fd;
}

// Flushes the finished temporary file and renames it over `path`; removes it on failure.
absl::Status Commit(const std::string& path, const std::string& temp) {
  const int fd = open(temp.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 || fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    unlink(temp.c_str());
    return SystemError(path, "flush", err);
  }
  close(fd);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(temp.c_str());
    return err == EISDIR || err == ENOTEMPTY || err == EEXIST
               ? absl::InvalidArgumentError(absl::StrCat(
                     "cannot write ", Shown(path), ": it is a directory; give a file name"))
               : SystemError(path, "rename", err);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  if (absl::Status s = CheckTarget(path); !s.ok()) return s;
  std::string temp;
  absl::Status status;
  const int fd = CreateTemp(path, &temp, &status);
  if (fd < 0) return status;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      unlink(temp.c_str());
      return SystemError(path, "write", err);
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int err = errno;
    unlink(temp.c_str());
    return SystemError(path, "close", err);
  }
  return Commit(path, temp);
}

absl::Status WriteFileAtomicallyWith(const std::string& path,
                                     const std::function<absl::Status(const std::string&)>& write) {
  if (absl::Status s = CheckTarget(path); !s.ok()) return s;
  std::string temp;
  absl::Status status;
  const int fd = CreateTemp(path, &temp, &status);
  if (fd < 0) return status;
  close(fd);
  absl::Status written = write(temp);
  if (!written.ok()) {
    unlink(temp.c_str());
    return written;
  }
  return Commit(path, temp);
}

}  // namespace joule
