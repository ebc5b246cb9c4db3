// Collective microbenchmark in the style of nccl-tests: allreduce (sum, float32) of
// 8 B .. 256 MiB on N ranks, printing the time per operation, the algorithm bandwidth
// (algbw = bytes / time) and the bus bandwidth (busbw = algbw x 2(n-1)/n, the traffic a
// ring allreduce puts on each link; see nccl-tests' PERFORMANCE.md). Ranks are threads of
// this process; rendezvous goes through an in-process copy of the coordinator's KV.
// Transports: Joule's Gloo process group over TCP on loopback, and its shared-memory
// group (the default for a gang on one host); in builds with CUDA and NCCL, NCCL on device
// buffers, rank r on GPU r (ranks = min(--ranks, visible GPUs)).
//
// Across hosts (bench/multihost.sh): --rank R --world N --rendezvous-dir DIR runs rank R
// alone in this process, Gloo on --gloo-host, rendezvous through files in DIR (a directory
// every rank sees); rank 0 prints the table, with the share of --link-gbit that busbw
// reaches when it is given. --fp16 puts half precision on the wire (fp16 compression: the
// bytes column stays the float32 size the caller reduces, so a 2x faster column is the
// compression paying off).
//
// usage: joule-bench-collectives [--transport gloo|shm|nccl|both|all] [--registered] [--ranks 2]
//                                [--max-bytes 268435456] [--seconds 0.5] [--fp16]
//        joule-bench-collectives --rank R --world N --rendezvous-dir DIR --gloo-host ADDR
//                                [--link-gbit G] [--max-bytes ...] [--seconds ...] [--fp16]
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
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

// A rendezvous store in a directory every rank sees (the test hosts share the filesystem):
// a key is a file, written whole then renamed into place; Get polls for it.
class DirKv final : public joule::worker::KvClient {
 public:
  explicit DirKv(std::filesystem::path dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& k, const std::string& v) override {
    const std::filesystem::path tmp = Path(k).string() + ".tmp." + std::to_string(getpid());
    std::ofstream out(tmp, std::ios::binary);
    out << v;
    out.close();
    if (!out) return absl::InternalError("rendezvous: cannot write " + tmp.string());
    std::error_code ec;
    std::filesystem::rename(tmp, Path(k), ec);
    return ec ? absl::InternalError("rendezvous: " + ec.message()) : absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& k, std::chrono::milliseconds t) override {
    const auto deadline = Clock::now() + t;
    while (true) {
      std::ifstream in(Path(k), std::ios::binary);
      if (in) {
        std::ostringstream v;
        v << in.rdbuf();
        return v.str();
      }
      if (Clock::now() > deadline) return absl::DeadlineExceededError("rendezvous key " + k);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    for (const std::string& k : keys) {
      if (auto v = Get(k, t); !v.ok()) return v.status();
    }
    return absl::OkStatus();
  }

 private:
  // Keys name files: every byte but [A-Za-z0-9_.-] as %XX.
  std::filesystem::path Path(const std::string& k) const {
    std::string name;
    for (unsigned char c : k) {
      if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
        name += static_cast<char>(c);
      } else {
        char hex[4];
        std::snprintf(hex, sizeof(hex), "%%%02X", c);
        name += hex;
      }
    }
    return dir_ / name;
  }
  std::filesystem::path dir_;
};

}  // namespace

// --registered: buffers come from ProcessGroup::NewBuffer.
bool g_registered = false;
// --fp16: half precision on the wire.
joule::worker::Precision g_wire = joule::worker::Precision::kFloat32;

