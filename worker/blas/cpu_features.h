#ifndef JOULE_WORKER_BLAS_CPU_FEATURES_H_
#define JOULE_WORKER_BLAS_CPU_FEATURES_H_

#include <string>
#include <vector>

namespace joule::worker {

// What this CPU can run, from cpuid (Intel SDM vol. 2A, CPUID: leaf 1 ECX for FMA, AVX,
// OSXSAVE; leaf 7 sub-leaf 0 EBX/EDX/EAX for AVX2, AVX-512 F/DQ/CD/BW/VL, AMX, AVX512_BF16
// in sub-leaf 1), each vector extension counted only where the OS saves its registers
// (XGETBV XCR0: bits 1-2 for AVX, 5-7 for AVX-512, 17-18 for AMX tiles). x86-64 only; on
// another architecture every flag is false and `vendor` is "".
struct CpuFeatures {
  std::string vendor;         // "GenuineIntel", "AuthenticAMD", ...
  int family = 0, model = 0;  // display family and model (leaf 1, extended fields added)
  std::string model_name;     // the brand string (leaves 0x80000002-4), trimmed
  bool fma = false, avx = false, avx2 = false;
  bool avx512f = false, avx512dq = false, avx512cd = false, avx512bw = false, avx512vl = false;
  bool avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false;

  // The flags set, by their /proc/cpuinfo names ("avx2", "avx512f", "amx_tile", ...).
  std::vector<std::string> Names() const;
  // The widest vector ISA usable: 0 SSE only, 1 AVX, 2 AVX2 + FMA, 3 AVX-512 F/BW/VL/DQ/CD.
  int IsaLevel() const;
};

// This CPU's, read once per call (cheap: a few cpuid instructions). Thread-safe.
CpuFeatures DetectCpuFeatures();

}  // namespace joule::worker

#endif  // JOULE_WORKER_BLAS_CPU_FEATURES_H_
