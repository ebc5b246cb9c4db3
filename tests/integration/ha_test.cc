// Standby coordinators on a real PostgreSQL (label `ha`): two joule-coordinator --ha
// processes share one store; the leader is killed (SIGKILL) or paused past its lease
// (SIGSTOP), and the standby must lead within a few leases while workers and clients that
// know both addresses follow it, every acknowledged submit stored exactly once.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#if JOULE_WITH_POSTGRESQL
#include <libpq-fe.h>
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "joule/v1/job.grpc.pb.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/netns_hosts.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/process.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/specs.h"

namespace joule::testing {
namespace {

#if JOULE_WITH_POSTGRESQL

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr int kLeaseMs = 1500;

std::unique_ptr<v1::JobService::Stub> StubTo(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials()) {
  return v1::JobService::NewStub(grpc::CreateChannel(address, creds));
}

// The last `n` lines of `text`.
std::string LastLines(const std::string& text, size_t n) {
  size_t from = text.size();
  for (size_t lines = 0; from > 0 && lines <= n;) {
    if (text[--from] == '\n') ++lines;
  }
  return text.substr(from == 0 ? 0 : from + 1);
}

// What one coordinator answers now: OK (it leads), or the standby's refusal with the
// leader it names.
struct Answer {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message, leader;
};
// With `creds` other than plain text, `token` is the client's bearer token.
Answer Ask(const std::string& address,
           std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials(),
           const std::string& token = "") {
  auto stub = StubTo(address, creds);
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(2));
  v1::ListWorkersResponse resp;
  const grpc::Status s = stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
  Answer a{s.error_code(), s.error_message(), ""};
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find("joule-leader"); it != trailers.end()) {
    a.leader.assign(it->second.data(), it->second.size());
  }
  return a;
}

// Polls `address` for job `id` (every 100 ms) until `done` or `timeout`; the last seen.
v1::Job WaitForJob(const std::string& address, int64_t id, milliseconds timeout,
                   const std::function<bool(const v1::Job&)>& done) {
  const auto end = Clock::now() + timeout;
  v1::Job job;
  while (Clock::now() < end) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    v1::GetJobRequest get;
    get.set_job_id(id);
    if (StubTo(address)->GetJob(&ctx, get, &job).ok() && done(job)) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return job;
}

// Job `id` as the store holds it now (what a coordinator starting now would read), or an
// empty job when it cannot be read: the record column the PostgreSQL store writes.
v1::Job StoredJob(const std::string& uri, int64_t id) {
  v1::Job job;
  PGconn* conn = PQconnectdb(uri.c_str());
  if (PQstatus(conn) == CONNECTION_OK) {
    const std::string id_text = std::to_string(id);
    const char* params[] = {id_text.c_str()};
    PGresult* r = PQexecParams(conn, "SELECT record FROM jobs WHERE id = $1", 1, nullptr, params,
                               nullptr, nullptr, /*resultFormat=binary*/ 1);
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
        !job.ParseFromArray(PQgetvalue(r, 0, 0), PQgetlength(r, 0, 0))) {
      job.Clear();
    }
    PQclear(r);
  }
  PQfinish(conn);
  return job;
}

// The leadership lease as the store holds it: its epoch and expiry (ms since the epoch, the
// server's clock); zeros when it cannot be read.
struct StoredLease {
  int64_t epoch = 0;
  int64_t expires_ms = 0;
};
StoredLease ReadLease(const std::string& uri) {
  StoredLease lease;
  PGconn* conn = PQconnectdb(uri.c_str());
  if (PQstatus(conn) == CONNECTION_OK) {
    PGresult* r = PQexec(conn, "SELECT epoch, expires_ms FROM joule_leader WHERE id = 1");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
      (void)absl::SimpleAtoi(PQgetvalue(r, 0, 0), &lease.epoch);
      (void)absl::SimpleAtoi(PQgetvalue(r, 0, 1), &lease.expires_ms);
    }
    PQclear(r);
  }
  PQfinish(conn);
  return lease;
}

