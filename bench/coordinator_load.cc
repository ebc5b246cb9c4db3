// Coordinator under load, on loopback: durable submissions per second with their p50/p99
// latency, list latency over the stored jobs, and the coordinator's CPU while 1,000
// simulated workers (each on its own connection) hold sessions and heartbeat at the
// interval the coordinator gives, over UDP (the coordinator's default) or, with
// --stream-heartbeats, on their gRPC streams. Starts its own joule-coordinator processes.
// With --history N: the list pages a user and `joule estimate` ask for over N finished jobs
// (loaded straight into the store's table in one transaction, then served by a coordinator).
//
// usage: joule-bench-coordinator-load [--jobs 20000] [--clients 32] [--workers 1000]
//                                     [--seconds 10] [--store URI] [--no-heartbeats]
//                                     [--heartbeat-timeout-ms T]
//                                     [--max-heartbeats-per-second R] [--stream-heartbeats]
//                                     [--history N]
// bench/store.sh runs the submit and list measurements on SQLite and PostgreSQL side by side.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>
#if JOULE_WITH_POSTGRESQL
#include <libpq-fe.h>
#endif

#include "common/liveness_datagram.h"
#include "joule/v1/job.grpc.pb.h"
#include "joule/v1/worker.grpc.pb.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The agent's HTTP/2 keepalive (worker/agent/agent.h AgentOptions::keepalive_time).
constexpr int kWorkerKeepaliveMs = 30000;
constexpr int kWorkerKeepaliveTimeoutMs = 5000;  // AgentOptions::keepalive_timeout

struct Coordinator {
  pid_t pid = -1;
  std::string address;
};

