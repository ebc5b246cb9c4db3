// Coordinator under load, on loopback: durable submissions per second with their p50/p99
// latency, list latency over the stored jobs, and the coordinator's CPU while 1,000
// simulated workers send heartbeats at 1 Hz. Starts its own joule-coordinator processes.
//
// usage: joule-bench-coordinator-load [--jobs 20000] [--clients 32] [--workers 1000]
//                                     [--seconds 10] [--store URI] [--no-heartbeats]
// bench/store.sh runs the submit and list measurements on SQLite and PostgreSQL side by side.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "joule/v1/job.grpc.pb.h"
#include "joule/v1/worker.grpc.pb.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Coordinator {
  pid_t pid = -1;
  std::string address;
};

// `store`: the coordinator's --store ("": a SQLite file in `dir`).
Coordinator StartCoordinator(const fs::path& dir, const std::string& store = "") {
  fs::create_directories(dir);
  const std::string bin = fs::read_symlink("/proc/self/exe").parent_path() / "joule-coordinator";
  Coordinator c;
  c.pid = fork();
  if (c.pid == 0) {
    freopen((dir / "coordinator.log").c_str(), "w", stderr);
    const std::string where = store.empty() ? "sqlite:" + (dir / "jobs.db").string() : store;
    execl(bin.c_str(), bin.c_str(), "--listen", "127.0.0.1:0", "--insecure", "--store",
          where.c_str(), "--address-file", (dir / "addr").c_str(),
          "--max-active-jobs-per-client", "100000000", "--log-level", "warn", nullptr);
    _exit(127);
  }
  for (int i = 0; i < 400 && c.address.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    std::ifstream(dir / "addr") >> c.address;
  }
  if (c.address.empty()) {
    std::cerr << "coordinator did not start; see " << dir << "\n";
    std::exit(1);
  }
  return c;
}

void Stop(Coordinator& c) {
  kill(c.pid, SIGTERM);
  waitpid(c.pid, nullptr, 0);
}

// utime + stime of `pid`, seconds (proc(5): fields 14 and 15, in clock ticks).
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream in(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// 1. Durable submissions from `clients` at once, then 2. list pages over the stored jobs,
// on coordinator `c`. Returns the submissions that failed.
int MeasureSubmitsAndLists(const Coordinator& c, int jobs, int clients) {
  auto channel = grpc::CreateChannel(c.address, grpc::InsecureChannelCredentials());
  auto stub = joule::v1::JobService::NewStub(channel);
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> next{0}, failures{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      for (int i = next++; i < jobs; i = next++) {
        joule::v1::SubmitJobRequest req;
        auto* s = req.mutable_spec();
        s->set_name("load");
        s->set_model("mlp");
        s->set_dataset("fashion-mnist");
        s->set_workers(2);
        s->set_global_batch_size(128);
        s->set_epochs(1);
        s->mutable_optimizer()->set_lr(0.05);
        req.set_request_id("load-" + std::to_string(i));
        joule::v1::SubmitJobResponse resp;
        grpc::ClientContext ctx;
        const auto start = Clock::now();
        if (!stub->SubmitJob(&ctx, req, &resp).ok()) ++failures;
        latencies[t].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
    });
  }
  for (auto& th : threads) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> all;
  for (const auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  std::printf("submit: %d durable submissions from %d clients in %.2f s: %.0f/s, "
              "latency p50 %.2f ms, p99 %.2f ms, %d failed\n",
              jobs, clients, elapsed, jobs / elapsed, Percentile(all, 0.5), Percentile(all, 0.99),
              failures.load());

  // 2. Listing over the stored jobs.
  std::vector<double> list_ms;
  for (int i = 0; i < 200; ++i) {
    joule::v1::ListJobsRequest req;
    req.set_page_size(50);
    if (i % 2) req.set_state(joule::v1::JOB_STATE_PENDING);
    if (i % 4 == 3) req.set_before_id(jobs / 2);
    joule::v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    const auto start = Clock::now();
    stub->ListJobs(&ctx, req, &resp);
    list_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::printf("list: pages of 50 over %d stored jobs: p50 %.2f ms, p99 %.2f ms\n", jobs,
              Percentile(list_ms, 0.5), Percentile(list_ms, 0.99));
  return failures.load();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"coordinator load benchmark"};
  int jobs = 20000, clients = 32, workers = 1000, seconds = 10;
  app.add_option("--jobs", jobs, "durable submissions")->capture_default_str();
  app.add_option("--clients", clients, "concurrent submitting clients")->capture_default_str();
  app.add_option("--workers", workers, "simulated workers sending heartbeats")
      ->capture_default_str();
  app.add_option("--seconds", seconds, "heartbeat measurement window")->capture_default_str();
  std::string store;
  app.add_option("--store", store,
                 "the job store of the submit and list measurements (an empty one: "
                 "postgresql://...; default a new SQLite file)");
  bool skip_heartbeats = false;
  app.add_flag("--no-heartbeats", skip_heartbeats, "skip the heartbeat measurement");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fs::temp_directory_path() / ("joule_load_" + std::to_string(getpid()));

  // 1 and 2: durable submissions, then listing.
  std::printf("store: %s\n", store.empty() ? "sqlite (a new file)" : store.c_str());
  Coordinator c = StartCoordinator(dir / "submit", store);
  const int failures = MeasureSubmitsAndLists(c, jobs, clients);
  Stop(c);

  // 3. Heartbeats of many workers at 1 Hz, on a fresh coordinator with no jobs.
  if (skip_heartbeats) return failures == 0 ? 0 : 1;
  c = StartCoordinator(dir / "heartbeats");
  auto wchannel = grpc::CreateChannel(c.address, grpc::InsecureChannelCredentials());
  auto wstub = joule::v1::WorkerService::NewStub(wchannel);
  std::atomic<bool> stop{false};
  std::atomic<int> connected{0};
  std::vector<std::thread> sims;
  for (int w = 0; w < workers; ++w) {
    sims.emplace_back([&, w] {
      joule::v1::RegisterWorkerRequest reg;
      reg.set_host("sim-" + std::to_string(w));
      reg.set_device_kind(joule::v1::DEVICE_KIND_CPU);
      joule::v1::RegisterWorkerResponse r;
      grpc::ClientContext rctx;
      if (!wstub->RegisterWorker(&rctx, reg, &r).ok()) return;
      grpc::ClientContext ctx;
      auto stream = wstub->Session(&ctx);
      joule::v1::WorkerMessage m;
      m.set_hello_worker_id(r.worker_id());
      stream->Write(m);
      ++connected;
      // Spread the heartbeats over the second.
      std::this_thread::sleep_for(std::chrono::milliseconds(w * 1000 / std::max(1, workers)));
      while (!stop) {
        joule::v1::WorkerMessage hb;
        hb.mutable_heartbeat()->set_unix_ms(1);
        if (!stream->Write(hb)) break;
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      ctx.TryCancel();
    });
  }
  while (connected < workers) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::seconds(2));  // settle
  const double cpu0 = CpuSeconds(c.pid);
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  const double cpu = CpuSeconds(c.pid) - cpu0;
  const double wall = std::chrono::duration<double>(Clock::now() - w0).count();
  std::printf("heartbeats: %d workers at 1 Hz for %.1f s: coordinator CPU %.3f s = %.2f%% of "
              "one core\n",
              workers, wall, cpu, 100.0 * cpu / wall);
  stop = true;
  Stop(c);
  for (auto& th : sims) th.join();
  fs::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
