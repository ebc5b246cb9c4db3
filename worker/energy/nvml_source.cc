#include "worker/energy/nvml_source.h"

#include <dlfcn.h>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace joule::worker {

// The subset of the NVML C API (nvml.h, NVIDIA Management Library) Joule uses, declared
// here so that building needs no driver or toolkit headers. Types are ABI-compatible.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr unsigned NVML_DEVICE_MIG_ENABLE = 1;  // nvml.h: nvmlDeviceGetMigMode's modes

struct NvmlFunctions {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*total_energy)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*handle_by_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*mig_mode)(nvmlDevice_t, unsigned int*, unsigned int*) = nullptr;

  std::string Error(nvmlReturn_t r) const {
    return absl::StrCat(error_string ? error_string(r) : "error", " (", r, ")");
  }
};

namespace {

template <typename F>
bool Load(void* lib, const char* symbol, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, symbol));
  return *out != nullptr;
}

// Which NVML indices CUDA_VISIBLE_DEVICES allows: a comma list of indices or UUIDs
// (full or prefix, "GPU-..."); unset means all; an entry that matches nothing ends the
// list, as in CUDA.
std::vector<unsigned> VisibleIndices(const char* visible, const std::vector<std::string>& uuids) {
  std::vector<unsigned> out;
  if (visible == nullptr) {
    for (unsigned i = 0; i < uuids.size(); ++i) out.push_back(i);
    return out;
  }
  for (absl::string_view item : absl::StrSplit(visible, ',', absl::SkipWhitespace())) {
    unsigned index;
    if (absl::SimpleAtoi(item, &index)) {
      if (index >= uuids.size()) break;
      out.push_back(index);
      continue;
    }
    bool found = false;
    for (unsigned i = 0; i < uuids.size(); ++i) {
      if (!item.empty() && absl::StartsWith(uuids[i], item)) {
        out.push_back(i);
        found = true;
        break;
      }
    }
    if (!found) break;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmlSource>> NvmlSource::LoadLibrary(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    return absl::UnavailableError(
        absl::StrCat("cannot load ", library, ": ", err ? err : "unknown error"));
  }
  std::unique_ptr<NvmlSource> s(new NvmlSource());
  s->library_ = lib;
  s->fn_ = std::make_unique<NvmlFunctions>();
  NvmlFunctions& f = *s->fn_;
  if (!Load(lib, "nvmlInit_v2", &f.init) || !Load(lib, "nvmlShutdown", &f.shutdown) ||
      !Load(lib, "nvmlDeviceGetCount_v2", &f.count) ||
      !Load(lib, "nvmlDeviceGetHandleByIndex_v2", &f.handle_by_index) ||
      !Load(lib, "nvmlDeviceGetUUID", &f.uuid) ||
      !Load(lib, "nvmlDeviceGetPowerUsage", &f.power_usage)) {
    f.init = nullptr;  // nothing to shut down
    return absl::UnavailableError(absl::StrCat(library, " lacks an NVML entry point Joule needs"));
  }
  Load(lib, "nvmlErrorString", &f.error_string);
  Load(lib, "nvmlDeviceGetName", &f.name);
  Load(lib, "nvmlDeviceGetTotalEnergyConsumption", &f.total_energy);
  Load(lib, "nvmlDeviceGetEnforcedPowerLimit", &f.power_limit);
  Load(lib, "nvmlDeviceGetUtilizationRates", &f.utilization);
  Load(lib, "nvmlDeviceGetHandleByPciBusId_v2", &f.handle_by_bus_id);
  Load(lib, "nvmlDeviceGetMigMode", &f.mig_mode);
  if (nvmlReturn_t r = f.init(); r != NVML_SUCCESS) {
    f.init = nullptr;
    return absl::UnavailableError(absl::StrCat("nvmlInit failed: ", f.Error(r)));
  }
  return s;
}

void NvmlSource::AddGpu(void* handle, const std::string& device, const std::string& uuid,
                        NvmlReading reading) {
  const NvmlFunctions& f = *fn_;
  Gpu gpu;
  gpu.handle = handle;
  unsigned long long mj = 0;
  nvmlReturn_t r = f.total_energy && reading == NvmlReading::kCounterWherePossible
                       ? f.total_energy(gpu.handle, &mj)
                       : -1;
  if (r == NVML_SUCCESS) {
    gpu.counter = true;
    gpu.last_mj = mj;
  } else {
    unsigned mw = 0;
    nvmlReturn_t p = f.power_usage(gpu.handle, &mw);
    if (p != NVML_SUCCESS) {
      skipped_.push_back(absl::StrCat(device, " (", uuid, "): energy ", f.Error(r), ", power ",
                                      f.Error(p)));
      return;
    }
    gpu.last_watts = mw / 1000.0;
  }
  EnergyChannel ch;
  ch.device = device;
  ch.source = gpu.counter ? "nvml" : "nvml_power";
  ch.uuid = uuid;
  char name[96] = {0};
  if (f.name && f.name(gpu.handle, name, sizeof(name)) == NVML_SUCCESS) ch.name = name;
  channels_.push_back(ch);
  gpus_.push_back(gpu);
}

absl::StatusOr<std::unique_ptr<NvmlSource>> NvmlSource::Open(const std::string& library,
                                                             const char* visible_devices,
                                                             Clock::TimePoint now,
                                                             NvmlReading reading) {
  absl::StatusOr<std::unique_ptr<NvmlSource>> loaded = LoadLibrary(library);
  if (!loaded.ok()) return loaded.status();
  std::unique_ptr<NvmlSource> s = *std::move(loaded);
  const NvmlFunctions& f = *s->fn_;
  unsigned count = 0;
  if (nvmlReturn_t r = f.count(&count); r != NVML_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount failed: ", f.Error(r)));
  }
  std::vector<nvmlDevice_t> handles(count, nullptr);
  std::vector<std::string> uuids(count);
  for (unsigned i = 0; i < count; ++i) {
    char buf[96] = {0};
    if (f.handle_by_index(i, &handles[i]) == NVML_SUCCESS &&
        f.uuid(handles[i], buf, sizeof(buf)) == NVML_SUCCESS) {
      uuids[i] = buf;
    }
  }
  for (unsigned i : VisibleIndices(visible_devices, uuids)) {
    const std::string device = absl::StrCat("gpu-", i);
    if (uuids[i].empty()) {
      s->skipped_.push_back(absl::StrCat(device, ": no handle or UUID"));
      continue;
    }
    s->AddGpu(handles[i], device, uuids[i], reading);
  }
  for (const std::string& why : s->skipped_) spdlog::warn("nvml: leaving out {}", why);
  if (s->gpus_.empty()) {
    return absl::NotFoundError(absl::StrCat("nvml: no visible GPU can be read (", count,
                                            " present)"));
  }
  s->last_read_ = now;
  return s;
}

absl::StatusOr<std::unique_ptr<NvmlSource>> NvmlSource::OpenByPciBusId(
    const std::string& library, const std::string& pci_bus_id, const std::string& device,
    Clock::TimePoint now, NvmlReading reading) {
  absl::StatusOr<std::unique_ptr<NvmlSource>> loaded = LoadLibrary(library);
  if (!loaded.ok()) return loaded.status();
  std::unique_ptr<NvmlSource> s = *std::move(loaded);
  const NvmlFunctions& f = *s->fn_;
  if (f.handle_by_bus_id == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(library, " lacks nvmlDeviceGetHandleByPciBusId_v2"));
  }
  nvmlDevice_t handle = nullptr;
  if (nvmlReturn_t r = f.handle_by_bus_id(pci_bus_id.c_str(), &handle); r != NVML_SUCCESS) {
    return absl::NotFoundError(absl::StrCat("nvml: no GPU at PCI bus id \"", pci_bus_id,
                                            "\" (", device, "): ", f.Error(r)));
  }
  unsigned current = 0, pending = 0;
  if (f.mig_mode && f.mig_mode(handle, &current, &pending) == NVML_SUCCESS &&
      current == NVML_DEVICE_MIG_ENABLE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nvml: the GPU at PCI bus id ", pci_bus_id, " (", device,
        ") is in MIG mode; its energy counter covers all its MIG instances, so Joule cannot "
        "meter one job on it: disable MIG (nvidia-smi -i <gpu> -mig 0) or run the worker "
        "with --energy-period-ms 0"));
  }
  char uuid[96] = {0};
  if (nvmlReturn_t r = f.uuid(handle, uuid, sizeof(uuid)); r != NVML_SUCCESS) {
    return absl::NotFoundError(absl::StrCat("nvml: GPU at PCI bus id ", pci_bus_id,
                                            " has no UUID: ", f.Error(r)));
  }
  s->AddGpu(handle, device, uuid, reading);
  if (s->gpus_.empty()) {
    return absl::NotFoundError(absl::StrCat("nvml: cannot read ", s->skipped_.front()));
  }
  s->last_read_ = now;
  return s;
}

