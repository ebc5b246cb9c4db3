#include "worker/devices/gpu_claim.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#ifdef JOULE_WITH_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

namespace joule::worker {
namespace {

// Bus ids hold ':' and '.', fine in a file name; anything else is replaced.
std::string LockName(const std::string& lock_dir, const std::string& bus_id) {
  std::string id = bus_id;
  for (char& c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == ':' || c == '.')) c = '_';
  }
  return absl::StrCat(lock_dir, "/joule-gpu-", id, ".lock");
}

// The locked descriptor, -1 when another process holds the lock, or the errno.
absl::StatusOr<int> TryLock(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  const int err = errno;
  close(fd);
  if (err == EWOULDBLOCK) return -1;
  return absl::UnavailableError(absl::StrCat("cannot lock ", path, ": ", std::strerror(err)));
}

}  // namespace

absl::StatusOr<GpuClaim> GpuClaim::Claim(int requested, const std::vector<std::string>& bus_ids,
                                         const std::string& lock_dir) {
  const int n = static_cast<int>(bus_ids.size());
  if (requested >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", requested, " does not exist (", n, " visible)"));
  }
  std::vector<int> order;
  if (requested >= 0) {
    order.push_back(requested);
  } else {
    for (int i = 0; i < n; ++i) order.push_back(i);
  }
  std::vector<std::string> held;
  for (int device : order) {
    absl::StatusOr<int> fd = TryLock(LockName(lock_dir, bus_ids[device]));
    if (!fd.ok()) return fd.status();
    if (*fd >= 0) return GpuClaim(device, bus_ids[device], *fd);
    held.push_back(absl::StrCat(device, " (", bus_ids[device], ")"));
  }
  if (n == 0) return absl::ResourceExhaustedError("no CUDA device is visible");
  return absl::ResourceExhaustedError(
      absl::StrCat("CUDA device(s) ", absl::StrJoin(held, ", "),
                   " held by other workers on this host (locks in ", lock_dir, ")"));
}

GpuClaim::GpuClaim(GpuClaim&& other) noexcept
    : device_(other.device_), bus_id_(std::move(other.bus_id_)), fd_(other.fd_) {
  other.fd_ = -1;
}

GpuClaim& GpuClaim::operator=(GpuClaim&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    device_ = other.device_;
    bus_id_ = std::move(other.bus_id_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

GpuClaim::~GpuClaim() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

absl::StatusOr<std::vector<std::string>> CudaDeviceBusIds() {
#ifdef JOULE_WITH_CUDA_RUNTIME
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cannot count CUDA devices: ", cudaGetErrorString(e)));
  }
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    char id[32] = {};
    if (cudaError_t e = cudaDeviceGetPCIBusId(id, sizeof(id), i); e != cudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat("cannot read CUDA device ", i, "'s PCI bus id: ", cudaGetErrorString(e)));
    }
    ids.emplace_back(id);
  }
  return ids;
#else
  return absl::FailedPreconditionError(
      "a GPU worker needs a build with the CUDA toolkit and NCCL (see README, GPU builds)");
#endif
}

}  // namespace joule::worker
