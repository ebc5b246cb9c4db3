#include "worker/blas/cpu_features.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/ascii.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define JOULE_X86 1
#endif

namespace joule::worker {

namespace {

#ifdef JOULE_X86
// XCR0, the register states the OS saves (XGETBV with ECX = 0); 0 without OSXSAVE.
uint64_t SavedStates(bool osxsave) {
  if (!osxsave) return 0;
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

}  // namespace

std::vector<std::string> CpuFeatures::Names() const {
  std::vector<std::string> names;
  const std::pair<const char*, bool> flags[] = {
      {"fma", fma},           {"avx", avx},           {"avx2", avx2},
      {"avx512f", avx512f},   {"avx512dq", avx512dq}, {"avx512cd", avx512cd},
      {"avx512bw", avx512bw}, {"avx512vl", avx512vl}, {"avx512_bf16", avx512_bf16},
      {"amx_tile", amx_tile}, {"amx_bf16", amx_bf16}};
  for (const auto& [name, set] : flags) {
    if (set) names.emplace_back(name);
  }
  return names;
}

int CpuFeatures::IsaLevel() const {
  if (avx512f && avx512dq && avx512cd && avx512bw && avx512vl) return 3;
  if (avx2 && fma) return 2;
  if (avx) return 1;
  return 0;
}

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
#ifdef JOULE_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  f.family = static_cast<int>(base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family);
  f.model = static_cast<int>(base_family == 0x6 || base_family == 0xf
                                 ? base_model + (((a >> 16) & 0xf) << 4)
                                 : base_model);
  const bool osxsave = (c >> 27) & 1;
  const uint64_t xcr0 = SavedStates(osxsave);
  const bool ymm = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;   // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  f.fma = ymm && ((c >> 12) & 1);
  f.avx = ymm && ((c >> 28) & 1);
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = ymm && ((b >> 5) & 1);
    f.avx512f = zmm && ((b >> 16) & 1);
    f.avx512dq = zmm && ((b >> 17) & 1);
    f.avx512cd = zmm && ((b >> 28) & 1);
    f.avx512bw = zmm && ((b >> 30) & 1);
    f.avx512vl = zmm && ((b >> 31) & 1);
    f.amx_bf16 = tiles && ((d >> 22) & 1);
    f.amx_tile = tiles && ((d >> 24) & 1);
    const unsigned max_sub = a;
    if (max_sub >= 1) {
      __get_cpuid_count(7, 1, &a, &b, &c, &d);
      f.avx512_bf16 = zmm && ((a >> 5) & 1);
    }
  }
  __get_cpuid(0x80000000, &a, &b, &c, &d);
  if (a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &a, &b, &c, &d);
      std::memcpy(brand + 16 * leaf, &a, 4);
      std::memcpy(brand + 16 * leaf + 4, &b, 4);
      std::memcpy(brand + 16 * leaf + 8, &c, 4);
      std::memcpy(brand + 16 * leaf + 12, &d, 4);
    }
    f.model_name = std::string(absl::StripAsciiWhitespace(brand));
  }
#endif
  return f;
}

}  // namespace joule::worker
