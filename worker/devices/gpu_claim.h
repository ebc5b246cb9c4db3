#ifndef JOULE_WORKER_DEVICES_GPU_CLAIM_H_
#define JOULE_WORKER_DEVICES_GPU_CLAIM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace joule::worker {

// The CUDA device a GPU worker trains on, held for the worker's life so that no other
// worker on the host takes it: one flock(2) per device on LOCK_DIR/joule-gpu-<id>.lock,
// where <id> is the device's PCI bus id (the same GPU whatever CUDA_VISIBLE_DEVICES
// renumbers). The kernel releases the lock when the process ends, however it ends.
// Before this, a worker took the device numbered by its rank's position within its own
// gang, so two one-GPU jobs on a two-GPU host both took cuda:0.
//
// Move-only; not thread-safe.
class GpuClaim {
 public:
  // Claims device `requested` when it is >= 0 (an operator's --cuda-device), else the
  // first of the devices no other worker holds. `bus_ids[i]` is CUDA device i's PCI bus
  // id (CudaDeviceBusIds()).
  // Errors: INVALID_ARGUMENT for a requested device out of range; RESOURCE_EXHAUSTED when
  // it (or, unrequested, every device) is held by another worker, naming them;
  // UNAVAILABLE when the lock directory cannot be used.
  static absl::StatusOr<GpuClaim> Claim(int requested, const std::vector<std::string>& bus_ids,
                                        const std::string& lock_dir = "/dev/shm");
  GpuClaim(GpuClaim&& other) noexcept;
  GpuClaim& operator=(GpuClaim&& other) noexcept;
  GpuClaim(const GpuClaim&) = delete;
  GpuClaim& operator=(const GpuClaim&) = delete;
  ~GpuClaim();

  int device() const { return device_; }
  const std::string& bus_id() const { return bus_id_; }

 private:
  GpuClaim(int device, std::string bus_id, int fd)
      : device_(device), bus_id_(std::move(bus_id)), fd_(fd) {}
  int device_ = -1;
  std::string bus_id_;
  int fd_ = -1;
};

// The PCI bus id of every CUDA device this process sees, in CUDA's order
// ("0000:3B:00.0"). Errors: FAILED_PRECONDITION in a build without CUDA; UNAVAILABLE
// when the CUDA runtime cannot count the devices (no driver, no GPU).
absl::StatusOr<std::vector<std::string>> CudaDeviceBusIds();

}  // namespace joule::worker

#endif  // JOULE_WORKER_DEVICES_GPU_CLAIM_H_
