// joule-bench-blas: single-precision GEMM throughput of the BLAS that `libblas.so.3`
// resolves to (LD_LIBRARY_PATH picks a library, OPENBLAS_CORETYPE an OpenBLAS kernel) on
// the GEMM shapes of the reference models at bench/compare.sh's local batch of 64, for
// bench/blas.sh to set libraries and kernels side by side.
//
//   joule-bench-blas [--threads T] [--seconds S]
//
// Prints one JSON line per shape: {"library", "core", "shape", "m", "k", "n", "gflops",
// "flops_per_cycle", "check_ok"}; flops_per_cycle divides by the clock /proc/cpuinfo
// reports (a VM's nominal one), so that a kernel's width shows: AVX-512 FMA peaks at 32 fp32
// flops per cycle per FMA unit, AVX2 at 16, SSE at 8 (mul + add on 4 lanes).
#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "worker/blas/blas_runtime.h"

namespace {

struct Shape {
  const char* name;
  int m, k, n;  // an m x k by k x n product
};

// The reference models' products at a local batch of 64 (worker/models/models.cc): mlp
// 784-512-256-10, cnn conv 3x3 x32, conv 3x3 x64 (as im2col products), fc 9216-128.
constexpr Shape kShapes[] = {
    {"logreg forward", 64, 784, 10},           {"mlp layer 1 forward", 64, 784, 512},
    {"mlp layer 1 weight grad", 784, 64, 512}, {"mlp layer 2 forward", 64, 512, 256},
    {"cnn conv1 im2col", 32, 9, 43264},        {"cnn conv2 im2col", 64, 288, 36864},
    {"cnn fc1 forward", 64, 9216, 128},
};

double CpuMhz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) return std::stod(line.substr(line.find(':') + 1));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"joule-bench-blas: sgemm GFLOP/s of libblas.so.3 on the models' shapes"};
  int threads = 1;
  double seconds = 0.3;
  app.add_option("--threads", threads, "BLAS threads (OpenBLAS and BLIS)")->capture_default_str();
  app.add_option("--seconds", seconds, "time per shape")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // Loaded here, globally, so that the library's own symbols answer dlsym(RTLD_DEFAULT).
  if (dlopen("libblas.so.3", RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::cerr << "joule-bench-blas: cannot load libblas.so.3: " << dlerror() << "\n";
    return 1;
  }
  if (auto set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
  if (auto set =
          reinterpret_cast<void (*)(long)>(dlsym(RTLD_DEFAULT, "bli_thread_set_num_threads"))) {
    set(threads);
  }
  const joule::worker::BlasRuntime blas = joule::worker::DetectBlasRuntime();
  joule::worker::SgemmFn sgemm = joule::worker::FindSgemm();
  const double mhz = CpuMhz();
  for (const Shape& s : kShapes) {
    absl::StatusOr<joule::worker::GemmCheck> check =
        joule::worker::CheckSgemm(sgemm, s.m, s.k, s.n);
    if (!check.ok()) {
      std::cerr << "joule-bench-blas: " << check.status() << "\n";
      return 1;
    }
    std::vector<float> a(static_cast<size_t>(s.m) * s.k, 0.5f),
        b(static_cast<size_t>(s.k) * s.n, 0.25f), c(static_cast<size_t>(s.m) * s.n);
    const float alpha = 1, beta = 0;
    int64_t calls = 0;
    const auto t0 = std::chrono::steady_clock::now();
    std::chrono::duration<double> took{};
    do {
      sgemm("N", "N", &s.m, &s.n, &s.k, &alpha, a.data(), &s.m, b.data(), &s.k, &beta, c.data(),
            &s.m);
      ++calls;
      took = std::chrono::steady_clock::now() - t0;
    } while (took.count() < seconds);
    const double gflops = 2.0 * s.m * s.k * s.n * static_cast<double>(calls) / took.count() / 1e9;
    std::printf(
        "{\"library\": \"%s\", \"core\": \"%s\", \"threads\": %d, \"shape\": \"%s\", \"m\": %d, "
        "\"k\": %d, \"n\": %d, \"gflops\": %.2f, \"flops_per_cycle\": %.2f, \"check_ok\": %s}\n",
        blas.library.c_str(), blas.core.c_str(), threads, s.name, s.m, s.k, s.n, gflops,
        mhz > 0 ? gflops * 1e3 / mhz / threads : 0.0, check->ok ? "true" : "false");
  }
  return 0;
}
