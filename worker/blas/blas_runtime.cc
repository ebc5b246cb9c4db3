#include "worker/blas/blas_runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace joule::worker {

namespace {

template <typename Fn>
Fn Symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// SplitMix64 (Steele, Lea, Flood, OOPSLA 2014) to a float in [-1, 1].
float NextValue(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

}  // namespace

BlasRuntime DetectBlasRuntime() {
  BlasRuntime r;
  r.library = "unknown";
  if (SgemmFn sgemm = FindSgemm()) {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(sgemm), &info) != 0 && info.dli_fname != nullptr) {
      r.path = info.dli_fname;
    }
  }
  if (auto corename = Symbol<char* (*)()>("openblas_get_corename")) {
    r.library = "OpenBLAS";
    if (const char* core = corename()) r.core = core;
    if (auto config = Symbol<char* (*)()>("openblas_get_config")) {
      if (const char* c = config()) r.config = c;
    }
    if (auto threads = Symbol<int (*)()>("openblas_get_num_threads")) r.threads = threads();
    return r;
  }
  if (auto version = Symbol<const char* (*)()>("bli_info_get_version_str")) {
    r.library = "BLIS";
    if (const char* v = version()) r.config = absl::StrCat("BLIS ", v);
    auto arch_id = Symbol<int (*)()>("bli_arch_query_id");
    auto arch_name = Symbol<const char* (*)(int)>("bli_arch_string");
    if (arch_id && arch_name) {
      if (const char* a = arch_name(arch_id())) r.core = a;
    }
    if (auto threads = Symbol<int64_t (*)()>("bli_thread_get_num_threads")) {
      r.threads = static_cast<int>(threads());
    }
    return r;
  }
  if (Symbol<void*>("mkl_get_max_threads") != nullptr) r.library = "MKL";
  // Libraries whose libblas.so.3 exports the BLAS alone: named by where Debian puts them.
  if (r.library == "unknown" && absl::StrContains(r.path, "/blis")) r.library = "BLIS";
  if (r.library == "unknown" && absl::StrContains(r.path, "/blas/libblas.so")) {
    r.library = "reference BLAS";
  }
  return r;
}

SgemmFn FindSgemm() { return Symbol<SgemmFn>("sgemm_"); }

absl::StatusOr<GemmCheck> CheckSgemm(SgemmFn sgemm, int m, int k, int n) {
  if (sgemm == nullptr) return absl::FailedPreconditionError("no sgemm_ is loaded");
  constexpr double kUnitRoundoff = 0x1p-24;  // float: 2^-24
  if (m <= 0 || k <= 0 || n <= 0 || k * kUnitRoundoff >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", m, "x", k, " by ", k, "x", n, " product cannot be checked"));
  }
  const double gamma = k * kUnitRoundoff / (1 - k * kUnitRoundoff);
  // Column-major: A is m x k (lda m), B is k x n (ldb k), C is m x n (ldc m).
  std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
  std::vector<float> c(static_cast<size_t>(m) * n, std::numeric_limits<float>::quiet_NaN());
  uint64_t state = 0x6a6f756c65ull;  // "joule"
  for (float& v : a) v = NextValue(state);
  for (float& v : b) v = NextValue(state);
  const float alpha = 1, beta = 0;
  GemmCheck check;
  check.m = m;
  check.k = k;
  check.n = n;
  check.microseconds = std::numeric_limits<double>::infinity();
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    sgemm("N", "N", &m, &n, &k, &alpha, a.data(), &m, b.data(), &k, &beta, c.data(), &m);
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - t0;
    check.microseconds = std::min(check.microseconds, took.count());
  }
  check.ok = true;
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double exact = 0, magnitude = 0;
      for (int p = 0; p < k; ++p) {
        const double x = a[static_cast<size_t>(p) * m + i], y = b[static_cast<size_t>(j) * k + p];
        exact += x * y;
        magnitude += std::abs(x * y);
      }
      const double got = c[static_cast<size_t>(j) * m + i];
      const double error = std::abs(got - exact);
      const double ratio = error / (gamma * magnitude + std::numeric_limits<double>::min());
      if (!std::isfinite(got) || !(ratio <= 1)) check.ok = false;
      check.max_abs_error = std::max(check.max_abs_error, std::isfinite(error) ? error : HUGE_VAL);
      check.worst_ratio = std::max(check.worst_ratio, std::isfinite(ratio) ? ratio : HUGE_VAL);
    }
  }
  return check;
}

}  // namespace joule::worker