// Rank `rank` of `world`, alone in this process (the --rank mode).
int RunRank(int rank, int world, const std::string& dir, const std::string& gloo_host,
            size_t max_bytes, double seconds, double link_gbit);

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
  bool fp16 = false;
  app.add_flag("--fp16", fp16, "half precision on the wire (fp16 compression)");
  int rank = -1;
  int world = 2;
  std::string dir;
  std::string gloo_host = "127.0.0.1";
  double link_gbit = 0;
  app.add_option("--rank", rank, "run this rank alone in this process (Gloo; needs --rendezvous-dir)");
  app.add_option("--world", world, "ranks in all, with --rank")->capture_default_str();
  app.add_option("--rendezvous-dir", dir, "with --rank: a directory every rank sees, for rendezvous");
  app.add_option("--gloo-host", gloo_host, "with --rank: address this rank's Gloo listens on")
      ->capture_default_str();
  app.add_option("--link-gbit", link_gbit, "with --rank: the link's rate, for a % of link column");
  CLI11_PARSE(app, argc, argv);
  g_registered = registered;
  if (fp16) g_wire = joule::worker::Precision::kFloat16;
  if (rank >= 0) {
    if (dir.empty() || world < 2 || rank >= world) {
      std::fprintf(stderr, "--rank needs --rendezvous-dir and 0 <= rank < --world (>= 2)\n");
      return 2;
    }
    return RunRank(rank, world, dir, gloo_host, max_bytes, seconds, link_gbit);
  }
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
  std::printf("# allreduce, float32 sum%s, %d ranks (threads), %s%s\n",
              g_wire == joule::worker::Precision::kFloat16 ? " (fp16 on the wire)" : "", ranks,
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
              s = groups[r]->AllreduceAsync(shared[r], joule::worker::ReduceOp::kSum, g_wire)->Wait();
            } else if (g_wire == joule::worker::Precision::kFloat16) {
              auto copy = std::make_shared<joule::worker::Buffer>(bufs[r].begin(), bufs[r].end());
              s = groups[r]->AllreduceAsync(copy, joule::worker::ReduceOp::kSum, g_wire)->Wait();
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

int RunRank(int rank, int world, const std::string& dir, const std::string& gloo_host,
            size_t max_bytes, double seconds, double link_gbit) {
  DirKv kv(dir);
  joule::worker::ConnectOptions o;
  o.transport = joule::worker::Transport::kGloo;
  o.gloo.hostname = gloo_host;
  o.gloo.timeout = std::chrono::seconds(120);
  auto pg_or = joule::worker::ConnectProcessGroup(rank, world, kv, o);
  if (!pg_or.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, pg_or.status().ToString().c_str());
    return 1;
  }
  joule::worker::ProcessGroup& pg = **pg_or;
  auto check = [&](const absl::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      std::exit(1);
    }
  };
  if (rank == 0) {
    std::printf("# allreduce, float32 sum%s, %d ranks (processes), Gloo from %s\n",
                g_wire == joule::worker::Precision::kFloat16 ? " (fp16 on the wire)" : "", world,
                gloo_host.c_str());
    std::printf("%12s %8s %12s %12s %12s%s\n", "bytes", "iters", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", link_gbit > 0 ? "   busbw/link" : "");
  }
  for (size_t bytes = 8; bytes <= max_bytes; bytes *= 2) {
    auto data = std::make_shared<joule::worker::Buffer>(bytes / sizeof(float), 1.0f);
    auto run = [&](int iters) {
      for (int i = 0; i < iters; ++i) {
        check(pg.AllreduceAsync(data, joule::worker::ReduceOp::kSum, g_wire)->Wait());
      }
    };
    run(1);  // warm-up
    // Rank 0 decides, and tells the others: double the batch until it takes a tenth of
    // the budget, then run for the budget.
    std::vector<float> decision(1);
    int k = 2;
    double per = 0;
    for (;;) {
      check(pg.Barrier());
      const auto c0 = Clock::now();
      run(k);
      const double took = std::chrono::duration<double>(Clock::now() - c0).count();
      per = took / k;
      decision[0] = took >= seconds / 10 || k >= (1 << 20) ? 1.0f : 0.0f;
      check(pg.Broadcast(decision, 0));
      if (decision[0] == 1.0f) break;
      k *= 2;
    }
    decision[0] = static_cast<float>(std::max(2, static_cast<int>(seconds / std::max(per, 1e-7))));
    check(pg.Broadcast(decision, 0));
    const int iters = static_cast<int>(decision[0]);
    check(pg.Barrier());
    const auto t0 = Clock::now();
    run(iters);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    if (rank == 0) {
      const double algbw = bytes / t / 1e9;
      const double busbw = algbw * 2.0 * (world - 1) / world;
      std::printf("%12zu %8d %12.1f %12.3f %12.3f", bytes, iters, t * 1e6, algbw, busbw);
      if (link_gbit > 0) std::printf("   %9.0f%%", 100.0 * busbw * 8 / link_gbit);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
