#include "worker/blas/blas_startup.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/blas/blas_runtime.h"
#include "worker/blas/cpu_features.h"
#include "worker/blas/kernel_choice.h"

namespace joule::worker {

namespace {

// The re-exec's markers, "PID:VALUE": trusted only by the same process (exec keeps the
// pid), so that one inherited from a parent (a worker started by a worker) is ignored.
constexpr char kSwitched[] = "JOULE_BLAS_SWITCHED";  // PID:CORE, with OPENBLAS_CORETYPE=CORE
constexpr char kRejected[] = "JOULE_BLAS_REJECTED";  // PID:why the switch was undone
constexpr char kReason[] = "JOULE_BLAS_REASON";      // PID:why the switch was made

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The VALUE of a PID:VALUE marker set by this process, or "".
std::string OwnMarker(const char* name) {
  const std::string v = Env(name);
  const size_t colon = v.find(':');
  int pid = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(v.substr(0, colon), &pid) ||
      pid != getpid()) {
    return "";
  }
  return v.substr(colon + 1);
}

void SetMarker(const char* name, const std::string& value) {
  setenv(name, absl::StrCat(getpid(), ":", value).c_str(), 1);
}

// Whether this image can be re-executed as itself: /proc/self/exe is the program (not the
// dynamic loader it was started through, which would take argv as its own).
bool CanReExec() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return !ec && !absl::StartsWith(exe.filename().string(), "ld-");
}

// Replaces this process's image with itself; returns only on failure (logged).
void ReExec(char** argv) {
  execv("/proc/self/exe", argv);
  spdlog::warn("blas: cannot re-execute /proc/self/exe ({})", std::strerror(errno));
}

// Printable ASCII only, at most `limit` bytes: what the coordinator accepts of every text
// of a registration (server/worker_registry.cc), whatever the hypervisor or user wrote.
std::string Clean(const std::string& s, size_t limit) {
  std::string out;
  for (char c : s) {
    if (out.size() >= limit) break;
    if (c >= 0x20 && c < 0x7f) out += c;
  }
  return out;
}

v1::BlasInfo Describe(const BlasRuntime& blas, const CpuFeatures& cpu, const std::string& choice,
                      const std::optional<GemmCheck>& check) {
  v1::BlasInfo info;
  info.set_library(Clean(blas.library, 32));
  info.set_config(Clean(blas.config, 256));
  info.set_core(Clean(blas.core, 32));
  info.set_threads(std::clamp(blas.threads, 0, 65536));
  info.set_cpu_model(Clean(cpu.model_name, 128));
  for (const std::string& f : cpu.Names()) info.add_cpu_features(f);
  info.set_choice(Clean(choice, 512));
  const int level = CoreIsaLevel(blas.core);
  info.set_fallback(blas.library == "OpenBLAS" && level >= 0 && level < cpu.IsaLevel());
  if (check) {
    info.set_sgemm_gflops(check->gflops());
    info.set_sgemm_ok(check->ok);
  }
  return info;
}

}  // namespace

v1::BlasInfo SettleBlasKernel(const std::string& mode, char** argv) {
  const CpuFeatures cpu = DetectCpuFeatures();
  const BlasRuntime blas = DetectBlasRuntime();
  std::optional<GemmCheck> check;
  if (absl::StatusOr<GemmCheck> c = CheckSgemm(FindSgemm()); c.ok()) check = *c;
  const std::string switched = OwnMarker(kSwitched);
  const std::string rejected = OwnMarker(kRejected);
  std::string choice;
  if (!switched.empty() && Env("OPENBLAS_CORETYPE") == switched) {
    // This image was re-executed to run `switched`: check that it does, and computes right.
    std::string why;
    if (!absl::EqualsIgnoreCase(blas.core, switched)) {
      why = absl::StrCat("OpenBLAS runs ", blas.core, ", not ", switched,
                         " (a core this OpenBLAS does not accept by that name)");
    } else if (!check) {
      why = "its sgemm check could not run";
    } else if (!check->ok) {
      why = absl::StrCat("its sgemm is wrong: error ", check->worst_ratio,
                         "x the float bound (max abs ", check->max_abs_error, ")");
    }
    if (why.empty()) {
      const std::string reason = OwnMarker(kReason);
      choice = absl::StrCat(reason.empty() ? "switched" : reason,
                            "; checked: sgemm within the float error bound");
      spdlog::info("blas: {} {} ({} threads): {}", blas.library, blas.core, blas.threads, choice);
    } else {
      unsetenv("OPENBLAS_CORETYPE");
      unsetenv(kSwitched);
      SetMarker(kRejected, absl::StrCat(switched, ": ", why));
      spdlog::warn("blas: {} rejected: {}; restarting on OpenBLAS's own choice", switched, why);
      ReExec(argv);
      if (check && !check->ok) {
        // The kernel loaded computes wrong and cannot be unloaded: do not train on it.
        spdlog::critical("blas: {}'s sgemm is wrong and the worker cannot restart without it",
                         switched);
        std::exit(1);
      }
      choice = absl::StrCat(switched, " rejected (", why, ") but kept: the re-exec failed");
    }
  } else if (!rejected.empty()) {
    choice = absl::StrCat("kept OpenBLAS's own choice, ", blas.core, ": switching to ", rejected);
    spdlog::warn("blas: {}", choice);
  } else {
    KernelDecision d = ChooseKernel(mode, blas.library == "OpenBLAS" ? blas.core : "", cpu,
                                    Env("OPENBLAS_CORETYPE"));
    if (d.switch_core && !absl::StrContains(blas.config, "DYNAMIC_ARCH")) {
      d.switch_core = false;
      d.reason = absl::StrCat(d.reason,
                              ": not applied, this OpenBLAS is built for one kernel "
                              "(no DYNAMIC_ARCH)");
    } else if (d.switch_core && !CanReExec()) {
      d.switch_core = false;
      d.reason = absl::StrCat(d.reason, ": not applied, /proc/self/exe is not this program");
    }
    choice = d.reason;
    if (d.switch_core) {
      spdlog::info("blas: {}: restarting with OPENBLAS_CORETYPE={}", d.reason, d.core);
      setenv("OPENBLAS_CORETYPE", d.core.c_str(), 1);
      SetMarker(kSwitched, d.core);
      SetMarker(kReason, d.reason);
      ReExec(argv);
      unsetenv("OPENBLAS_CORETYPE");
      choice = absl::StrCat(d.reason, " (not applied: the re-exec failed)");
    }
  }
  // Settled: the markers go, so that nothing this process starts inherits them.
  unsetenv(kSwitched);
  unsetenv(kRejected);
  unsetenv(kReason);
  v1::BlasInfo info = Describe(blas, cpu, choice, check);
  if (check && !check->ok) {
    spdlog::error("blas: {} {}'s sgemm fails its check: error {}x the float bound", blas.library,
                  blas.core, check->worst_ratio);
  }
  if (info.fallback()) {
    spdlog::warn(
        "blas: {} runs {}, a kernel narrower than this CPU's vectors ({}): GEMMs run "
        "slower than they could ({})",
        blas.library, blas.core, cpu.model_name,
        CoreIsaLevel(blas.core) <= 1 ? "about 3x for SSE against AVX-512, measured"
                                     : "AVX2 against AVX-512");
  }
  return info;
}

}  // namespace joule::worker
