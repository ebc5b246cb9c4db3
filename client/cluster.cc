// `joule cluster up|down`: a coordinator and N CPU workers on this machine, in the
// background, with logs, database and pids under the state directory (the shape of
// Determined's `det deploy local cluster-up`).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "common/atomic_file.h"
#include "client/cluster_state.h"
#include "client/subprocess.h"
#include "common/names.h"

namespace joule::client {

std::string ProgramPath(const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path sibling = self.parent_path() / name;
    if (fs::exists(sibling, ec)) return sibling.string();
  }
  return name;  // resolved through PATH by execvp
}

namespace {

namespace fs = std::filesystem;

// The message of the last error a program wrote to `log` at or after byte `from`: the text
// of the last line at level E (error) or C (critical), in the pattern common/logging.cc sets
// ("TIME E PROGRAM[PID:TID] message") or gRPC's ("E1201 TIME PID FILE:LINE] message"), else
// the last line there. Empty when there is none.
std::string LastLogError(const std::string& log, std::streamoff from) {
  std::ifstream f(log);
  if (!f) return "";
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  // Only the tail: a log can be long, and its last lines are what the program said last.
  constexpr std::streamoff kTail = 64 << 10;
  f.seekg(std::max(from, size - kTail));
  std::string line, last, last_error;
  while (std::getline(f, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    last = line;
    // "2024-05-01T12:00:00.123 E joule-coordinator[42:43] message"
    const size_t space = line.find(' ');
    if (space != std::string::npos && space + 2 < line.size() && line[space + 2] == ' ' &&
        (line[space + 1] == 'E' || line[space + 1] == 'C')) {
      const size_t close = line.find("] ", space);
      last_error = close == std::string::npos ? line.substr(space + 3) : line.substr(close + 2);
    } else if (line.size() > 5 && (line[0] == 'E' || line[0] == 'F') &&
               std::all_of(line.begin() + 1, line.begin() + 5, ::isdigit)) {
      // gRPC's own "E1201 11:15:58.483717143   12180 chttp2_server.cc:1045] message"
      const size_t close = line.find("] ");
      if (close != std::string::npos) {
        const size_t text = line.find_first_not_of(' ', close + 2);
        last_error = text == std::string::npos ? line : line.substr(text);
      }
    }
  }
  return last_error.empty() ? last : last_error;
}

// Reads STATE_DIR/pids. NOT_FOUND when there is none.
absl::StatusOr<PidsFile> ReadPidsFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ParsePidsFile(ss.str(), path);
}

// Writes STATE_DIR/pids whole (a new file renamed over the old), so that a reader never sees
// half of it.
bool WritePidsFile(const std::string& path, const std::vector<ProcessIdentity>& processes) {
  if (absl::Status s = WriteFileAtomically(path, FormatPidsFile(processes)); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return false;
  }
  return true;
}

bool IsJouleProgram(const std::string& exe) {
  const std::string name = fs::path(exe).filename().string();
  return name == "joule-coordinator" || name == "joule-worker";
}

// Signals the processes `cluster up` recorded that are still the ones it started: SIGTERM,
// then SIGKILL after 10 s. A PID now held by another process is left alone with a note.
// Returns how many were signalled.
int StopRecorded(const std::vector<ProcessIdentity>& processes, const std::string& pids_path) {
  // Workers first (reverse start order), then the coordinator.
  std::vector<ProcessIdentity> signalled;
  for (auto it = processes.rbegin(); it != processes.rend(); ++it) {
    std::string why;
    switch (CheckProcess(*it, &why)) {
      case Ownership::kGone:
        break;
      case Ownership::kNotOurs:
        std::cerr << "note: pid " << it->pid << " (" << it->exe << " in " << pids_path
                  << ") is no longer a process this cluster started: " << why
                  << "; left it alone\n";
        break;
      case Ownership::kOurs:
        if (kill(it->pid, SIGTERM) == 0) signalled.push_back(*it);
        break;
    }
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (const ProcessIdentity& p : signalled) {
    while (CheckProcess(p) == Ownership::kOurs && std::chrono::steady_clock::now() < deadline) {
      waitpid(p.pid, nullptr, WNOHANG);  // our child, when `cluster up` itself stops
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (CheckProcess(p) == Ownership::kOurs) {
      std::cerr << "process " << p.pid << " ignored SIGTERM for 10 s; sending SIGKILL\n";
      kill(p.pid, SIGKILL);
    }
  }
  return static_cast<int>(signalled.size());
}

int Down(const GlobalOptions& g, bool quiet) {
  const std::string dir = StateDir(g);
  const std::string pids_path = dir + "/pids";
  absl::StatusOr<PidsFile> file = ReadPidsFile(pids_path);
  if (absl::IsNotFound(file.status()) ||
      (file.ok() && file->processes.empty() && file->legacy_pids.empty())) {
    if (!quiet) std::cout << "no local cluster in " << dir << "\n";
    return kExitOk;
  }
  if (!file.ok()) {
    std::cerr << "error: " << file.status().message() << "; signalled nothing (remove the file "
              << "once no cluster runs from " << dir << ")\n";
    return kExitFailed;
  }
  int stopped = StopRecorded(file->processes, pids_path);
  if (!file->legacy_pids.empty()) {
    // An older joule recorded bare PIDs: nothing tells whether they are still its processes.
    std::string pids;
    for (pid_t p : file->legacy_pids) {
      absl::StrAppend(&pids, pids.empty() ? "" : " ", p);
      absl::StatusOr<ProcessIdentity> live = IdentifyProcess(p);
      if (live.ok() && IsJouleProgram(live->exe)) absl::StrAppend(&pids, " (", live->exe, ")");
    }
    std::cerr << "note: " << pids_path << " was written by an older joule and records bare "
              << "PIDs, which other processes may hold now; signalled none of " << pids
              << " (stop them with kill if they are still this cluster's)\n";
  }
  std::error_code ec;
  fs::remove(pids_path, ec);
  fs::remove(dir + "/coordinator.addr", ec);
  if (!quiet) {
    std::cout << "local cluster stopped (" << stopped << " of "
              << file->processes.size() + file->legacy_pids.size()
              << " processes were still running and signalled)\n";
  }
  return kExitOk;
}

// Stops what a failed `cluster up` started, SIGTERM then SIGKILL after 10 s, and removes the
// state it wrote. `children` are this process's own, not yet reaped, so their PIDs cannot
// have passed to other processes.
void Abandon(const std::string& dir, const std::vector<pid_t>& children) {
  for (pid_t p : children) kill(p, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (pid_t p : children) {
    while (waitpid(p, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::error_code ec;
  fs::remove(dir + "/pids", ec);
  fs::remove(dir + "/coordinator.addr", ec);
}

// The coordinator's address, once it wrote STATE_DIR/coordinator.addr (within 30 s).
// Errors: UNAVAILABLE saying why the coordinator did not start, from the last error line
// it logged after `log_start` (e.g. "cannot start: ... address already in use"), and
// where its log is.
absl::StatusOr<std::string> WaitForAddress(const std::string& dir, pid_t coordinator,
                                           const std::string& coordinator_log,
                                           std::streamoff log_start) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    std::string address;
    std::ifstream(dir + "/coordinator.addr") >> address;
    if (!address.empty()) return address;
    int status = 0;
    if (waitpid(coordinator, &status, WNOHANG) == coordinator) {
      const std::string why = LastLogError(coordinator_log, log_start);
      return absl::UnavailableError(absl::StrCat(
          "the coordinator did not start",
          WIFSIGNALED(status) ? absl::StrCat(" (killed by signal ", WTERMSIG(status), ", ",
                                             strsignal(WTERMSIG(status)), ")")
                              : "",
          why.empty() ? "" : ": " + why, " (log: ", coordinator_log, ")"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::UnavailableError(absl::StrCat(
          "the coordinator did not write its address within 30 s; see ", coordinator_log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// FAILED_PRECONDITION, saying what runs, when a cluster from `dir` (as `previous`
// records it) may still be running.
absl::Status CheckNoClusterRunning(const PidsFile& previous, const std::string& dir,
                                   const std::string& pids_path) {
  for (const ProcessIdentity& p : previous.processes) {
    if (CheckProcess(p) == Ownership::kOurs) {
      return absl::FailedPreconditionError(
          absl::StrCat("a local cluster is already running from ", dir, " (pid ", p.pid, ", ",
                       p.exe, "); run `joule cluster down` first"));
    }
  }
  for (pid_t p : previous.legacy_pids) {
    absl::StatusOr<ProcessIdentity> live = IdentifyProcess(p);
    if (live.ok() && IsJouleProgram(live->exe)) {
      return absl::FailedPreconditionError(
          absl::StrCat("a local cluster started by an older joule may be running from ", dir,
                       " (pid ", p, " is ", live->exe, "); stop it, then remove ", pids_path));
    }
  }
  return absl::OkStatus();
}

// Waits up to 60 s until `workers` workers hold sessions with the coordinator at
// `address`; the number that did.
int WaitForWorkers(const std::string& address, int workers) {
  TrustLocalCluster(address);
  auto stub = JobStub(address);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    v1::ListWorkersResponse resp;
    grpc::ClientContext ctx;
    PrepareContext(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    int ready = 0;
    if (stub->ListWorkers(&ctx, {}, &resp).ok()) {
      for (const auto& w : resp.workers()) ready += w.state() != v1::WORKER_STATE_REGISTERED;
    }
    if (ready >= workers || std::chrono::steady_clock::now() > deadline) return ready;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The local cluster's coordinator: on loopback only, so plain text is fine.
std::vector<std::string> CoordinatorArgv(const std::string& dir, int port, int metrics_port,
                                         const std::vector<std::string>& data_roots,
                                         bool web_ui) {
  std::vector<std::string> argv = {
      ProgramPath("joule-coordinator"), "--listen", absl::StrCat("127.0.0.1:", port),
      "--data-dir", dir, "--address-file", dir + "/coordinator.addr", "--insecure",
      "--metrics-listen", absl::StrCat("127.0.0.1:", metrics_port)};
  if (web_ui) argv.push_back("--web-ui");
  for (const std::string& root : data_roots) {
    argv.push_back("--data-root");
    argv.push_back(root);
  }
  return argv;
}

// Worker `i` of the local cluster (host local-I, checkpoints under DIR/checkpoints; its
// /metrics on worker_metrics_port + i when that is > 0; metering period when >= 0).
std::vector<std::string> WorkerArgv(const std::string& dir, const std::string& address, int i,
                                    int threads, int worker_metrics_port,
                                    int energy_period_ms) {
  std::vector<std::string> argv = {ProgramPath("joule-worker"), "--coordinator", address,
                                    "--threads", std::to_string(threads), "--host",
                                    absl::StrCat("local-", i), "--checkpoint-root",
                                    dir + "/checkpoints", "--insecure"};
  if (worker_metrics_port > 0) {
    argv.push_back("--metrics-address");
    argv.push_back(absl::StrCat("127.0.0.1:", worker_metrics_port + i));
  }
  if (energy_period_ms >= 0) {
    argv.push_back("--energy-period-ms");
    argv.push_back(std::to_string(energy_period_ms));
  }
  return argv;
}

int Up(const GlobalOptions& g, int workers, int threads, int port, int energy_period_ms,
       const std::vector<std::string>& data_roots, int metrics_port, int worker_metrics_port,
       bool web_ui) {
  const std::string dir = StateDir(g);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    std::cerr << "error: cannot create state directory " << dir << ": " << ec.message() << "\n";
    return kExitFailed;
  }
  const std::string pids_path = dir + "/pids";
  absl::StatusOr<PidsFile> previous = ReadPidsFile(pids_path);
  if (!previous.ok() && !absl::IsNotFound(previous.status())) {
    std::cerr << "error: " << previous.status().message() << " (remove the file once no "
              << "cluster runs from " << dir << ")\n";
    return kExitFailed;
  }
  if (previous.ok()) {
    if (absl::Status s = CheckNoClusterRunning(*previous, dir, pids_path); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitFailed;
    }
  }
  fs::remove(dir + "/coordinator.addr", ec);
  std::vector<ProcessIdentity> started;  // what STATE_DIR/pids records
  std::vector<pid_t> children;           // everything started, recorded or not
  // Records child `pid` (exec done) in STATE_DIR/pids; false, with a message, on failure.
  auto record = [&](pid_t pid) {
    children.push_back(pid);
    absl::StatusOr<ProcessIdentity> id = IdentifyProcess(pid);
    if (absl::IsNotFound(id.status())) return true;  // it has exited: nothing to record
    if (!id.ok()) {
      std::cerr << "error: " << id.status().message() << "\n";
      return false;
    }
    started.push_back(*id);
    return WritePidsFile(pids_path, started);
  };
  if (!WritePidsFile(pids_path, started)) return kExitFailed;

  const std::vector<std::string> coordinator_argv =
      CoordinatorArgv(dir, port, metrics_port, data_roots, web_ui);
  const std::string coordinator_log = dir + "/coordinator.log";
  std::streamoff log_start = 0;  // what this coordinator writes follows earlier runs' lines
  if (std::error_code size_ec; fs::exists(coordinator_log, size_ec)) {
    log_start = static_cast<std::streamoff>(fs::file_size(coordinator_log, size_ec));
    if (size_ec) log_start = 0;
  }
  absl::StatusOr<pid_t> spawned = Spawn(coordinator_argv, coordinator_log);
  if (!spawned.ok()) std::cerr << "error: " << spawned.status().message() << "\n";
  const pid_t coordinator = spawned.ok() ? *spawned : -1;
  if (coordinator < 0 || !record(coordinator)) {
    Abandon(dir, children);
    return kExitFailed;
  }

  absl::StatusOr<std::string> address_or =
      WaitForAddress(dir, coordinator, coordinator_log, log_start);
  if (!address_or.ok()) {
    std::cerr << "error: " << address_or.status().message() << "\n";
    Abandon(dir, children);
    return kExitFailed;
  }
  const std::string& address = *address_or;

  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / workers);
  }
  for (int i = 0; i < workers; ++i) {
    absl::StatusOr<pid_t> w =
        Spawn(WorkerArgv(dir, address, i, threads, worker_metrics_port, energy_period_ms),
              absl::StrCat(dir, "/worker-", i, ".log"));
    if (!w.ok()) std::cerr << "error: " << w.status().message() << "\n";
    if (!w.ok() || !record(*w)) {
      Abandon(dir, children);
      return kExitFailed;
    }
  }

  // Ready when every worker holds a session.
  if (int ready = WaitForWorkers(address, workers); ready < workers) {
    std::cerr << "error: only " << ready << " of " << workers << " workers joined within 60 s; see "
              << dir << "/worker-*.log\n";
    Abandon(dir, children);
    return kExitFailed;
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
            << (web_ui ? absl::StrCat("  web UI:              http://", metrics, "/ui/\n") : "")
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
  auto metrics_port = std::make_shared<int>(0);
  auto worker_metrics_port = std::make_shared<int>(0);
  auto web_ui = std::make_shared<bool>(false);
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
  up->add_option("--metrics-port", *metrics_port,
                 "coordinator /metrics and /http_sd port (default: a free one); fixed ports "
                 "keep a Prometheus configuration valid across restarts")
      ->check(CLI::Range(0, 65535));
  up->add_option("--worker-metrics-port", *worker_metrics_port,
                 "worker i serves /metrics on this port + i (default: free ports, found "
                 "through /http_sd)")
      ->check(CLI::Range(0, 65535));
  up->add_flag("--web-ui", *web_ui,
               "serve the web UI (jobs, live power by rank, logs) next to /metrics");
  up->callback([&g, workers, threads, port, energy_period, data_roots, metrics_port,
                worker_metrics_port, web_ui, rc] {
    *rc = Up(g, *workers, *threads, *port, *energy_period, *data_roots, *metrics_port,
             *worker_metrics_port, *web_ui);
  });
  CLI::App* down = cluster->add_subcommand("down", "stop the local cluster");
  down->callback([&g, rc] { *rc = Down(g, false); });
}

}  // namespace joule::client
