// Collective microbenchmark in the style of nccl-tests: allreduce (sum, float32) of
// 8 B .. 256 MiB on N ranks, printing the time per operation, the algorithm bandwidth
// (algbw = bytes / time) and the bus bandwidth (busbw = algbw x 2(n-1)/n, the traffic a
// ring allreduce puts on each link; see nccl-tests' PERFORMANCE.md). Ranks are threads of
// this process; rendezvous goes through an in-process copy of the coordinator's KV.
// Transports: Joule's Gloo process group over TCP on loopback, and its shared-memory
// group (the default for a gang on one host); in builds with CUDA and NCCL, NCCL on device
// buffers, rank r on GPU r (ranks = min(--ranks, visible GPUs)).
//
// usage: joule-bench-collectives [--transport gloo|shm|nccl|both|all] [--registered] [--ranks 2]
//                                [--max-bytes 268435456] [--seconds 0.5]
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "server/rendezvous_kv.h"
#include "worker/comm/connect.h"
#ifdef JOULE_WITH_NCCL
#include <cuda_runtime_api.h>

#include "worker/comm/nccl_process_group.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

class Kv final : public joule::worker::KvClient {
 public:
  explicit Kv(joule::server::RendezvousKv& kv) : kv_(kv) {}
  absl::Status Set(const std::string& k, const std::string& v) override {
    return kv_.Set("bench", k, v);
  }
  absl::StatusOr<std::string> Get(const std::string& k, std::chrono::milliseconds t) override {
    return kv_.Get("bench", k, t);
  }
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    return kv_.Wait("bench", keys, t);
  }

 private:
  joule::server::RendezvousKv& kv_;
};

}  // namespace

// --registered: buffers come from ProcessGroup::NewBuffer.
bool g_registered = false;

// One table: allreduce of 8 B .. max_bytes over `ranks` ranks of `transport`.
int Run(joule::worker::Transport transport, int ranks, size_t max_bytes, double seconds);

int main(int argc, char** argv) {
  CLI::App app{"allreduce microbenchmark (Gloo over loopback, shared memory, NCCL)"};
  int ranks = 2;
  size_t max_bytes = size_t{256} << 20;
  double seconds = 0.5;
  app.add_option("--ranks", ranks, "ranks (threads of this process; NCCL: at most one per GPU)")
      ->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "largest message; sizes double from 8 bytes")
      ->capture_default_str();
  app.add_option("--seconds", seconds, "time spent per size (at least 2 iterations)")
      ->capture_default_str();
  std::string transport = "both";
  app.add_option("--transport", transport,
                 "gloo, shm, nccl, both (gloo and shm) or all (nccl too, when a GPU is present)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gloo", "shm", "nccl", "both", "all"}));
  bool registered = false;
  app.add_flag("--registered", registered,
               "reduce buffers from ProcessGroup::NewBuffer (shared memory: registered in the "
               "segment, no copies, as gradient buckets are) instead of buffers the caller owns");
  CLI11_PARSE(app, argc, argv);
  g_registered = registered;
  for (const std::string t : {"gloo", "shm", "nccl"}) {
    const bool wanted = transport == t || transport == "all" ||
                        (transport == "both" && t != "nccl");
    if (!wanted) continue;
    joule::worker::Transport kind = t == "shm"    ? joule::worker::Transport::kShm
                                    : t == "nccl" ? joule::worker::Transport::kNccl
                                                  : joule::worker::Transport::kGloo;
    int n = ranks;
    if (kind == joule::worker::Transport::kNccl) {
#ifdef JOULE_WITH_NCCL
      int devices = 0;
      if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("# nccl: no CUDA device, skipped\n");
        continue;
      }
      n = std::min(ranks, devices);
#else
      std::printf("# nccl: this build has no CUDA/NCCL, skipped\n");
      continue;
#endif
    }
    if (int rc = Run(kind, n, max_bytes, seconds); rc != 0) return rc;
  }
  return 0;
}