// Starts a coordinator with `argv` (its output to `log`, --address-file `addr_file`) and
// waits up to 20 s for the address it bound; "" (with a failure naming its log) if none.
std::string LaunchCoordinator(const std::vector<std::string>& argv, const std::string& addr_file,
                              const std::filesystem::path& log,
                              std::unique_ptr<ChildProcess>* process) {
  *process = std::make_unique<ChildProcess>(argv, log.string());
  const auto end = Clock::now() + seconds(20);
  std::string address;
  while (Clock::now() < end && (*process)->running()) {
    address = Slurp(addr_file);
    if (!address.empty() && address.back() == '\n') break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  address = address.substr(0, address.find('\n'));
  EXPECT_FALSE(address.empty()) << Slurp(log);
  return address;
}

// Job `job_id`'s log at `address`, read once the log says every line is stored (its state
// terminal): each rank's lines of the failover's gap ("session with ...") and rank 0's last
// epoch line are there, the latter once.
void ExpectLogThroughTheGap(const std::string& address, int64_t job_id) {
  v1::GetJobLogResponse log;
  const auto log_by = Clock::now() + seconds(30);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    v1::GetJobLogRequest req;
    req.set_job_id(job_id);
    req.set_rank(-1);
    req.set_limit(10000);
    ASSERT_TRUE(StubTo(address)->GetJobLog(&ctx, req, &log).ok());
    if (log.state() == v1::JOB_STATE_SUCCEEDED || Clock::now() >= log_by) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_EQ(log.state(), v1::JOB_STATE_SUCCEEDED) << "the log's lines were never all stored";
  std::map<int, int> gap_lines, last_epoch_lines;
  for (const v1::LogLine& l : log.lines()) {
    if (absl::StrContains(l.text(), "session with")) ++gap_lines[l.rank()];
    if (absl::StrContains(l.text(), "epoch 3/3")) ++last_epoch_lines[l.rank()];
  }
  EXPECT_GE(gap_lines[0], 1) << log.DebugString();
  EXPECT_GE(gap_lines[1], 1) << log.DebugString();
  EXPECT_EQ(last_epoch_lines[0], 1) << log.DebugString();
}

// How many stored jobs carry each request id, over every page of ListJobs.
std::map<std::string, int> StoredRequests(const std::string& address) {
  std::map<std::string, int> stored;
  int64_t before = 0;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    v1::ListJobsRequest list;
    list.set_page_size(500);
    list.set_before_id(before);
    v1::ListJobsResponse page;
    const grpc::Status s = StubTo(address)->ListJobs(&ctx, list, &page);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) break;
    for (const v1::Job& j : page.jobs()) {
      ++stored[j.request_id()];
      before = j.id();
    }
    if (page.jobs_size() < 500) break;
  }
  return stored;
}

class HaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    bool skip = false;
    pg_ = PostgresServer::Start(&why, &skip);
    if (skip) GTEST_SKIP() << why;
    ASSERT_NE(pg_, nullptr) << why;
    uri_ = pg_->CreateDatabase("ha", &why);
    ASSERT_FALSE(uri_.empty()) << why;
  }

  // Starts coordinator `i` (--ha, its own port) and returns its address.
  std::string StartCoordinator(int i, const std::string& metrics_listen = "") {
    const std::string addr_file = (dir_ / ("addr-" + std::to_string(i))).string();
    return LaunchCoordinator(
        {ProgramPath("joule-coordinator"), "--ha", "--store", uri_, "--listen", "127.0.0.1:0",
         "--insecure", "--lease-ms", std::to_string(kLeaseMs), "--heartbeat-timeout-ms", "4000",
         "--address-file", addr_file, "--metrics-listen", metrics_listen},
        addr_file, dir_ / ("coordinator-" + std::to_string(i) + ".log"), &coordinators_[i]);
  }

  // Waits until exactly one of `addresses` leads and the others name it; its index, or -1.
  int WaitForLeader(const std::vector<std::string>& addresses, milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    std::vector<Answer> last;
    while (Clock::now() < end) {
      int leader = -1, standbys = 0;
      std::vector<Answer> answers;
      for (const auto& a : addresses) answers.push_back(Ask(a));
      for (size_t i = 0; i < answers.size(); ++i) {
        if (answers[i].code == grpc::StatusCode::OK)
          leader = leader == -1 ? static_cast<int>(i) : -2;
      }
      if (leader >= 0) {
        for (size_t i = 0; i < answers.size(); ++i) {
          if (static_cast<int>(i) != leader && answers[i].leader == addresses[leader]) ++standbys;
        }
        if (standbys + 1 == static_cast<int>(addresses.size())) return leader;
      }
      last = std::move(answers);
      std::this_thread::sleep_for(milliseconds(50));
    }
    // What each one answered last, and how its log ends: a CI failure must say why.
    for (size_t i = 0; i < last.size(); ++i) {
      std::cout << "coordinator " << i << " at " << addresses[i] << " answered code "
                << static_cast<int>(last[i].code) << " \"" << last[i].message << "\" naming \""
                << last[i].leader << "\"; its log ends:\n"
                << LastLines(Slurp(dir_ / ("coordinator-" + std::to_string(i) + ".log")), 25);
    }
    return -1;
  }

  // Two coordinators, each serving /metrics on a port of its own (*ports, in order).
  void StartPairWithMetrics(std::vector<int>* ports, std::vector<std::string>* addresses) {
    *ports = {FreeLoopbackPort(), FreeLoopbackPort()};
    ASSERT_TRUE((*ports)[0] > 0 && (*ports)[1] > 0 && (*ports)[0] != (*ports)[1]);
    *addresses = {StartCoordinator(0, "127.0.0.1:" + std::to_string((*ports)[0])),
                  StartCoordinator(1, "127.0.0.1:" + std::to_string((*ports)[1]))};
  }

  std::vector<std::string> StartPair() {
    std::vector<std::string> addresses = {StartCoordinator(0), StartCoordinator(1)};
    addresses_csv_ = addresses[0] + "," + addresses[1];
    return addresses;
  }

  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      workers_.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{ProgramPath("joule-worker"), "--coordinator", addresses_csv_,
                                   "--insecure", "--threads", "1", "--checkpoint-root",
                                   (dir_ / "ckpt").string()},
          (dir_ / ("worker-" + std::to_string(i) + ".log")).string()));
    }
  }

  ScratchDir dir_{"joule_ha_"};
  std::unique_ptr<PostgresServer> pg_;
  std::string uri_, addresses_csv_;
  std::map<int, std::unique_ptr<ChildProcess>> coordinators_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

