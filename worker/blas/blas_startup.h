#ifndef JOULE_WORKER_BLAS_BLAS_STARTUP_H_
#define JOULE_WORKER_BLAS_BLAS_STARTUP_H_

#include <string>

#include "joule/v1/job.pb.h"

namespace joule::worker {

// Settles the OpenBLAS kernel for this process before any GEMM runs (OpenBLAS reads
// OPENBLAS_CORETYPE once, when it loads, so a change takes a new image of the program):
//   1. ChooseKernel (kernel_choice.h) on the core OpenBLAS chose, the CPU's features,
//      `mode` (--blas-kernel: auto, keep or a core name) and the user's OPENBLAS_CORETYPE;
//   2. to switch, re-executes /proc/self/exe with `argv`, OPENBLAS_CORETYPE=CORE and
//      JOULE_BLAS_SWITCHED=CORE (so the new image knows the variable is its own, not the
//      user's); this call then does not return;
//   3. in the re-executed image: the core must be the one asked for (an unknown name makes
//      OpenBLAS pick another) and pass CheckSgemm; else it re-executes once more without
//      OPENBLAS_CORETYPE and with JOULE_BLAS_REJECTED=why, and that image keeps
//      OpenBLAS's own choice with a warning.
// Returns what was settled (every field of BlasInfo), the self-check's result included; a
// failed re-exec is logged and the current kernel kept. Call once, from main, before
// threads start (it reads and sets the environment). Logs with spdlog.
v1::BlasInfo SettleBlasKernel(const std::string& mode, char** argv);

}  // namespace joule::worker

#endif  // JOULE_WORKER_BLAS_BLAS_STARTUP_H_
