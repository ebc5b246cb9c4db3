// A fake libnvidia-ml.so for tests: exports the NVML entry points Joule uses, with
// scripted readings, so NvmlSource runs in CI through the same dlopen path as on a GPU
// machine. Scripted by environment variables read at nvmlInit_v2:
//   FAKE_NVML_DEVICES   comma list, one entry per GPU: "counter" (energy counter, +1000 mJ
//                       per read), "power" (counter NOT_SUPPORTED; power 100 W on the
//                       first read, then 100 W more on each), "error" (both fail with
//                       NVML_ERROR_UNKNOWN); a suffix ":mig" puts that GPU in MIG mode
//   FAKE_NVML_INIT      "fail" makes nvmlInit_v2 return NVML_ERROR_DRIVER_NOT_LOADED
// GPU i has UUID "GPU-fake-<i>", PCI bus id "00000000:<1A+i, 2 hex digits>:00.0" (found by
// nvmlDeviceGetHandleByPciBusId_v2 in any domain width or case, as NVML does), name
// "Fake H200", power limit 700 W, utilisation 50%.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

enum Kind { kCounter, kPower, kError };
struct Gpu {
  Kind kind;
  unsigned long long energy_mj = 5000;
  unsigned power_mw = 0;
  bool mig = false;
};
std::vector<Gpu> gpus;

constexpr int kSuccess = 0;
constexpr int kNotSupported = 3;
constexpr int kDriverNotLoaded = 9;
constexpr int kUnknown = 999;

Gpu* Get(void* handle) {
  auto i = reinterpret_cast<uintptr_t>(handle) - 1;
  return i < gpus.size() ? &gpus[i] : nullptr;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  const char* init = std::getenv("FAKE_NVML_INIT");
  if (init && std::string(init) == "fail") return kDriverNotLoaded;
  gpus.clear();
  const char* devices = std::getenv("FAKE_NVML_DEVICES");
  std::string list = devices ? devices : "counter";
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    std::string item = list.substr(start, end == std::string::npos ? std::string::npos : end - start);
    bool mig = false;
    if (size_t colon = item.find(":mig"); colon != std::string::npos) {
      mig = true;
      item = item.substr(0, colon);
    }
    if (item == "counter") gpus.push_back({kCounter});
    else if (item == "power") gpus.push_back({kPower});
    else if (item == "error") gpus.push_back({kError});
    else item.clear();
    if (!item.empty()) gpus.back().mig = mig;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return kSuccess;
}

int nvmlShutdown() { return kSuccess; }

const char* nvmlErrorString(int r) {
  switch (r) {
    case kNotSupported: return "Not Supported";
    case kDriverNotLoaded: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = static_cast<unsigned>(gpus.size());
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** handle) {
  if (i >= gpus.size()) return kUnknown;
  *handle = reinterpret_cast<void*>(static_cast<uintptr_t>(i) + 1);
  return kSuccess;
}

int nvmlDeviceGetUUID(void* handle, char* buf, unsigned len) {
  std::snprintf(buf, len, "GPU-fake-%zu", static_cast<size_t>(reinterpret_cast<uintptr_t>(handle) - 1));
  return kSuccess;
}

int nvmlDeviceGetName(void*, char* buf, unsigned len) {
  std::snprintf(buf, len, "Fake H200");
  return kSuccess;
}

int nvmlDeviceGetTotalEnergyConsumption(void* handle, unsigned long long* mj) {
  Gpu* g = Get(handle);
  if (!g) return kUnknown;
  if (g->kind == kPower) return kNotSupported;
  if (g->kind == kError) return kUnknown;
  g->energy_mj += 1000;
  *mj = g->energy_mj;
  return kSuccess;
}

int nvmlDeviceGetPowerUsage(void* handle, unsigned* mw) {
  Gpu* g = Get(handle);
  if (!g || g->kind == kError) return kUnknown;
  g->power_mw += 100000;
  *mw = g->power_mw;
  return kSuccess;
}

int nvmlDeviceGetEnforcedPowerLimit(void*, unsigned* mw) {
  *mw = 700000;
  return kSuccess;
}

struct Utilization {
  unsigned gpu, memory;
};
int nvmlDeviceGetUtilizationRates(void*, Utilization* u) {
  u->gpu = 50;
  u->memory = 20;
  return kSuccess;
}

constexpr int kNotFound = 6;
constexpr int kInvalidArgument = 2;

int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** handle) {
  unsigned domain, bus, device, function;
  char extra;
  if (bus_id == nullptr ||
      std::sscanf(bus_id, "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &extra) != 4) {
    return kInvalidArgument;
  }
  if (domain != 0 || device != 0 || function != 0 || bus < 0x1A || bus - 0x1A >= gpus.size()) {
    return kNotFound;
  }
  *handle = reinterpret_cast<void*>(static_cast<uintptr_t>(bus - 0x1A) + 1);
  return kSuccess;
}

int nvmlDeviceGetMigMode(void* handle, unsigned* current, unsigned* pending) {
  Gpu* g = Get(handle);
  if (!g) return kUnknown;
  *current = *pending = g->mig ? 1 : 0;
  return kSuccess;
}

}  // extern "C"