// A client that submits with request ids to whichever coordinator leads, noting which
// submits were acknowledged.
struct Submitter {
  std::vector<std::string> addresses;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::set<std::string> acknowledged;
  int attempts = 0;

  void Run() {
    int n = 0;
    while (!stop) {
      v1::SubmitJobRequest req;
      *req.mutable_spec() = SmallMlpSpec(1);
      req.mutable_spec()->set_name("queued");
      req.mutable_spec()->set_priority(-100);  // never ahead of the test's job
      req.set_request_id("sub-" + std::to_string(n++));
      // Each request until some coordinator acknowledges it (or the test ends): the same
      // request id at every try, as `joule submit` retries.
      bool done = false;
      while (!done && !stop) {
        for (const auto& a : addresses) {
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + seconds(3));
          v1::SubmitJobResponse resp;
          ++attempts;
          if (StubTo(a)->SubmitJob(&ctx, req, &resp).ok()) {
            std::lock_guard<std::mutex> lock(mu);
            acknowledged.insert(req.request_id());
            done = true;
            break;
          }
        }
        if (!done) std::this_thread::sleep_for(milliseconds(50));
      }
    }
  }
};

TEST_F(HaTest, TheStandbyLeadsWhenTheLeaderIsKilledAndNoAcknowledgedSubmitIsLost) {
  const std::vector<std::string> addresses = StartPair();
  const int leader = WaitForLeader(addresses, seconds(30));
  ASSERT_GE(leader, 0) << "no single leader";
  const int standby = 1 - leader;
  const Answer refused = Ask(addresses[standby]);
  EXPECT_EQ(refused.code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StrContains(refused.message,
                                "standby coordinator: the leader is at " + addresses[leader]))
      << refused.message;
  StartWorkers(2);
  // A job that runs through the failover.
  v1::SubmitJobRequest req;
  *req.mutable_spec() = SmallMlpSpec(2);
  req.mutable_spec()->set_epochs(3);
  req.mutable_spec()->set_priority(10);
  req.set_request_id("the-job");
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    ASSERT_TRUE(StubTo(addresses[leader])->SubmitJob(&ctx, req, &submitted).ok());
  }
  const int64_t job_id = submitted.job_id();
  Submitter client;
  client.addresses = addresses;
  std::thread submits([&] { client.Run(); });
  // Running, with progress.
  v1::Job job = WaitForJob(addresses[leader], job_id, seconds(60), [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_RUNNING && j.progress().step() > 0;
  });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.DebugString();
  // ... and stored so: the standby adopts only an attempt its store shows past the
  // rendezvous (the leader writes the progress it hears a moment later).
  const auto stored_by = Clock::now() + seconds(30);
  v1::Job stored_job = StoredJob(uri_, job_id);
  while (Clock::now() < stored_by && stored_job.progress().step() == 0) {
    std::this_thread::sleep_for(milliseconds(20));
    stored_job = StoredJob(uri_, job_id);
  }
  ASSERT_GT(stored_job.progress().step(), 0) << stored_job.DebugString();
  ASSERT_EQ(stored_job.attempt(), 1) << stored_job.DebugString();

  const auto killed_at = Clock::now();
  coordinators_[leader]->Signal(SIGKILL);
  coordinators_[leader]->Wait(seconds(5));
  // The standby leads within a few leases.
  Answer now;
  while (Clock::now() - killed_at < seconds(30)) {
    now = Ask(addresses[standby]);
    if (now.code == grpc::StatusCode::OK) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  const auto failover = std::chrono::duration_cast<milliseconds>(Clock::now() - killed_at);
  ASSERT_EQ(now.code, grpc::StatusCode::OK) << now.message;
  EXPECT_LT(failover, milliseconds(6 * kLeaseMs)) << failover.count() << " ms";
  std::cerr << "failover: a new leader " << failover.count() << " ms after SIGKILL\n";

  // The job finishes under the new leader, its workers having followed it.
  job = WaitForJob(addresses[standby], job_id, seconds(180), [](const v1::Job& j) {
    return j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED;
  });
  client.stop = true;
  submits.join();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();
  // Adopted: the attempt the old leader started went on, none redone.
  EXPECT_EQ(job.attempt(), 1) << job.DebugString();
  EXPECT_EQ(job.result().attempts_size(), 1);
  // Its energy report has both ranks' results, over the attempt's whole wall time.
  EXPECT_EQ(job.result().ranks_size(), 2);
  EXPECT_EQ(job.result().energy().ranks_reported(), 2);
  EXPECT_GT(job.result().energy().total_joules(), 0);
  EXPECT_GT(job.result().attempts(0).wall_seconds(), 0);
  std::cerr << "the job ended " << v1::JobState_Name(job.state()) << " in attempt " << job.attempt()
            << ", " << job.progress().step() << " steps\n";
  // Its log lost nothing to the gap: the lines each rank logged while no coordinator
  // listened (its session's end) were kept and sent to the new leader, with the rest.
  ExpectLogThroughTheGap(addresses[standby], job_id);

  // Every acknowledged submit is stored, each request once.
  std::map<std::string, int> stored = StoredRequests(addresses[standby]);
  EXPECT_GT(client.acknowledged.size(), 3u);
  // Stored scoped to the client ("anonymous/" without tokens).
  for (const std::string& r : client.acknowledged) EXPECT_EQ(stored["anonymous/" + r], 1) << r;
  for (const auto& [r, n] : stored) EXPECT_EQ(n, 1) << r;
  std::cerr << client.acknowledged.size() << " submits acknowledged in " << client.attempts
            << " tries; " << stored.size() << " jobs stored\n";
}

