#include "worker/blas/blas_startup.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "worker/blas/blas_runtime.h"
#include "worker/blas/cpu_features.h"
#include "worker/blas/kernel_choice.h"

namespace joule::worker {

namespace {

constexpr char kSwitched[] = "JOULE_BLAS_SWITCHED";
constexpr char kRejected[] = "JOULE_BLAS_REJECTED";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Replaces this process's image with itself; returns only on failure (logged).
void ReExec(char** argv) {
  execv("/proc/self/exe", argv);
  spdlog::warn("blas: cannot re-execute /proc/self/exe ({}): keeping the current kernel",
               std::strerror(errno));
}

v1::BlasInfo Describe(const BlasRuntime& blas, const CpuFeatures& cpu, const std::string& choice) {
  v1::BlasInfo info;
  info.set_library(blas.library);
  info.set_config(blas.config);
  info.set_core(blas.core);
  info.set_threads(blas.threads);
  info.set_cpu_model(cpu.model_name);
  for (const std::string& f : cpu.Names()) info.add_cpu_features(f);
  info.set_choice(choice);
  const int level = CoreIsaLevel(blas.core);
  info.set_fallback(blas.library == "OpenBLAS" && level >= 0 && level < cpu.IsaLevel());
  return info;
}

}  // namespace

v1::BlasInfo SettleBlasKernel(const std::string& mode, char** argv) {
  const CpuFeatures cpu = DetectCpuFeatures();
  const BlasRuntime blas = DetectBlasRuntime();
  const std::string switched = Env(kSwitched);
  std::string choice;
  if (!switched.empty()) {
    // This image was re-executed to run `switched`: check that it does, and computes right.
    absl::StatusOr<GemmCheck> check = CheckSgemm(FindSgemm());
    std::string why;
    if (!absl::EqualsIgnoreCase(blas.core, switched)) {
      why = absl::StrCat("OpenBLAS runs ", blas.core, ", not ", switched,
                         " (a core this OpenBLAS does not know by that name)");
    } else if (!check.ok()) {
      why = absl::StrCat("its sgemm check could not run: ", check.status().message());
    } else if (!check->ok) {
      why = absl::StrCat("its sgemm is wrong: error ", check->worst_ratio,
                         "x the float bound (max abs ", check->max_abs_error, ")");
    }
    if (why.empty()) {
      choice =
          absl::StrCat(Env("JOULE_BLAS_REASON").empty() ? "switched" : Env("JOULE_BLAS_REASON"),
                       "; checked: sgemm within the float error bound");
      spdlog::info("blas: {} {} ({} threads): {}", blas.library, blas.core, blas.threads, choice);
    } else {
      unsetenv("OPENBLAS_CORETYPE");
      unsetenv(kSwitched);
      setenv(kRejected, absl::StrCat(switched, ": ", why).c_str(), 1);
      spdlog::warn("blas: {} rejected: {}; restarting on OpenBLAS's own choice", switched, why);
      ReExec(argv);
      choice = absl::StrCat(switched, " rejected: ", why);
    }
  } else if (const std::string rejected = Env(kRejected); !rejected.empty()) {
    choice = absl::StrCat("kept OpenBLAS's own choice, ", blas.core, ": switching to ", rejected);
    spdlog::warn("blas: {}", choice);
  } else {
    const KernelDecision d = ChooseKernel(mode, blas.library == "OpenBLAS" ? blas.core : "", cpu,
                                          Env("OPENBLAS_CORETYPE"));
    choice = d.reason;
    if (d.switch_core) {
      spdlog::info("blas: {}: restarting with OPENBLAS_CORETYPE={}", d.reason, d.core);
      setenv("OPENBLAS_CORETYPE", d.core.c_str(), 1);
      setenv(kSwitched, d.core.c_str(), 1);
      setenv("JOULE_BLAS_REASON", d.reason.c_str(), 1);
      ReExec(argv);
      unsetenv("OPENBLAS_CORETYPE");
      unsetenv(kSwitched);
      choice = absl::StrCat(d.reason, " (not applied: the re-exec failed)");
    }
  }
  v1::BlasInfo info = Describe(blas, cpu, choice);
  if (absl::StatusOr<GemmCheck> check = CheckSgemm(FindSgemm()); check.ok()) {
    info.set_sgemm_gflops(
        check->microseconds > 0 ? 2.0 * 64 * 784 * 512 / (check->microseconds * 1e3) : 0);
    if (!check->ok) {
      spdlog::error("blas: {} {}'s sgemm fails its check: error {}x the float bound", blas.library,
                    blas.core, check->worst_ratio);
    }
  }
  if (info.fallback()) {
    spdlog::warn(
        "blas: {} runs {}, a kernel narrower than this CPU's vectors ({}): GEMMs may "
        "be ~3x slower than they could be",
        blas.library, blas.core, cpu.model_name);
  }
  return info;
}

}  // namespace joule::worker