// `store`: the coordinator's --store ("": a SQLite file in `dir`).
// `flags`: more of the coordinator's flags.
Coordinator StartCoordinator(const fs::path& dir, const std::string& store = "",
                             const std::vector<std::string>& flags = {}) {
  fs::create_directories(dir);
  fs::remove(dir / "addr");  // an earlier coordinator's in this directory
  const std::string bin = fs::read_symlink("/proc/self/exe").parent_path() / "joule-coordinator";
  Coordinator c;
  const pid_t bench = getpid();
  c.pid = fork();
  if (c.pid == 0) {
    // The coordinator ends with this bench, also when it is killed (and when it died before
    // this line: then this process's parent is no longer the bench).
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != bench) _exit(1);
    freopen((dir / "coordinator.log").c_str(), "w", stderr);
    const std::string where = store.empty() ? "sqlite:" + (dir / "jobs.db").string() : store;
    std::vector<std::string> args = {bin,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--insecure",
                                     "--store",
                                     where,
                                     "--address-file",
                                     (dir / "addr").string(),
                                     "--max-active-jobs-per-client",
                                     "100000000",
                                     "--log-level",
                                     "warn"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
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

// --- History: list pages over many finished jobs -----------------------------------

// A finished job's record as a coordinator stores it (id 0: the row's id is the truth):
// its spec with labels, a two-rank result with energy by phase and three epochs. Job `i`:
// 90% succeeded, 7% failed, 3% cancelled; a sweep label of 1,000 jobs each; three models.
joule::v1::Job HistoricJob(int i) {
  static const char* kModels[] = {"mlp", "cnn", "logreg"};
  static const char* kPhases[] = {"data", "forward", "backward", "communication", "optimizer"};
  joule::v1::Job job;
  job.set_state(i % 100 < 90   ? joule::v1::JOB_STATE_SUCCEEDED
                : i % 100 < 97 ? joule::v1::JOB_STATE_FAILED
                               : joule::v1::JOB_STATE_CANCELLED);
  job.set_attempt(1);
  job.set_created_unix_ms(1'790'000'000'000 + int64_t{i} * 1000);
  job.set_started_unix_ms(job.created_unix_ms() + 200);
  job.set_finished_unix_ms(job.created_unix_ms() + 60'000);
  auto* spec = job.mutable_spec();
  spec->set_name("history");
  spec->set_model(kModels[i % 3]);
  spec->set_dataset("fashion-mnist");
  spec->set_workers(2);
  spec->set_global_batch_size(128 << (i % 4));
  spec->set_epochs(3);
  spec->mutable_optimizer()->set_name("sgd");
  spec->mutable_optimizer()->set_lr(0.05);
  (*spec->mutable_labels())["sweep"] = "s" + std::to_string(i / 1000);
  (*spec->mutable_labels())["team"] = "t" + std::to_string(i % 7);
  auto* result = job.mutable_result();
  result->set_test_accuracy(0.85);
  result->set_samples(180'000);
  result->set_steps(1404);
  result->set_train_seconds(50);
  result->set_wall_seconds(58);
  for (int r = 0; r < 2; ++r) {
    auto* rank = result->add_ranks();
    rank->set_rank(r);
    rank->set_worker_id("w" + std::to_string(r + 1) + ".bc60");
    rank->set_ok(true);
    rank->set_parameter_hash("f2000045");
    for (const char* phase : kPhases) {
      auto* e = rank->add_energy();
      e->set_device("cpu-package-0");
      e->set_source("rapl");
      e->set_phase(phase);
      e->set_joules(100.0 + r);
    }
  }
  result->mutable_energy()->set_total_joules(1000);
  result->mutable_energy()->set_ranks_reported(2);
  for (int e = 1; e <= 3; ++e) {
    auto* epoch = result->add_history();
    epoch->set_epoch(e);
    epoch->set_step(468 * e);
    epoch->set_samples(59'904 * e);
    epoch->set_elapsed_seconds(17.0 * e);
    epoch->set_train_loss(0.9 / e);
    epoch->set_test_accuracy(0.78 + 0.02 * e);
  }
  return job;
}

// LoadHistory into the SQLite file `sqlite_file`.
std::string LoadHistorySqlite(const fs::path& sqlite_file, int n) {
  sqlite3* db = nullptr;
  if (sqlite3_open(sqlite_file.c_str(), &db) != SQLITE_OK) return sqlite3_errmsg(db);
  std::string error;
  sqlite3_stmt* insert = nullptr;
  sqlite3_stmt* label = nullptr;
  if (sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "INSERT INTO jobs(state, record) VALUES (?1, ?2)", -1, &insert,
                         nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(
          db, "INSERT INTO job_labels(key, value, job_id, state) VALUES (?1, ?2, ?3, ?4)", -1,
          &label, nullptr) != SQLITE_OK) {
    error = sqlite3_errmsg(db);
  }
  std::string record;
  for (int i = 0; error.empty() && i < n; ++i) {
    const joule::v1::Job job = HistoricJob(i);
    job.SerializeToString(&record);
    sqlite3_bind_int(insert, 1, job.state());
    sqlite3_bind_blob(insert, 2, record.data(), static_cast<int>(record.size()), SQLITE_STATIC);
    if (sqlite3_step(insert) != SQLITE_DONE) error = sqlite3_errmsg(db);
    sqlite3_reset(insert);
    const int64_t id = sqlite3_last_insert_rowid(db);
    for (const auto& [key, value] : job.spec().labels()) {
      if (!error.empty()) break;
      sqlite3_bind_blob(label, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
      sqlite3_bind_blob(label, 2, value.data(), static_cast<int>(value.size()), SQLITE_STATIC);
      sqlite3_bind_int64(label, 3, id);
      sqlite3_bind_int(label, 4, job.state());
      if (sqlite3_step(label) != SQLITE_DONE) error = sqlite3_errmsg(db);
      sqlite3_reset(label);
    }
  }
  sqlite3_finalize(insert);
  sqlite3_finalize(label);
  if (error.empty() && sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    error = sqlite3_errmsg(db);
  }
  sqlite3_close(db);
  return error;
}

// LoadHistory into the PostgreSQL database `store` (a libpq URI).
std::string LoadHistoryPostgres(const std::string& store, int n) {
#if JOULE_WITH_POSTGRESQL
  PGconn* conn = PQconnectdb(store.c_str());
  std::string error;
  auto exec = [&](const std::string& sql, ExecStatusType want) {
    if (!error.empty()) return;
    PGresult* r = PQexec(conn, sql.c_str());
    if (PQresultStatus(r) != want) error = PQerrorMessage(conn);
    PQclear(r);
  };
  if (PQstatus(conn) != CONNECTION_OK) error = PQerrorMessage(conn);
  static const char kHex[] = "0123456789abcdef";
  // COPY in text format: a bytea as \\x and its hex digits (the backslash doubled). The
  // jobs get ids 1..n (the store is empty), which their labels' rows name.
  auto copy = [&](const std::string& into, const std::function<void(std::string&)>& rows) {
    std::string sql = "COPY ";
    sql += into;
    sql += " FROM STDIN";
    exec(sql, PGRES_COPY_IN);
    if (!error.empty()) return;
    std::string data;
    rows(data);
    if (PQputCopyData(conn, data.data(), static_cast<int>(data.size())) != 1 ||
        PQputCopyEnd(conn, nullptr) != 1) {
      error = PQerrorMessage(conn);
      return;
    }
    PGresult* r = PQgetResult(conn);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) error = PQerrorMessage(conn);
    PQclear(r);
  };
  auto hex = [&](std::string& out, const std::string& bytes) {
    out += "\\\\x";
    for (unsigned char b : bytes) {
      out += kHex[b >> 4];
      out += kHex[b & 15];
    }
  };
  exec("BEGIN", PGRES_COMMAND_OK);
  const int chunk = 50'000;
  for (int from = 0; error.empty() && from < n; from += chunk) {
    std::string record;
    copy("jobs(id, state, record)", [&](std::string& out) {
      for (int i = from; i < std::min(n, from + chunk); ++i) {
        const joule::v1::Job job = HistoricJob(i);
        job.SerializeToString(&record);
        out += std::to_string(i + 1);
        out += '\t';
        out += std::to_string(job.state());
        out += '\t';
        hex(out, record);
        out += '\n';
      }
    });
    copy("job_labels(key, value, job_id, state)", [&](std::string& out) {
      for (int i = from; i < std::min(n, from + chunk); ++i) {
        const joule::v1::Job job = HistoricJob(i);  // named: a temporary's labels would dangle
        for (const auto& [key, value] : job.spec().labels()) {
          hex(out, key);
          out += '\t';
          hex(out, value);
          out += '\t';
          out += std::to_string(i + 1);
          out += '\t';
          out += std::to_string(job.state());
          out += '\n';
        }
      }
    });
  }
  std::string setval = "SELECT setval('jobs_id_seq', ";
  setval += std::to_string(n);
  setval += ")";
  exec(setval, PGRES_TUPLES_OK);
  exec("COMMIT", PGRES_COMMAND_OK);
  exec("ANALYZE", PGRES_COMMAND_OK);
  PQfinish(conn);
  return error;
#else
  (void)store;
  (void)n;
  return "built without PostgreSQL (libpq-dev)";
#endif
}

// Appends `n` finished jobs and their labels to the store's tables (made by a coordinator
// first, empty), in one transaction: straight SQL, as no coordinator API takes a million
// jobs at once. Returns an error, or "".
std::string LoadHistory(const std::string& store, const fs::path& sqlite_file, int n) {
  return store.rfind("postgres", 0) == 0 ? LoadHistoryPostgres(store, n)
                                         : LoadHistorySqlite(sqlite_file, n);
}

// p50/p99 of 200 ListJobs pages of `page_size` per kind of question, over `n` stored
// finished jobs, from random places in the history.
void MeasureHistoryLists(const Coordinator& c, int n) {
  auto stub = joule::v1::JobService::NewStub(
      grpc::CreateChannel(c.address, grpc::InsecureChannelCredentials()));
  std::mt19937 rng(42);
  struct Question {
    const char* what;
    std::function<void(joule::v1::ListJobsRequest&)> ask;
  };
  const std::vector<Question> questions = {
      {"newest page, any state (joule list)", [](auto&) {}},
      {"succeeded, anywhere (joule estimate: pages of 500)",
       [&](auto& r) {
         r.set_state(joule::v1::JOB_STATE_SUCCEEDED);
         r.set_page_size(500);
         r.set_before_id(1 + static_cast<int64_t>(rng() % n));
       }},
      {"failed, anywhere",
       [&](auto& r) {
         r.set_state(joule::v1::JOB_STATE_FAILED);
         r.set_before_id(1 + static_cast<int64_t>(rng() % n));
       }},
      {"failed or cancelled, anywhere",
       [&](auto& r) {
         r.add_states(joule::v1::JOB_STATE_FAILED);
         r.add_states(joule::v1::JOB_STATE_CANCELLED);
         r.set_before_id(1 + static_cast<int64_t>(rng() % n));
       }},
      {"running (none stored)", [](auto& r) { r.set_state(joule::v1::JOB_STATE_RUNNING); }},
      {"one sweep (a label on 1,000 jobs)",
       [&](auto& r) { (*r.mutable_labels())["sweep"] = "s" + std::to_string(rng() % (n / 1000)); }},
      {"a team's failed jobs (a label on 1 in 7), anywhere",
       [&](auto& r) {
         (*r.mutable_labels())["team"] = "t" + std::to_string(rng() % 7);
         r.set_state(joule::v1::JOB_STATE_FAILED);
         r.set_before_id(1 + static_cast<int64_t>(rng() % n));
       }},
  };
  for (const Question& q : questions) {
    std::vector<double> ms;
    size_t jobs = 0;
    for (int i = 0; i < 200; ++i) {
      joule::v1::ListJobsRequest req;
      req.set_page_size(50);
      q.ask(req);
      joule::v1::ListJobsResponse resp;
      grpc::ClientContext ctx;
      const auto start = Clock::now();
      const grpc::Status s = stub->ListJobs(&ctx, req, &resp);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      if (!s.ok()) {
        std::printf("history: %s: %s\n", q.what, s.error_message().c_str());
        return;
      }
      jobs += resp.jobs_size();
    }
    std::printf("history: %-52s p50 %7.2f ms, p99 %7.2f ms (%.0f jobs a page)\n", q.what,
                Percentile(ms, 0.5), Percentile(ms, 0.99), jobs / 200.0);
  }
}

// --history: loads `n` finished jobs into a new store (SQLite in `dir`, or the empty
// PostgreSQL database `store`) and measures list pages over them; the exit code.
int RunHistory(const std::string& store, const fs::path& dir, int history) {
  if (!store.empty() && store.rfind("postgres", 0) != 0) {
    std::fprintf(stderr,
                 "history: --store takes an empty PostgreSQL database here (SQLite: "
                 "a new file, without --store)\n");
    return 2;
  }
  std::printf("store: %s\n", store.empty() ? "sqlite (a new file)" : store.c_str());
  Coordinator c = StartCoordinator(dir / "history", store);  // makes the schema
  Stop(c);
  const auto t0 = Clock::now();
  if (std::string error = LoadHistory(store, dir / "history" / "jobs.db", history);
      !error.empty()) {
    std::fprintf(stderr, "history: loading %d jobs failed: %s\n", history, error.c_str());
    fs::remove_all(dir);
    return 1;
  }
  std::printf("history: %d finished jobs loaded in %.1f s\n", history,
              std::chrono::duration<double>(Clock::now() - t0).count());
  c = StartCoordinator(dir / "history", store);
  MeasureHistoryLists(c, history);
  Stop(c);
  fs::remove_all(dir);
  return 0;
}

}  // namespace

// One simulated idle worker's session (as worker/agent/session.cc holds it): a hello, then
// a heartbeat whenever Beat() is called, every coordinator message read and counted.
class SimulatedSession final
    : public grpc::ClientBidiReactor<joule::v1::WorkerMessage, joule::v1::CoordinatorMessage> {
 public:
  // `heard`: counts the coordinator's messages; `interval_ms`: set to each ack's interval.
  SimulatedSession(joule::v1::WorkerService::Stub* stub, const std::string& worker_id,
                   std::atomic<int64_t>* heard, std::atomic<int>* interval_ms)
      : heard_(heard), interval_ms_(interval_ms) {
    hello_.set_hello_worker_id(worker_id);
    heartbeat_.mutable_heartbeat()->set_unix_ms(1);
    stub->async()->Session(&ctx_, this);
    writing_ = true;
    StartWrite(&hello_);
    StartRead(&in_);
    StartCall();
  }
  // Sends a heartbeat unless the last one is still being written. False once ended.
  bool Beat() {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return false;
    if (writing_) return true;
    writing_ = true;
    StartWrite(&heartbeat_);
    return true;
  }
  void Cancel() { ctx_.TryCancel(); }
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }
  void OnWriteDone(bool) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    ++*heard_;
    if (in_.heartbeat_ack().heartbeat_interval_ms() > 0) {
      *interval_ms_ = in_.heartbeat_ack().heartbeat_interval_ms();
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

 private:
  grpc::ClientContext ctx_;
  joule::v1::WorkerMessage hello_, heartbeat_;
  joule::v1::CoordinatorMessage in_;
  std::atomic<int64_t>* heard_;
  std::atomic<int>* interval_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false, done_ = false;
};

// 3. `workers` simulated idle workers, each on a connection of its own with the agent's
// keepalive (as each worker process has), registered and in a session with coordinator
// `c`, heartbeating at the interval the coordinator gives them. Prints the coordinator's
// CPU over `seconds`. Returns the workers that could not register or lost their session.
int MeasureLiveness(const Coordinator& c, int workers, int seconds) {
  struct Simulated {
    std::unique_ptr<joule::v1::WorkerService::Stub> stub;
    std::unique_ptr<SimulatedSession> session;
    // Heartbeats over UDP, when the coordinator offers them (as the worker's session
    // sends them: common/liveness_datagram.h): the worker's id, key and last seq.
    std::string worker_id, key;
    uint64_t seq = 0;
  };
  // One UDP socket sends every simulated worker's beats and reads the acks (the
  // coordinator answers each datagram's source).
  std::atomic<int> udp_port{0};
  const int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const int buffer = 8 << 20;
  setsockopt(udp, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  setsockopt(udp, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  inet_pton(AF_INET, c.address.substr(0, c.address.rfind(':')).c_str(), &to.sin_addr);
  std::vector<Simulated> sims(workers);
  // Set once a worker's session is open: heartbeats start while others still register.
  std::vector<std::atomic<SimulatedSession*>> open(workers);
  std::atomic<int64_t> heard{0};
  std::atomic<int> next{0}, failed{0}, interval_ms{0};
  std::vector<std::thread> registering;
  for (int t = 0; t < 16; ++t) {
    registering.emplace_back([&] {
      for (int w = next++; w < workers; w = next++) {
        grpc::ChannelArguments args;
        args.SetInt("joule.bench.worker", w);  // a channel (and connection) of its own
        args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kWorkerKeepaliveMs);
        args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kWorkerKeepaliveTimeoutMs);
        args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
        args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
        sims[w].stub = joule::v1::WorkerService::NewStub(
            grpc::CreateCustomChannel(c.address, grpc::InsecureChannelCredentials(), args));
        joule::v1::RegisterWorkerRequest reg;
        reg.set_host("sim-" + std::to_string(w));
        reg.set_device_kind(joule::v1::DEVICE_KIND_CPU);
        joule::v1::RegisterWorkerResponse r;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        if (grpc::Status s = sims[w].stub->RegisterWorker(&ctx, reg, &r); !s.ok()) {
          if (failed++ == 0) std::cerr << "register: " << s.error_message() << "\n";
          continue;
        }
        interval_ms = r.heartbeat_interval_ms();
        sims[w].worker_id = r.worker_id();
        sims[w].key = r.liveness_key();
        if (r.liveness_port() > 0) udp_port = r.liveness_port();
        sims[w].session = std::make_unique<SimulatedSession>(sims[w].stub.get(), r.worker_id(),
                                                             &heard, &interval_ms);
        open[w] = sims[w].session.get();
      }
    });
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> beats{0};
  std::atomic<int> lost{0};
  // Each worker heartbeats one interval (the newest the coordinator gave) after its last,
  // the first at a random point of the first interval, as independent workers do.
  std::thread beating([&] {
    std::mt19937 random(7);
    std::vector<std::optional<Clock::time_point>> next(workers);
    std::vector<bool> ended(workers, false);
    while (!stop) {
      const auto now = Clock::now();
      const auto period = std::chrono::milliseconds(std::max(100, interval_ms.load()));
      for (int w = 0; w < workers; ++w) {
        SimulatedSession* session = open[w];
        if (session == nullptr || ended[w]) continue;
        if (!next[w]) next[w] = now + period * (random() % 1000) / 1000;
        if (now < *next[w]) continue;
        if (udp_port > 0 && !sims[w].key.empty()) {
          if (session->done()) {  // the coordinator ended its session: it was lost
            ended[w] = true;
            ++lost;
            continue;
          }
          joule::v1::LivenessBeat beat;
          beat.set_worker_id(sims[w].worker_id);
          beat.set_seq(++sims[w].seq);
          beat.mutable_heartbeat()->set_unix_ms(1);
          const std::string datagram = joule::SealLivenessBeat(beat, sims[w].key);
          to.sin_port = htons(static_cast<uint16_t>(udp_port.load()));
          sendto(udp, datagram.data(), datagram.size(), 0, reinterpret_cast<sockaddr*>(&to),
                 sizeof(to));
        } else if (!session->Beat()) {
          ended[w] = true;
          ++lost;
          continue;
        }
        next[w] = now + period;
        ++beats;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::thread acks([&] {
    char datagram[2048];
    while (!stop) {
      pollfd p{udp, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      while (recv(udp, datagram, sizeof(datagram), MSG_DONTWAIT) > 0) ++heard;
    }
  });
  for (auto& t : registering) t.join();
  std::this_thread::sleep_for(std::chrono::seconds(3));  // settle
  const double cpu0 = CpuSeconds(c.pid);
  const int64_t beats0 = beats, heard0 = heard;
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  const double cpu = CpuSeconds(c.pid) - cpu0;
  const double wall = std::chrono::duration<double>(Clock::now() - w0).count();
  std::printf(
      "liveness: %d workers (%d failed to register, %d lost), heartbeats over %s every %d ms, "
      "keepalive ping every %d ms: %.0f heartbeats/s, %.0f messages heard/s; "
      "coordinator CPU %.3f s in %.1f s = %.2f%% of one core\n",
      workers, failed.load(), lost.load(), udp_port > 0 ? "UDP" : "the stream", interval_ms.load(),
      kWorkerKeepaliveMs, (beats - beats0) / wall, (heard - heard0) / wall, cpu, wall,
      100.0 * cpu / wall);
  stop = true;
  beating.join();
  acks.join();
  close(udp);
  for (auto& s : sims) {
    if (s.session) s.session->Cancel();
  }
  for (auto& s : sims) {
    if (s.session) s.session->WaitDone();
  }
  return failed + lost;
}

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
  int heartbeat_timeout_ms = 10000, max_heartbeats_per_second = 500;  // the coordinator's
  bool stream_heartbeats = false;
  app.add_flag("--stream-heartbeats", stream_heartbeats,
               "heartbeats on the workers' gRPC session streams (the coordinator's "
               "--liveness-udp off), not over UDP");
  app.add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms,
                 "the liveness coordinator's --heartbeat-timeout-ms")
      ->capture_default_str();
  app.add_option("--max-heartbeats-per-second", max_heartbeats_per_second,
                 "the liveness coordinator's --max-heartbeats-per-second")
      ->capture_default_str();
  bool skip_heartbeats = false;
  app.add_flag("--no-heartbeats", skip_heartbeats, "skip the heartbeat measurement");
  int history = 0;
  app.add_option("--history", history,
                 "only measure list pages over this many stored finished jobs (the store "
                 "must be empty)")
      ->check(CLI::Range(1000, 100'000'000));
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fs::temp_directory_path() / ("joule_load_" + std::to_string(getpid()));

  if (history > 0) return RunHistory(store, dir, history);

  // 1 and 2: durable submissions, then listing.
  std::printf("store: %s\n", store.empty() ? "sqlite (a new file)" : store.c_str());
  Coordinator c = StartCoordinator(dir / "submit", store);
  const int failures = MeasureSubmitsAndLists(c, jobs, clients);
  Stop(c);

  // 3. The liveness of many workers, on a fresh coordinator with no jobs.
  if (skip_heartbeats) {
    fs::remove_all(dir);
    return failures == 0 ? 0 : 1;
  }
  c = StartCoordinator(dir / "heartbeats", "",
                       {"--heartbeat-timeout-ms", std::to_string(heartbeat_timeout_ms),
                        "--max-heartbeats-per-second", std::to_string(max_heartbeats_per_second),
                        "--liveness-udp", stream_heartbeats ? "off" : "same"});
  const int lost = MeasureLiveness(c, workers, seconds);
  Stop(c);
  fs::remove_all(dir);
  return failures == 0 && lost == 0 ? 0 : 1;
}