// The password of the store's role from a file (a container's secret): the coordinator
// serves; a wrong password, or the flag with a SQLite store, ends it with one line that
// never shows the password.
TEST_F(HaTest, TheStorePasswordComesFromAFileAndAWrongOneIsAOneLineError) {
  const std::string uri =
      "postgresql://joule@127.0.0.1:" + std::to_string(pg_->port()) + "/ha";  // no passfile
  const std::string good = (dir_ / "password").string(), bad = (dir_ / "wrong").string();
  std::ofstream(good) << PostgresServer::password() << "\n";
  std::ofstream(bad) << "not-the-password-41c7\n";
  std::unique_ptr<ChildProcess> serving;
  const std::string addr_file = (dir_ / "addr-pw").string();
  const std::string address = LaunchCoordinator(
      {ProgramPath("joule-coordinator"), "--store", uri, "--store-password-file", good, "--listen",
       "127.0.0.1:0", "--insecure", "--address-file", addr_file, "--metrics-listen", ""},
      addr_file, dir_ / "coordinator-pw.log", &serving);
  ASSERT_FALSE(address.empty());
  EXPECT_EQ(Ask(address).code, grpc::StatusCode::OK) << Slurp(dir_ / "coordinator-pw.log");
  serving.reset();

  struct Case {
    std::string store, file, expect;
    int code;
  };
  for (const Case& c :
       {Case{uri, bad, "password authentication failed", 1},
        Case{uri, (dir_ / "absent").string(), "absent", 2},
        Case{"sqlite:" + (dir_ / "jobs.db").string(), good, "needs a PostgreSQL --store", 2}}) {
    const std::filesystem::path log = dir_ / "coordinator-refused.log";
    ChildProcess refused(
        {ProgramPath("joule-coordinator"), "--store", c.store, "--store-password-file", c.file,
         "--listen", "127.0.0.1:0", "--insecure", "--metrics-listen", ""},
        log.string());
    const int status = refused.Wait(seconds(30));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == c.code)
        << c.expect << ": wait status " << status;
    const std::string text = Slurp(log);
    EXPECT_TRUE(absl::StrContains(text, c.expect)) << text;
    EXPECT_FALSE(absl::StrContains(text, "not-the-password-41c7")) << text;
    EXPECT_FALSE(absl::StrContains(text, PostgresServer::password())) << text;
  }
}

