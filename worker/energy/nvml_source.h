#ifndef JOULE_WORKER_ENERGY_NVML_SOURCE_H_
#define JOULE_WORKER_ENERGY_NVML_SOURCE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/energy/power_source.h"

namespace joule::worker {

struct NvmlFunctions;  // the dlsym'd entry points

// What NvmlSource reads of each GPU.
enum class NvmlReading {
  kCounterWherePossible,  // the energy counter ("nvml"); power ("nvml_power") without one
  kPowerOnly,             // power integrated ("nvml_power") even where a counter exists:
                          // the fallback measured against the counter (joule-bench-nvml)
};

// NVIDIA GPUs through NVML, loaded at run time with dlopen (no link-time dependency: the
// same binary runs on machines without a driver). Per GPU the worker owns (CUDA_VISIBLE_DEVICES,
// by index or UUID prefix), identified by UUID:
//  - source "nvml": nvmlDeviceGetTotalEnergyConsumption, millijoules since the driver
//    loaded (Volta and newer);
//  - source "nvml_power": where that is NOT_SUPPORTED, nvmlDeviceGetPowerUsage (mW)
//    integrated with the trapezoid rule between reads.
// A GPU whose readings fail at Open is left out with a logged reason.
//
// A GPU worker opens it with OpenByPciBusId: it meters the one GPU it trains on, found by
// the PCI bus id CUDA reports for its device (NVML's and CUDA's device orders differ:
// CUDA's default is fastest first, and CUDA_VISIBLE_DEVICES renumbers). Open (every
// visible GPU) is for tools that meter a whole host.
class NvmlSource final : public PowerSource {
 public:
  // `library`: "libnvidia-ml.so.1" or a path (tests load a fake). `visible_devices`: the
  // value of CUDA_VISIBLE_DEVICES, or nullptr when unset (all GPUs).
  // Errors: UNAVAILABLE naming the library when it cannot be loaded or initialised;
  // NOT_FOUND when no visible GPU can be read.
  static absl::StatusOr<std::unique_ptr<NvmlSource>> Open(
      const std::string& library, const char* visible_devices, Clock::TimePoint now,
      NvmlReading reading = NvmlReading::kCounterWherePossible);
  // The one GPU whose PCI bus id is `pci_bus_id` (as cudaDeviceGetPCIBusId writes it,
  // "0000:3B:00.0", or NVML's "00000000:3B:00.0"), as channel `device` (e.g. "gpu-0",
  // the CUDA device). Errors: UNAVAILABLE as Open; NOT_FOUND when NVML has no GPU at
  // that bus id or cannot read it; FAILED_PRECONDITION when the GPU is in MIG mode (its
  // energy counter covers every MIG instance, so it cannot be a job's).
  static absl::StatusOr<std::unique_ptr<NvmlSource>> OpenByPciBusId(
      const std::string& library, const std::string& pci_bus_id, const std::string& device,
      Clock::TimePoint now, NvmlReading reading = NvmlReading::kCounterWherePossible);
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
  // dlopens and initialises NVML. Errors: UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<NvmlSource>> LoadLibrary(const std::string& library);
  // Adds `handle` as channel `device`; a GPU that cannot be read goes to skipped_.
  void AddGpu(void* handle, const std::string& device, const std::string& uuid,
              NvmlReading reading = NvmlReading::kCounterWherePossible);
  void* library_ = nullptr;
  std::unique_ptr<NvmlFunctions> fn_;
  std::vector<EnergyChannel> channels_;
  std::vector<Gpu> gpus_;
  std::vector<std::string> skipped_;
  Clock::TimePoint last_read_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_NVML_SOURCE_H_
