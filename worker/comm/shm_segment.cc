#include "worker/comm/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace joule::worker {
namespace {

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

std::string FreeSpace(const std::string& dir) {
  struct statvfs v;
  if (statvfs(dir.c_str(), &v) != 0) return "";
  return absl::StrFormat(" (%s has %.1f MiB free)", dir,
                         static_cast<double>(v.f_bavail) * v.f_frsize / (1 << 20));
}

}  // namespace

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      name_(std::move(other.name_)),
      linked_(std::exchange(other.linked_, false)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
  Unlink();
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

void ShmSegment::Unlink() {
  if (!linked_) return;
  shm_unlink(name_.c_str());
  linked_ = false;
}

std::shared_ptr<void> ShmSegment::Share() && {
  auto owner = std::make_shared<ShmSegment>(std::move(*this));
  void* base = owner->data();
  return std::shared_ptr<void>(std::move(owner), base);
}

std::string ShmSegment::NewName() {
  std::random_device rd;
  return absl::StrFormat("/joule-%d-%08x%08x", getpid(), rd(), rd());
}

absl::StatusOr<ShmSegment> ShmSegment::Create(size_t bytes, const std::string& free_space_dir) {
  const std::string name = NewName();
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return absl::UnavailableError(Errno(absl::StrCat("shm_open ", name)));
  // From here the name exists: this object removes it on every error path.
  ShmSegment segment(nullptr, 0, name, /*linked=*/true);
  if (int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("reserving ", bytes, " bytes for ", name, ": ",
                                               std::strerror(e), FreeSpace(free_space_dir)));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const std::string error = Errno(absl::StrCat("mmap ", name));
    close(fd);
    return absl::UnavailableError(error);
  }
  close(fd);
  segment.base_ = base;
  segment.bytes_ = bytes;
  return segment;
}

absl::StatusOr<ShmSegment> ShmSegment::Attach(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return absl::UnavailableError(Errno(absl::StrCat("shm_open ", name)));
  std::string error;
  void* base = MAP_FAILED;
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
  if (!error.empty()) return absl::UnavailableError(error);
  return ShmSegment(base, bytes, name, /*linked=*/false);
}

absl::StatusOr<ShmSegment> ShmSegment::Establish(int rank, size_t bytes,
                                                 SegmentExchange& exchange, const Hooks& hooks,
                                                 const std::string& free_space_dir) {
  ShmSegment segment;
  std::string error;  // this rank's vote: "" when it mapped the segment
  if (rank == 0) {
    absl::StatusOr<ShmSegment> created = Create(bytes, free_space_dir);
    if (created.ok()) {
      segment = *std::move(created);
      if (hooks.init) hooks.init(segment);
    } else {
      error = std::string(created.status().message());
    }
    // On error `segment` is empty; on a failed publish it is unlinked and unmapped here.
    if (absl::Status s = exchange.Publish(error.empty() ? segment.name() : "", error);
        !s.ok()) {
      return s;
    }
    if (!error.empty()) return absl::UnavailableError(error);
  } else {
    absl::StatusOr<std::string> name = exchange.ReadName();
    if (!name.ok()) return name.status();
    absl::StatusOr<ShmSegment> attached = Attach(*name, bytes);
    if (attached.ok()) {
      segment = *std::move(attached);
      if (hooks.check) error = hooks.check(segment);
    } else {
      error = std::string(attached.status().message());
    }
  }
  absl::Status vote = exchange.Vote(error);
  segment.Unlink();  // every rank has mapped it or given up
  if (!vote.ok()) return vote;
  if (!error.empty()) return absl::UnavailableError(error);
  return segment;
}

int ShmSegment::SweepStale(const std::string& dir) {
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

}  // namespace joule::worker