// The value of the unlabelled series `name` in a /metrics text; -1 when absent.
double SeriesValue(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, name + " ")) {
      double v = -1;
      if (absl::SimpleAtod(line.substr(name.size() + 1), &v)) return v;
    }
  }
  return -1;
}

// Each coordinator's /metrics says whether it leads (the leader's and a standby's, on
// their fixed --metrics-listen ports), and the standby's port serves the new leadership
// once it takes over.
TEST_F(HaTest, EachCoordinatorsMetricsSayWhetherItLeads) {
  std::vector<int> ports;
  std::vector<std::string> addresses;
  ASSERT_NO_FATAL_FAILURE(StartPairWithMetrics(&ports, &addresses));
  const int leader = WaitForLeader(addresses, seconds(30));
  ASSERT_GE(leader, 0) << "no single leader";
  const int standby = 1 - leader;
  const auto metrics = [&](int i) {
    return HttpGet("http://127.0.0.1:" + std::to_string(ports[i]) + "/metrics");
  };
  // The standby learns the epoch at its next campaign (every third of the lease).
  std::string led, stood;
  const auto by = Clock::now() + seconds(10);
  do {
    led = metrics(leader);
    stood = metrics(standby);
    if (SeriesValue(stood, "joule_coordinator_lease_epoch") > 0) break;
    std::this_thread::sleep_for(milliseconds(100));
  } while (Clock::now() < by);
  const double epoch = SeriesValue(led, "joule_coordinator_lease_epoch");
  EXPECT_EQ(SeriesValue(led, "joule_coordinator_leading"), 1) << led;
  EXPECT_GT(epoch, 0) << led;
  EXPECT_EQ(SeriesValue(stood, "joule_coordinator_leading"), 0) << stood;
  EXPECT_EQ(SeriesValue(stood, "joule_coordinator_lease_epoch"), epoch) << stood;
  EXPECT_TRUE(absl::StrContains(stood, "joule_build_info{")) << stood;
  // Readiness: only the leader is ready (a standby's /ready is 503, which HttpGet reads as
  // no answer).
  EXPECT_EQ(HttpGet("http://127.0.0.1:" + std::to_string(ports[leader]) + "/ready"), "leading\n");
  EXPECT_EQ(HttpGet("http://127.0.0.1:" + std::to_string(ports[standby]) + "/ready"), "");

  coordinators_[leader]->Signal(SIGKILL);
  coordinators_[leader]->Wait(seconds(10));
  std::string after;
  const auto takeover_by = Clock::now() + seconds(30);
  do {
    after = metrics(standby);
    if (SeriesValue(after, "joule_coordinator_leading") == 1) break;
    std::this_thread::sleep_for(milliseconds(100));
  } while (Clock::now() < takeover_by);
  EXPECT_EQ(SeriesValue(after, "joule_coordinator_leading"), 1) << after;
  EXPECT_GT(SeriesValue(after, "joule_coordinator_lease_epoch"), epoch) << after;
}

