#ifndef JOULE_WORKER_BLAS_KERNEL_CHOICE_H_
#define JOULE_WORKER_BLAS_KERNEL_CHOICE_H_

#include <string>

#include "worker/blas/cpu_features.h"

namespace joule::worker {

// The widest vector ISA an OpenBLAS core's kernels use (CpuFeatures::IsaLevel's scale: 0
// SSE, 1 AVX, 2 AVX2 + FMA, 3 AVX-512), from OpenBLAS's kernel/x86_64/KERNEL.<CORE> files;
// -1 for a name not known here (then nothing is changed). Any case.
int CoreIsaLevel(const std::string& core);

// What to do about the kernel OpenBLAS chose when it loaded.
struct KernelDecision {
  bool switch_core = false;  // re-exec with OPENBLAS_CORETYPE = core
  std::string core;          // the core to switch to
  std::string reason;        // one line, for the log and the registration
};

// `mode` (any case): "auto" (switch only from a core whose ISA is narrower than the CPU's
// widest, e.g. the Prescott that Debian 12's OpenBLAS 0.3.21 took on an Intel Xeon family 6
// model 207 with AVX-512), "keep", or a core NAME to switch to (refused, with the reason,
// when this table does not know it or it needs vectors the CPU lacks: OpenBLAS would run it
// anyway and die of SIGILL). `current_core`: openblas_get_corename() ("" when
// the BLAS is not OpenBLAS: nothing to choose). `user_coretype`: OPENBLAS_CORETYPE as the
// user set it ("" unset): it always wins. The core switched to for each ISA level is one
// every OpenBLAS since 0.3.10 accepts in OPENBLAS_CORETYPE (driver/others/dynamic.c):
// SKYLAKEX, HASWELL (ZEN on AMD), SANDYBRIDGE. Pure; thread-safe.
KernelDecision ChooseKernel(const std::string& mode, const std::string& current_core,
                            const CpuFeatures& cpu, const std::string& user_coretype);

}  // namespace joule::worker

#endif  // JOULE_WORKER_BLAS_KERNEL_CHOICE_H_