NvmlSource::~NvmlSource() {
  if (fn_ && fn_->init && fn_->shutdown) fn_->shutdown();
  if (library_) dlclose(library_);
}

absl::Status NvmlSource::Read(Clock::TimePoint now, std::vector<double>* joules) {
  joules->clear();
  // Read every GPU before updating any, so a failed read loses nothing: the counter's
  // energy and the power integral's time carry into the next successful Read.
  std::vector<unsigned long long> mj(gpus_.size());
  std::vector<unsigned> mw(gpus_.size());
  for (size_t i = 0; i < gpus_.size(); ++i) {
    nvmlReturn_t r = gpus_[i].counter ? fn_->total_energy(gpus_[i].handle, &mj[i])
                                      : fn_->power_usage(gpus_[i].handle, &mw[i]);
    if (r != NVML_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("nvml ", channels_[i].device, ": ",
                                                 gpus_[i].counter ? "energy" : "power",
                                                 " read failed: ", fn_->Error(r)));
    }
  }
  const double dt = Seconds(now - last_read_);
  joules->assign(gpus_.size(), 0.0);
  for (size_t i = 0; i < gpus_.size(); ++i) {
    Gpu& g = gpus_[i];
    if (g.counter) {
      // A lower reading means the driver reset the counter: count from zero.
      (*joules)[i] = (mj[i] >= g.last_mj ? mj[i] - g.last_mj : mj[i]) / 1000.0;
      g.last_mj = mj[i];
    } else {
      const double watts = mw[i] / 1000.0;
      (*joules)[i] = 0.5 * (g.last_watts + watts) * dt;  // trapezoid rule
      g.last_watts = watts;
    }
  }
  last_read_ = now;
  return absl::OkStatus();
}

void NvmlSource::AppendStatus(std::vector<DeviceStatus>* out) {
  for (size_t i = 0; i < gpus_.size(); ++i) {
    DeviceStatus st;
    st.device = channels_[i].device;
    unsigned mw = 0;
    if (fn_->power_limit && fn_->power_limit(gpus_[i].handle, &mw) == NVML_SUCCESS) {
      st.power_limit_watts = mw / 1000.0;
    }
    nvmlUtilization_t u{};
    if (fn_->utilization && fn_->utilization(gpus_[i].handle, &u) == NVML_SUCCESS) {
      st.utilization = u.gpu / 100.0;
    }
    out->push_back(st);
  }
}

}  // namespace joule::worker