// A standby that Prometheus scrapes over a kept-alive connection takes over and keeps the
// lease it won. (Its server's stop, which hands the ports to the leader's, waited out the
// connection's keep-alive before the first renewal: in the containers test the new leader
// stepped down at once, and the workers' re-attach window ran out meanwhile.)
TEST_F(HaTest, AStandbyScrapedOverAKeptAliveConnectionKeepsTheLeaseItWins) {
  std::vector<int> ports;
  std::vector<std::string> addresses;
  ASSERT_NO_FATAL_FAILURE(StartPairWithMetrics(&ports, &addresses));
  const int leader = WaitForLeader(addresses, seconds(30));
  ASSERT_GE(leader, 0) << "no single leader";
  const int standby = 1 - leader;
  const int64_t old_epoch = ReadLease(uri_).epoch;
  ASSERT_GT(old_epoch, 0);
  KeptAliveConnection scrape(ports[standby], "/metrics");
  ASSERT_TRUE(scrape.ok());

  coordinators_[leader]->Signal(SIGKILL);
  coordinators_[leader]->Wait(seconds(10));
  // The first epoch after the old one, then three renewals of it (the expiry moves on).
  StoredLease won;
  int renewals = 0;
  const auto by = Clock::now() + seconds(30);
  while (Clock::now() < by && renewals < 3) {
    const StoredLease now = ReadLease(uri_);
    if (won.epoch == 0 && now.epoch > old_epoch) {
      won = now;
    } else if (won.epoch != 0 && (now.epoch != won.epoch || now.expires_ms > won.expires_ms)) {
      if (now.epoch != won.epoch) break;
      won.expires_ms = now.expires_ms;
      ++renewals;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(renewals, 3) << "the epoch won: " << won.epoch;
  // It serves (once its standby server has handed the port over), in the epoch it won.
  while (Clock::now() < by && Ask(addresses[standby]).code != grpc::StatusCode::OK) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(Ask(addresses[standby]).code, grpc::StatusCode::OK);
  EXPECT_EQ(ReadLease(uri_).epoch, won.epoch);
  const std::string log = Slurp(dir_ / ("coordinator-" + std::to_string(standby) + ".log"));
  EXPECT_FALSE(absl::StrContains(log, "stepped down from epoch")) << log;
}

// A coordinator that wins the lease but cannot serve (here its --liveness-udp port is
// another socket's) steps down and waits out a lease, doubling while it keeps failing,
// so that a standby that can serve leads, and stays leading.
TEST_F(HaTest, ACoordinatorThatCannotServeLetsAStandbyThatCanLead) {
  const int udp = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(udp, 0);
  struct CloseOnExit {
    int fd;
    ~CloseOnExit() { close(fd); }
  } close_udp{udp};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(udp, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(getsockname(udp, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string taken = std::to_string(ntohs(a.sin_port));
  std::vector<std::string> addresses;
  {
    const std::string addr_file = (dir_ / "addr-0").string();
    addresses.push_back(LaunchCoordinator(
        {ProgramPath("joule-coordinator"), "--ha", "--store", uri_, "--listen", "127.0.0.1:0",
         "--insecure", "--lease-ms", std::to_string(kLeaseMs), "--liveness-udp", taken,
         "--address-file", addr_file, "--metrics-listen", ""},
        addr_file, dir_ / "coordinator-0.log", &coordinators_[0]));
  }
  // The first one has won and failed at least once before the second starts.
  const auto by = Clock::now() + seconds(20);
  while (Clock::now() < by &&
         !absl::StrContains(Slurp(dir_ / "coordinator-0.log"), "failed start(s) in a row")) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_TRUE(absl::StrContains(Slurp(dir_ / "coordinator-0.log"), "1 failed start(s) in a row"))
      << Slurp(dir_ / "coordinator-0.log");
  addresses.push_back(StartCoordinator(1));
  EXPECT_EQ(WaitForLeader(addresses, seconds(4 * kLeaseMs / 1000 + 2)), 1);
  // Leading for three leases more, never stepping down.
  const auto hold_until = Clock::now() + milliseconds(3 * kLeaseMs);
  while (Clock::now() < hold_until) {
    ASSERT_EQ(Ask(addresses[1]).code, grpc::StatusCode::OK);
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_FALSE(absl::StrContains(Slurp(dir_ / "coordinator-1.log"), "stepped down"));
  // Coordinator 0 stands by, serving its port and naming the leader.
  const Answer standby = Ask(addresses[0]);
  EXPECT_EQ(standby.code, grpc::StatusCode::UNAVAILABLE) << standby.message;
  EXPECT_EQ(standby.leader, addresses[1]) << standby.message;
}

TEST_F(HaTest, ALeaderPausedPastItsLeaseIsFencedAndStandsBy) {
  const std::vector<std::string> addresses = StartPair();
  const int leader = WaitForLeader(addresses, seconds(30));
  ASSERT_GE(leader, 0) << "no single leader";
  const int standby = 1 - leader;
  coordinators_[leader]->Signal(SIGSTOP);
  const auto paused_at = Clock::now();
  while (Clock::now() - paused_at < seconds(30) &&
         Ask(addresses[standby]).code != grpc::StatusCode::OK) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_EQ(Ask(addresses[standby]).code, grpc::StatusCode::OK);
  coordinators_[leader]->Signal(SIGCONT);
  // Back from the pause, it steps down and names the new leader.
  EXPECT_EQ(WaitForLeader(addresses, seconds(30)), standby);
  const std::string log = Slurp(dir_ / ("coordinator-" + std::to_string(leader) + ".log"));
  EXPECT_TRUE(absl::StrContains(log, "stepped down from epoch")) << log;
}

TEST_F(HaTest, WhileTheStoreIsDownSubmitsFailAndAfterItTheySucceed) {
  const std::vector<std::string> addresses = StartPair();
  ASSERT_GE(WaitForLeader(addresses, seconds(30)), 0);
  ASSERT_TRUE(pg_->Stop());
  v1::SubmitJobRequest req;
  *req.mutable_spec() = SmallMlpSpec(1);
  req.set_request_id("during");
  bool acknowledged_while_down = false;
  for (const auto& a : addresses) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(8));
    v1::SubmitJobResponse resp;
    const grpc::Status s = StubTo(a)->SubmitJob(&ctx, req, &resp);
    if (s.ok())
      acknowledged_while_down = true;
    else
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  EXPECT_FALSE(acknowledged_while_down);
  ASSERT_TRUE(pg_->Restart());
  const int leader = WaitForLeader(addresses, seconds(30));
  ASSERT_GE(leader, 0);
  req.set_request_id("after");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  v1::SubmitJobResponse resp;
  const grpc::Status s = StubTo(addresses[leader])->SubmitJob(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// A coordinator started before its store (compose and Kubernetes start them in any
// order) stands by, saying why, and leads once the store answers; a submit then succeeds.
TEST_F(HaTest, ACoordinatorStartedBeforeItsStoreStandsByUntilTheStoreAnswersThenLeads) {
  ASSERT_TRUE(pg_->Stop());
  const std::string address = StartCoordinator(0);
  ASSERT_FALSE(address.empty());
  // Several tries (a third of the lease apart) fail while the store is down; the process
  // stays up and answers each call with the reason.
  const auto until = Clock::now() + milliseconds(3 * kLeaseMs);
  Answer down;
  while (Clock::now() < until) {
    down = Ask(address);
    ASSERT_EQ(down.code, grpc::StatusCode::UNAVAILABLE) << down.message;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(absl::StrContains(down.message, "job store unreachable")) << down.message;
  ASSERT_TRUE(coordinators_[0]->running()) << Slurp(dir_ / "coordinator-0.log");
  ASSERT_TRUE(pg_->Restart());
  ASSERT_EQ(WaitForLeader({address}, seconds(30)), 0) << Slurp(dir_ / "coordinator-0.log");
  v1::SubmitJobRequest req;
  *req.mutable_spec() = SmallMlpSpec(1);
  req.set_request_id("after-the-store-came-up");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  v1::SubmitJobResponse resp;
  const grpc::Status s = StubTo(address)->SubmitJob(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  // A repeated error is logged once (a minute apart at most), not at every try (about 9
  // while the store was down): consecutive warnings differ (a refused connection, then
  // "the database system is starting up").
  const std::string log = Slurp(dir_ / "coordinator-0.log");
  std::vector<std::string> warnings;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    const size_t at = line.find("job store unreachable: ");
    if (at != absl::string_view::npos && absl::StrContains(line, "standing by until it answers")) {
      warnings.emplace_back(line.substr(at));
    }
  }
  EXPECT_GE(warnings.size(), 1u) << log;
  for (size_t i = 1; i < warnings.size(); ++i) EXPECT_NE(warnings[i], warnings[i - 1]) << log;
  EXPECT_TRUE(absl::StrContains(log, "answers: campaigning")) << log;
}

// The store on test host 1, the coordinators on hosts 2 and 3 (TLS and tokens: off
// loopback), the test in the root namespace reaching all three.
class HaPartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hosts_ = std::make_unique<NetnsHosts>(3, dir_ / "hosts.log");
    if (!hosts_->ready()) {
      if (!hosts_->skip_reason().empty()) GTEST_SKIP() << hosts_->skip_reason();
      FAIL() << "the test hosts did not come up:\n" << hosts_->log();
    }
    std::string why;
    bool skip = false;
    pg_ = PostgresServer::Start(&why, &skip, {hosts_->Prefix(1), hosts_->Address(1)});
    if (skip) GTEST_SKIP() << why;
    ASSERT_NE(pg_, nullptr) << why;
    uri_ = pg_->CreateDatabase("ha", &why);
    ASSERT_FALSE(uri_.empty()) << why;
    std::string out;
    ASSERT_TRUE(MakeSelfSignedCertificate((dir_ / "key.pem").string(), (dir_ / "cert.pem").string(),
                                          {hosts_->Address(2), hosts_->Address(3)}, &out))
        << out;
    std::ofstream(dir_ / "clients") << "tester s3cret-tester\n";
    std::ofstream(dir_ / "join") << "join-me\n";
    grpc::SslCredentialsOptions ssl;
    std::ifstream cert(dir_ / "cert.pem");
    ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(cert), {});
    creds_ = grpc::SslCredentials(ssl);
  }
  void TearDown() override {
    coordinators_.clear();
    pg_.reset();
    hosts_.reset();  // its namespaces, after what ran in them
  }

  // Starts a coordinator on test host `host`; returns its address.
  std::string StartCoordinator(int host) {
    const std::string addr_file = (dir_ / ("addr-" + std::to_string(host))).string();
    std::vector<std::string> argv = hosts_->Prefix(host);
    for (const std::string& a : {ProgramPath("joule-coordinator"),
                                 std::string("--ha"),
                                 std::string("--store"),
                                 uri_,
                                 std::string("--listen"),
                                 hosts_->Address(host) + ":0",
                                 std::string("--tls-cert"),
                                 (dir_ / "cert.pem").string(),
                                 std::string("--tls-key"),
                                 (dir_ / "key.pem").string(),
                                 std::string("--client-tokens-file"),
                                 (dir_ / "clients").string(),
                                 std::string("--join-token-file"),
                                 (dir_ / "join").string(),
                                 std::string("--lease-ms"),
                                 std::to_string(kLeaseMs),
                                 std::string("--address-file"),
                                 addr_file,
                                 std::string("--metrics-listen"),
                                 std::string("")}) {
      argv.push_back(a);
    }
    return LaunchCoordinator(argv, addr_file,
                             dir_ / ("coordinator-" + std::to_string(host) + ".log"),
                             &coordinators_[host]);
  }
  Answer AskHost(const std::string& address) { return Ask(address, creds_, "s3cret-tester"); }
  std::string Log(int host) {
    return Slurp(dir_ / ("coordinator-" + std::to_string(host) + ".log"));
  }

  ScratchDir dir_{"joule_ha_partition_"};
  std::unique_ptr<NetnsHosts> hosts_;
  std::unique_ptr<PostgresServer> pg_;
  std::string uri_;
  std::shared_ptr<grpc::ChannelCredentials> creds_;
  std::map<int, std::unique_ptr<ChildProcess>> coordinators_;
};

// The leader's host loses the store (every packet between them dropped, nothing refused):
// it steps down within its lease, the standby leads, and back on the network the old
// leader stands by naming the new one.
TEST_F(HaPartitionTest, ALeaderCutOffFromTheStoreStepsDownAndTheStandbyLeads) {
  const std::string a = StartCoordinator(2);
  // Host 2 leads first: the standby starts once it does.
  const auto end = Clock::now() + seconds(30);
  while (Clock::now() < end && AskHost(a).code != grpc::StatusCode::OK) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_EQ(AskHost(a).code, grpc::StatusCode::OK) << Log(2);
  const std::string b = StartCoordinator(3);
  Answer standby;
  while (Clock::now() < end && (standby = AskHost(b)).leader != a) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_EQ(standby.leader, a) << standby.message;

  if (absl::Status cut = hosts_->Partition(2); !cut.ok()) {
    if (absl::StrContains(cut.message(), "needs iptables")) GTEST_SKIP() << cut.message();
    FAIL() << cut.message();
  }
  const auto cut_at = Clock::now();
  Answer now;
  while (Clock::now() - cut_at < seconds(30)) {
    now = AskHost(b);
    if (now.code == grpc::StatusCode::OK) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  const auto failover = std::chrono::duration_cast<milliseconds>(Clock::now() - cut_at);
  ASSERT_EQ(now.code, grpc::StatusCode::OK) << now.message << "\n" << Log(3);
  std::cerr << "partition: the standby leads " << failover.count() << " ms after the cut\n";
  // No two leaders: the cut-off one stopped serving before the standby could lead.
  EXPECT_NE(AskHost(a).code, grpc::StatusCode::OK) << "two leaders at once";
  // The cut-off leader serves nothing: it stepped down on its own clock.
  while (Clock::now() - cut_at < seconds(30) &&
         !absl::StrContains(Log(2), "stepped down from epoch")) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(absl::StrContains(Log(2), "stepped down from epoch")) << Log(2);
  EXPECT_NE(AskHost(a).code, grpc::StatusCode::OK);

  ASSERT_TRUE(hosts_->Heal(2).ok());
  Answer back;
  while (Clock::now() - cut_at < seconds(60) && (back = AskHost(a)).leader != b) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(back.code, grpc::StatusCode::UNAVAILABLE) << back.message;
  EXPECT_EQ(back.leader, b) << back.message;
  EXPECT_EQ(AskHost(b).code, grpc::StatusCode::OK);
}

#else
TEST(HaTest, NeedsPostgreSQL) { GTEST_SKIP() << "built without PostgreSQL (libpq-dev)"; }
#endif  // JOULE_WITH_POSTGRESQL

}  // namespace
}  // namespace joule::testing
