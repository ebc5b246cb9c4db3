#ifndef JOULE_WORKER_ENERGY_NVML_SOURCE_H_
#define JOULE_WORKER_ENERGY_NVML_SOURCE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/energy/power_source.h"

namespace joule::worker {

struct NvmlFunctions;  // the dlsym'd entry points

// NVIDIA GPUs through NVML, loaded at run time with dlopen (no link-time dependency: the
// same binary runs on machines without a driver). Per GPU the worker owns (CUDA_VISIBLE_DEVICES,
// by index or UUID prefix), identified by UUID:
//  - source "nvml": nvmlDeviceGetTotalEnergyConsumption, millijoules since the driver
//    loaded (Volta and newer);
//  - source "nvml_power": where that is NOT_SUPPORTED, nvmlDeviceGetPowerUsage (mW)
//    integrated with the trapezoid rule between reads.
// A GPU whose readings fail at Open is left out with a logged reason.
class NvmlSource final : public PowerSource {
 public:
  // `library`: "libnvidia-ml.so.1" or a path (tests load a fake). `visible_devices`: the
  // value of CUDA_VISIBLE_DEVICES, or nullptr when unset (all GPUs).
  // Errors: UNAVAILABLE naming the library when it cannot be loaded or initialised;
  // NOT_FOUND when no visible GPU can be read.
  static absl::StatusOr<std::unique_ptr<NvmlSource>> Open(const std::string& library,
                                                          const char* visible_devices,
                                                          Clock::TimePoint now);
  ~NvmlSource() override;

  const std::vector<EnergyChannel>& channels() const override { return channels_; }
  absl::Status Read(Clock::TimePoint now, std::vector<double>* joules) override;
  // Power limit and utilisation (GPU busy time over NVML's last sample period) of every
  // channel's GPU.
  void AppendStatus(std::vector<DeviceStatus>* out) override;
  // Reasons GPUs were left out at Open.
  const std::vector<std::string>& skipped() const { return skipped_; }

 private:
  struct Gpu {
    void* handle = nullptr;
    bool counter = false;
    unsigned long long last_mj = 0;
    double last_watts = 0;
  };
  NvmlSource() = default;
  void* library_ = nullptr;
  std::unique_ptr<NvmlFunctions> fn_;
  std::vector<EnergyChannel> channels_;
  std::vector<Gpu> gpus_;
  std::vector<std::string> skipped_;
  Clock::TimePoint last_read_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_NVML_SOURCE_H_
