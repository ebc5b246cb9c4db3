// The worker's BLAS: the CPU's features against the kernel's, the choice of an OpenBLAS
// kernel, and the sgemm check that guards a switch. The BLAS is the one LibTorch loads
// here (this test links LibTorch, so libblas.so.3 is in the process).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "worker/blas/blas_runtime.h"
#include "worker/blas/cpu_features.h"
#include "worker/blas/kernel_choice.h"

namespace joule::worker {
namespace {

// The flags of /proc/cpuinfo's first "flags" line: the kernel's own reading of cpuid (and
// of what the OS enabled).
std::set<std::string> KernelCpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      const std::string flags = line.substr(line.find(':') + 1);
      std::set<std::string> out;
      for (absl::string_view f : absl::StrSplit(flags, ' ', absl::SkipEmpty())) out.emplace(f);
      return out;
    }
  }
  return {};
}

TEST(CpuFeaturesTest, CpuidAgreesWithTheKernelsFlags) {
  const std::set<std::string> kernel = KernelCpuFlags();
  if (kernel.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo (not x86?)";
  const CpuFeatures cpu = DetectCpuFeatures();
  EXPECT_FALSE(cpu.vendor.empty());
  EXPECT_GT(cpu.family, 0);
  // Every flag we read, the kernel shows under the same name, and the reverse.
  for (const char* name : {"fma", "avx", "avx2", "avx512f", "avx512dq", "avx512cd", "avx512bw",
                           "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"}) {
    const std::vector<std::string> ours = cpu.Names();
    const bool we_see = std::find(ours.begin(), ours.end(), name) != ours.end();
    EXPECT_EQ(we_see, kernel.count(name) == 1) << name;
  }
  const int level = cpu.IsaLevel();
  EXPECT_EQ(level >= 2, kernel.count("avx2") && kernel.count("fma"));
  EXPECT_EQ(level == 3, kernel.count("avx512f") && kernel.count("avx512bw") &&
                            kernel.count("avx512vl") && kernel.count("avx512dq") &&
                            kernel.count("avx512cd"));
}

CpuFeatures Cpu(const char* vendor, int level) {
  CpuFeatures c;
  c.vendor = vendor;
  c.model_name = "test CPU";
  c.avx = level >= 1;
  c.avx2 = c.fma = level >= 2;
  c.avx512f = c.avx512dq = c.avx512cd = c.avx512bw = c.avx512vl = level >= 3;
  return c;
}

TEST(KernelChoiceTest, AutoReplacesOnlyANarrowerKernelAndTheUserAlwaysWins) {
  struct Case {
    const char* mode;
    const char* current;
    CpuFeatures cpu;
    const char* user;
    const char* want;  // the core switched to; "" = kept
  };
  const Case cases[] = {
      // The host: Debian 12's OpenBLAS takes Prescott on a Sapphire Rapids.
      {"auto", "Prescott", Cpu("GenuineIntel", 3), "", "SKYLAKEX"},
      {"auto", "Prescott", Cpu("GenuineIntel", 2), "", "HASWELL"},
      {"auto", "Nehalem", Cpu("AuthenticAMD", 2), "", "ZEN"},
      {"auto", "Core2", Cpu("GenuineIntel", 1), "", "SANDYBRIDGE"},
      {"auto", "Sandybridge", Cpu("GenuineIntel", 3), "", "SKYLAKEX"},
      // As wide as the CPU allows, or wider (a CPU flag the OS disabled): kept.
      {"auto", "Cooperlake", Cpu("AuthenticAMD", 3), "", ""},
      {"auto", "Haswell", Cpu("GenuineIntel", 2), "", ""},
      {"auto", "SkylakeX", Cpu("GenuineIntel", 2), "", ""},
      {"auto", "Prescott", Cpu("GenuineIntel", 0), "", ""},
      // A core name this table does not know: kept.
      {"auto", "NeoverseN1", Cpu("GenuineIntel", 3), "", ""},
      // A name the CPU cannot run (OpenBLAS would SIGILL) or that is unknown: refused.
      {"SKYLAKEX", "Haswell", Cpu("GenuineIntel", 2), "", ""},
      {"NOSUCHCORE", "Haswell", Cpu("GenuineIntel", 3), "", ""},
      {"KEEP", "Prescott", Cpu("GenuineIntel", 3), "", ""},
      {"Auto", "Prescott", Cpu("HygonGenuine", 2), "", "ZEN"},
      // The user's OPENBLAS_CORETYPE, and keep, always win.
      {"auto", "Prescott", Cpu("GenuineIntel", 3), "Prescott", ""},
      {"HASWELL", "Cooperlake", Cpu("AuthenticAMD", 3), "Cooperlake", ""},
      {"keep", "Prescott", Cpu("GenuineIntel", 3), "", ""},
      // A name: switched to unless already there (any case).
      {"haswell", "Cooperlake", Cpu("AuthenticAMD", 3), "", "HASWELL"},
      {"cooperlake", "Cooperlake", Cpu("AuthenticAMD", 3), "", ""},
      // Not OpenBLAS: nothing to choose.
      {"auto", "", Cpu("GenuineIntel", 3), "", ""},
      {"HASWELL", "", Cpu("GenuineIntel", 3), "", ""},
  };
  for (const Case& c : cases) {
    const KernelDecision d = ChooseKernel(c.mode, c.current, c.cpu, c.user);
    const std::string what = std::string(c.mode) + " on " + c.current;
    EXPECT_EQ(d.switch_core, std::string(c.want) != "") << what << ": " << d.reason;
    EXPECT_EQ(d.core, c.want) << what;
    EXPECT_FALSE(d.reason.empty()) << what;
  }
  EXPECT_EQ(CoreIsaLevel("PRESCOTT"), 0);
  EXPECT_EQ(CoreIsaLevel("skylakex"), 3);
  EXPECT_EQ(CoreIsaLevel("Zen"), 2);
  EXPECT_EQ(CoreIsaLevel("NoSuchCore"), -1);
}

TEST(BlasRuntimeTest, TheLoadedBlasIsNamedWithItsKernelAndPasses) {
  const BlasRuntime blas = DetectBlasRuntime();
  ASSERT_NE(FindSgemm(), nullptr) << "LibTorch's BLAS should be loaded";
  EXPECT_FALSE(blas.path.empty());
  if (blas.library == "OpenBLAS") {
    EXPECT_NE(blas.config.find("OpenBLAS"), std::string::npos) << blas.config;
    if (!DetectCpuFeatures().vendor.empty()) {
      EXPECT_GE(CoreIsaLevel(blas.core), 0) << blas.core << ": every x86 core is ranked";
    }
    EXPECT_FALSE(blas.core.empty());
    EXPECT_GT(blas.threads, 0);
  }
  absl::StatusOr<GemmCheck> check = CheckSgemm(FindSgemm());
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_TRUE(check->ok) << "worst " << check->worst_ratio << "x the bound";
  EXPECT_GT(check->microseconds, 0);
  EXPECT_GT(check->max_abs_error, 0) << "float rounding leaves some error";
  EXPECT_LE(check->worst_ratio, 1);
}

// A kernel that computes wrong (one element off by a little more than rounding allows, or
// NaN) fails the check; a right one written here in double and rounded passes it.
void ReferenceSgemm(const char*, const char*, const int* m, const int* n, const int* k,
                    const float* alpha, const float* a, const int* lda, const float* b,
                    const int* ldb, const float* beta, float* c, const int* ldc) {
  for (int j = 0; j < *n; ++j) {
    for (int i = 0; i < *m; ++i) {
      double sum = 0;
      for (int p = 0; p < *k; ++p) sum += static_cast<double>(a[p * *lda + i]) * b[j * *ldb + p];
      c[j * *ldc + i] = static_cast<float>(*alpha * sum);  // beta = 0 in the check
    }
  }
}
float g_perturbation = 0;
void PerturbedSgemm(const char* ta, const char* tb, const int* m, const int* n, const int* k,
                    const float* alpha, const float* a, const int* lda, const float* b,
                    const int* ldb, const float* beta, float* c, const int* ldc) {
  ReferenceSgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  c[*ldc * (*n / 2) + *m / 3] += g_perturbation;
}

TEST(BlasRuntimeTest, TheSgemmCheckFailsAWrongKernelAndPassesARightOne) {
  absl::StatusOr<GemmCheck> right = CheckSgemm(&ReferenceSgemm, 8, 100, 6);
  ASSERT_TRUE(right.ok());
  EXPECT_TRUE(right->ok) << right->worst_ratio;
  EXPECT_LT(right->worst_ratio, 0.01) << "a double sum rounded once is far inside the bound";
  for (float off : {1e-2f, -0.5f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    g_perturbation = off;
    absl::StatusOr<GemmCheck> wrong = CheckSgemm(&PerturbedSgemm, 8, 100, 6);
    ASSERT_TRUE(wrong.ok());
    EXPECT_FALSE(wrong->ok) << off;
    EXPECT_GT(wrong->worst_ratio, 1) << off;
  }
  EXPECT_EQ(CheckSgemm(nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckSgemm(&ReferenceSgemm, 0, 10, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckSgemm(&ReferenceSgemm, 2, 1 << 25, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // k u >= 1: no bound
}

}  // namespace
}  // namespace joule::worker
