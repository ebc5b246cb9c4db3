#ifndef JOULE_WORKER_BLAS_BLAS_RUNTIME_H_
#define JOULE_WORKER_BLAS_BLAS_RUNTIME_H_

#include <string>

#include "absl/status/statusor.h"

namespace joule::worker {

// The BLAS this process calls (LibTorch's CPU GEMMs go to the `sgemm_` of libblas.so.3,
// which Debian's alternatives system points at OpenBLAS, BLIS or the reference BLAS), as
// it reports itself. Found by symbol (dlsym on the loaded objects): no library is loaded.
struct BlasRuntime {
  std::string library;  // "OpenBLAS", "BLIS", "MKL", "reference BLAS" or "unknown"
  std::string config;   // openblas_get_config(), e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  std::string core;     // the kernel set it runs: openblas_get_corename() ("Haswell");
                        // BLIS's architecture; "" unknown
  std::string path;     // the file that defines sgemm_ (dladdr), "" when none is loaded
  int threads = 0;      // the library's own thread count; 0 unknown
};
// Thread-safe; cheap (a few dlsym calls).
BlasRuntime DetectBlasRuntime();

// Fortran BLAS sgemm (column-major): C = alpha op(A) op(B) + beta C.
using SgemmFn = void (*)(const char* transa, const char* transb, const int* m, const int* n,
                         const int* k, const float* alpha, const float* a, const int* lda,
                         const float* b, const int* ldb, const float* beta, float* c,
                         const int* ldc);
// The loaded `sgemm_`, or nullptr.
SgemmFn FindSgemm();

struct GemmCheck {
  int m = 0, k = 0, n = 0;  // the product checked
  bool ok = false;
  double max_abs_error = 0;  // against the double-precision product
  double worst_ratio = 0;    // max over elements of |error| / bound (ok: <= 1)
  double microseconds = 0;   // one call of `sgemm`, the fastest of three
  // 2 m k n floating-point operations per call over `microseconds`; 0 if not timed.
  double gflops() const { return microseconds > 0 ? 2.0 * m * k * n / (microseconds * 1e3) : 0; }
};

// Checks `sgemm` on an m x k by k x n product (default: the mlp's first layer at a batch
// of 64) of fixed pseudo-random values in [-1, 1] against the same product in double
// precision: every element must lie within the forward error bound of an inner product in
// floating point, |C - AB| <= gamma_k |A||B| with gamma_k = k u / (1 - k u) and
// u = 2^-24 for float (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.,
// 2002, sec. 3.5, eq. 3.13); blocked and FMA kernels meet it too. A NaN fails. Errors:
// InvalidArgument for non-positive sizes or k u >= 1; FailedPrecondition for a null sgemm.
absl::StatusOr<GemmCheck> CheckSgemm(SgemmFn sgemm, int m = 64, int k = 784, int n = 512);

}  // namespace joule::worker

#endif  // JOULE_WORKER_BLAS_BLAS_RUNTIME_H_