int Run(joule::worker::Transport transport, int ranks, size_t max_bytes, double seconds) {

  joule::server::RendezvousKv kv;
  kv.OpenScope("bench");  // a fresh store per transport
  std::vector<std::unique_ptr<joule::worker::ProcessGroup>> groups(ranks);
  {
    std::vector<std::thread> t;
    for (int r = 0; r < ranks; ++r) {
      t.emplace_back([&, r] {
        Kv client(kv);
        joule::worker::ConnectOptions o;
        o.transport = transport;
        o.cuda_device = r;
        o.gloo.timeout = std::chrono::seconds(120);
        auto pg = joule::worker::ConnectProcessGroup(r, ranks, client, o);
        if (!pg.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", r, pg.status().ToString().c_str());
          std::exit(1);
        }
        groups[r] = *std::move(pg);
      });
    }
    for (auto& th : t) th.join();
  }
  std::printf("# allreduce, float32 sum, %d ranks (threads), %s%s\n", ranks,
              transport == joule::worker::Transport::kShm    ? "shared memory"
              : transport == joule::worker::Transport::kNccl ? "NCCL, device buffers"
                                                             : "Gloo over loopback TCP",
              g_registered && transport != joule::worker::Transport::kNccl
                  ? ", buffers from NewBuffer"
                  : "");
  std::printf("%12s %8s %12s %12s %12s\n", "bytes", "iters", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)");
  for (size_t bytes = 8; bytes <= max_bytes; bytes *= 2) {
    const size_t n = bytes / sizeof(float);
    // Rank 0 decides the iteration count from a warm-up and tells the others.
    std::vector<std::vector<float>> bufs(ranks, std::vector<float>(n, 1.0f));
    // NewBuffer is collective: every rank calls it at once.
    std::vector<joule::worker::SharedBuffer> shared(ranks);
    if (g_registered && transport != joule::worker::Transport::kNccl) {
      std::vector<std::thread> t;
      for (int r = 0; r < ranks; ++r) {
        t.emplace_back([&, r] {
          shared[r] = groups[r]->NewBuffer(n);
          std::fill(shared[r]->begin(), shared[r]->end(), 1.0f);
        });
      }
      for (auto& th : t) th.join();
    }
    std::vector<void*> device_bufs(ranks, nullptr);
#ifdef JOULE_WITH_NCCL
    if (transport == joule::worker::Transport::kNccl) {
      for (int r = 0; r < ranks; ++r) {
        cudaSetDevice(r);
        if (cudaMalloc(&device_bufs[r], std::max<size_t>(bytes, 4)) != cudaSuccess) {
          std::fprintf(stderr, "cudaMalloc(%zu) failed on GPU %d\n", bytes, r);
          return 1;
        }
        cudaMemset(device_bufs[r], 0, bytes);
      }
    }
#endif
    auto run = [&](int iters) {
      std::vector<std::thread> t;
      for (int r = 0; r < ranks; ++r) {
        t.emplace_back([&, r] {
          for (int i = 0; i < iters; ++i) {
            absl::Status s;
#ifdef JOULE_WITH_NCCL
            if (device_bufs[r] != nullptr) {
              cudaSetDevice(r);
              s = static_cast<joule::worker::NcclProcessGroup*>(groups[r].get())
                      ->AllreduceDevice(device_bufs[r], n, joule::worker::DataType::kFloat32,
                                        joule::worker::ReduceOp::kSum);
            } else
#endif
            if (shared[r] != nullptr) {
              s = groups[r]->AllreduceAsync(shared[r], joule::worker::ReduceOp::kSum)->Wait();
            } else {
              s = groups[r]->AllreduceSum(bufs[r]);
            }
            if (!s.ok()) {
              std::fprintf(stderr, "%s\n", s.ToString().c_str());
              std::exit(1);
            }
          }
        });
      }
      for (auto& th : t) th.join();
    };
    run(1);  // warm-up
    // Calibrate: double the batch until it takes a tenth of the budget, so thread start-up
    // does not dominate the estimate.
    int k = 2;
    double per = 0;
    for (;;) {
      const auto c0 = Clock::now();
      run(k);
      const double took = std::chrono::duration<double>(Clock::now() - c0).count();
      per = took / k;
      if (took >= seconds / 10 || k >= (1 << 20)) break;
      k *= 2;
    }
    const int iters = std::max(2, static_cast<int>(seconds / std::max(per, 1e-7)));
    auto t0 = Clock::now();
    run(iters);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    const double algbw = bytes / t / 1e9;
    const double busbw = algbw * 2.0 * (ranks - 1) / ranks;
    std::printf("%12zu %8d %12.1f %12.3f %12.3f\n", bytes, iters, t * 1e6, algbw, busbw);
#ifdef JOULE_WITH_NCCL
    for (void* p : device_bufs) {
      if (p != nullptr) cudaFree(p);
    }
#endif
  }
  return 0;
}
