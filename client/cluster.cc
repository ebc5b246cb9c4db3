// `joule cluster up|down`: a coordinator and N CPU workers on this machine, in the
// background, with logs, database and pids under the state directory (the shape of
// Determined's `det deploy local cluster-up`).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "common/names.h"

namespace joule::client {
namespace {

namespace fs = std::filesystem;

std::string ProgramPath(const std::string& name) {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path sibling = self.parent_path() / name;
    if (fs::exists(sibling, ec)) return sibling.string();
  }
  return name;  // resolved through PATH by execvp
}

// Starts `argv` in its own session with stdout and stderr appended to `log`.
// Returns the pid, or -1 with a message on stderr.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return -1;
  }
  if (pid == 0) {
    setsid();
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, STDIN_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

bool Alive(pid_t pid) { return pid > 0 && kill(pid, 0) == 0; }

std::vector<pid_t> ReadPids(const std::string& path) {
  std::vector<pid_t> pids;
  std::ifstream f(path);
  pid_t p;
  while (f >> p) pids.push_back(p);
  return pids;
}

// Reaps `pid` if it is our child and has exited; true when it is gone.
bool Gone(pid_t pid) {
  int status;
  waitpid(pid, &status, WNOHANG);
  return !Alive(pid);
}

int Down(const GlobalOptions& g, bool quiet) {
  const std::string dir = StateDir(g);
  std::vector<pid_t> pids = ReadPids(dir + "/pids");
  if (pids.empty()) {
    if (!quiet) std::cout << "no local cluster in " << dir << "\n";
    return kExitOk;
  }
  // Workers first (reverse start order), then the coordinator.
  int stopped = 0;
  for (auto it = pids.rbegin(); it != pids.rend(); ++it) {
    if (Alive(*it) && kill(*it, SIGTERM) == 0) ++stopped;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (pid_t p : pids) {
    while (!Gone(p) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (Alive(p)) {
      std::cerr << "process " << p << " ignored SIGTERM for 10 s; sending SIGKILL\n";
      kill(p, SIGKILL);
    }
  }
  std::error_code ec;
  fs::remove(dir + "/pids", ec);
  fs::remove(dir + "/coordinator.addr", ec);
  if (!quiet) {
    std::cout << "local cluster stopped (" << stopped << " of " << pids.size()
              << " processes were still running)\n";
  }
  return kExitOk;
}

int Up(const GlobalOptions& g, int workers, int threads, int port, int energy_period_ms,
       const std::vector<std::string>& data_roots) {
  const std::string dir = StateDir(g);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    std::cerr << "error: cannot create state directory " << dir << ": " << ec.message() << "\n";
    return kExitFailed;
  }
  for (pid_t p : ReadPids(dir + "/pids")) {
    if (Alive(p)) {
      std::cerr << "error: a local cluster is already running from " << dir
                << " (pid " << p << "); run `joule cluster down` first\n";
      return kExitFailed;
    }
  }
  fs::remove(dir + "/coordinator.addr", ec);
  std::ofstream pids(dir + "/pids", std::ios::trunc);

  // Plain text is fine here: everything listens on loopback only.
  std::vector<std::string> coordinator_argv = {
      ProgramPath("joule-coordinator"), "--listen", absl::StrCat("127.0.0.1:", port),
      "--data-dir", dir, "--address-file", dir + "/coordinator.addr", "--insecure"};
  for (const std::string& root : data_roots) {
    coordinator_argv.push_back("--data-root");
    coordinator_argv.push_back(root);
  }
  pid_t coordinator = Spawn(coordinator_argv, dir + "/coordinator.log");
  if (coordinator < 0) return kExitFailed;
  pids << coordinator << "\n" << std::flush;

  std::string address;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (address.empty()) {
    std::ifstream f(dir + "/coordinator.addr");
    f >> address;
    if (!address.empty()) break;
    if (Gone(coordinator) || std::chrono::steady_clock::now() > deadline) {
      std::cerr << "error: the coordinator did not start; see " << dir << "/coordinator.log\n";
      Down(g, true);
      return kExitFailed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / workers);
  }
  for (int i = 0; i < workers; ++i) {
    std::vector<std::string> argv = {ProgramPath("joule-worker"), "--coordinator", address,
                                      "--threads", std::to_string(threads), "--host",
                                      absl::StrCat("local-", i), "--checkpoint-root",
                                      dir + "/checkpoints", "--insecure"};
    if (energy_period_ms >= 0) {
      argv.push_back("--energy-period-ms");
      argv.push_back(std::to_string(energy_period_ms));
    }
    pid_t w = Spawn(argv, absl::StrCat(dir, "/worker-", i, ".log"));
    if (w < 0) {
      Down(g, true);
      return kExitFailed;
    }
    pids << w << "\n" << std::flush;
  }

  // Ready when every worker holds a session.
  TrustLocalCluster(address);
  auto stub = JobStub(address);
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    v1::ListWorkersResponse resp;
    grpc::ClientContext ctx;
    PrepareContext(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    int ready = 0;
    if (stub->ListWorkers(&ctx, {}, &resp).ok()) {
      for (const auto& w : resp.workers()) ready += w.state() != v1::WORKER_STATE_REGISTERED;
    }
    if (ready >= workers) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "error: only " << ready << " of " << workers
                << " workers joined within 60 s; see " << dir << "/worker-*.log\n";
      Down(g, true);
      return kExitFailed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string metrics;
  {
    std::ifstream f(dir + "/coordinator.addr");
    std::string first;
    f >> first >> metrics;
  }
  std::cout << "local cluster up: coordinator " << address << ", " << workers
            << " cpu workers (" << threads << " intra-op threads each)\n"
            << "  coordinator metrics: http://" << metrics << "/metrics\n"
            << "  Prometheus http_sd:  http://" << metrics << "/http_sd (workers' /metrics)\n"
            << "  state, logs and job database in " << dir << "\n"
            << "  `joule` commands find it there; stop it with `joule cluster down`\n";
  return kExitOk;
}

}  // namespace

void AddClusterCommands(CLI::App& app, GlobalOptions& g, int* rc) {
  CLI::App* cluster = app.add_subcommand("cluster", "start or stop a local cluster");
  cluster->require_subcommand(1);
  auto workers = std::make_shared<int>(2);
  auto threads = std::make_shared<int>(0);
  auto port = std::make_shared<int>(0);
  auto energy_period = std::make_shared<int>(-1);
  auto data_roots = std::make_shared<std::vector<std::string>>();
  CLI::App* up = cluster->add_subcommand(
      "up", "start a coordinator and N CPU workers on this machine in the background");
  up->add_option("--workers", *workers, "number of workers")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  up->add_option("--threads", *threads, "intra-op threads per worker (default cores / N)");
  up->add_option("--port", *port, "coordinator port (default: a free one)");
  up->add_option("--energy-period-ms", *energy_period,
                 "workers' energy sampling period (default 100; 0 turns metering off)");
  up->add_option("--data-root", *data_roots,
                 "directory that files named by jobs (idx:DIR, csv:FILE, torchscript:FILE) "
                 "must lie under; repeatable (default /usr/share/datasets)");
  up->callback([&g, workers, threads, port, energy_period, data_roots, rc] {
    *rc = Up(g, *workers, *threads, *port, *energy_period, *data_roots);
  });
  CLI::App* down = cluster->add_subcommand("down", "stop the local cluster");
  down->callback([&g, rc] { *rc = Down(g, false); });
}

}  // namespace joule::client
