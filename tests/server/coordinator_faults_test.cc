// The coordinator under faults and across attempts: a job store that cannot write, a
// graceful stop, a restart, clocks that step, late and missing rank results, and the
// energy account that every attempt adds to.
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "common/json_output.h"
#include "server/coordinator.h"
#include "server/job_store.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_session_sink.h"
#include "tests/testing/specs.h"
#include "tests/testing/sqlite_write_lock.h"
#include "tests/testing/temp_cleanup.h"

namespace joule::server {
namespace {

const auto* const kFaultsCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_faults_"));

using joule::testing::FakeSessionSink;
using joule::testing::FakeClock;
using std::chrono::milliseconds;

v1::JobSpec FaultsSpec(int workers) {
  v1::JobSpec s = joule::testing::SmallMlpSpec(workers);
  s.set_name("faults");
  return s;
}

std::string TempDb() {
  static int n = 0;
  auto dir = std::filesystem::temp_directory_path() /
             ("joule_faults_" + std::to_string(getpid()) + "_" + std::to_string(n++));
  std::filesystem::create_directories(dir);
  return (dir / "jobs.db").string();
}

// What one rank reports.
struct RankReport {
  bool ok = true;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string error = "";
  int64_t steps = 0, resumed_from = 0, samples = 0;
  double joules = 10;
  std::string source = "rapl";
  bool metered = true;
  std::string hash = "0a1b2c3d";
};

class Harness {
 public:
  explicit Harness(CoordinatorOptions options) {
    options.heartbeat_timeout = std::chrono::hours(24);  // the fake clock jumps
    options.clock = &clock;
    auto c = Coordinator::Create(options);
    EXPECT_TRUE(c.ok()) << c.status();
    c_ = *std::move(c);
  }
  Coordinator& c() { return *c_; }
  void Reset() { c_.reset(); }

  std::string AddWorker() {
    v1::RegisterWorkerRequest req;
    req.set_host("test");
    std::string id = c_->RegisterWorker(req)->worker_id();
    sinks[id] = std::make_shared<FakeSessionSink>();
    EXPECT_TRUE(c_->OpenSession(id, sinks[id]).ok());
    return id;
  }
  v1::Assignment Last(const std::string& worker) {
    v1::Assignment last;
    for (const auto& m : sinks[worker]->sent()) {
      if (m.has_assignment()) last = m.assignment();
    }
    return last;
  }
  // The worker whose newest assignment is of job `id`.
  std::string WorkerOf(int64_t id) {
    for (auto& [w, sink] : sinks) {
      if (Last(w).job_id() == id) return w;
    }
    ADD_FAILURE() << "no worker runs job " << id;
    return "";
  }
  void Report(const std::string& worker, const v1::Assignment& a, const RankReport& r) {
    v1::WorkerMessage m;
    m.mutable_result()->set_job_id(a.job_id());
    m.mutable_result()->set_attempt(a.attempt());
    v1::RankResult* rr = m.mutable_result()->mutable_result();
    rr->set_rank(a.rank());
    rr->set_ok(r.ok);
    rr->set_error(r.error);
    rr->set_error_code(static_cast<int>(r.code));
    rr->set_steps(r.steps);
    rr->set_resumed_from_step(r.resumed_from);
    rr->set_samples(r.samples);
    rr->set_devices(1);
    rr->set_parameter_hash(r.hash);
    if (r.metered) {
      v1::EnergyRecord* e = rr->add_energy();
      e->set_device("cpu-package-0");
      e->set_source(r.source);
      e->set_phase("forward");
      e->set_joules(r.joules);
    }
    c_->OnWorkerMessage(worker, m);
  }
  v1::Job Get(int64_t id) {
    auto job = c_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job{};
  }
  int64_t Submit(const v1::JobSpec& spec) {
    bool existing;
    auto id = c_->Submit(spec, "", &existing);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  bool Stored() { return c_->WaitStored(std::chrono::steady_clock::now() + std::chrono::seconds(30)); }

  FakeClock clock;
  std::map<std::string, std::shared_ptr<FakeSessionSink>> sinks;

 private:
  std::unique_ptr<Coordinator> c_;
};

using WriteLock = joule::testing::SqliteWriteLock;

CoordinatorOptions FileOptions(const std::string& db) {
  CoordinatorOptions o;
  o.store = db;
  o.store_busy_timeout_ms = 20;
  o.store_wait = milliseconds(300);
  return o;
}

TEST(CoordinatorStoreTest, EndStatesSurviveAStoreThatCannotWriteAndAreStoredLater) {
  const std::string db = TempDb();
  Harness h(FileOptions(db));
  std::string w0 = h.AddWorker(), w1 = h.AddWorker();
  int64_t done = h.Submit(FaultsSpec(1));
  int64_t cancelled = h.Submit(FaultsSpec(1));
  ASSERT_TRUE(h.Stored());
  WriteLock lock(db);
  const std::string runner = h.WorkerOf(done);
  h.Report(runner, h.Last(runner), {.steps = 5, .samples = 320});
  // Served from memory, not the stale RUNNING row; a watch returns its end.
  EXPECT_EQ(h.Get(done).state(), v1::JOB_STATE_SUCCEEDED);
  v1::Job last;
  bool final = true;
  auto watched = h.c().WaitForJobChange(done, &last, std::chrono::steady_clock::now() +
                                                          std::chrono::seconds(30), &final);
  ASSERT_TRUE(watched.ok());
  EXPECT_EQ(watched->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(final);  // seen, but not stored: a watch goes on until it is
  // A cancel that cannot be stored fails, but the job stays cancelled in memory.
  auto cancel = h.c().CancelJob(cancelled);
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(cancel.status().message().find("job store: the cancel of job"), std::string::npos)
      << cancel.status();
  EXPECT_NE(cancel.status().message().find("is not stored yet"), std::string::npos)
      << cancel.status();
  EXPECT_NE(cancel.status().message().find("locked"), std::string::npos) << cancel.status();
  EXPECT_EQ(h.Get(cancelled).state(), v1::JOB_STATE_CANCELLED);
  // What a client sees says it is not stored yet (issue 23: shown cancelled, then undone
  // by a restart, with nothing to say so).
  EXPECT_NE(h.Get(cancelled).store_error().find("locked"), std::string::npos)
      << h.Get(cancelled).store_error();
  // Nothing else waits for the store meanwhile, and lists show the state a user sees.
  EXPECT_EQ(h.c().ListWorkers().size(), 2u);
  v1::ListJobsRequest by_state;
  by_state.set_state(v1::JOB_STATE_SUCCEEDED);
  auto succeeded = h.c().ListJobs(by_state);
  ASSERT_TRUE(succeeded.ok());
  ASSERT_EQ(succeeded->jobs_size(), 1);
  EXPECT_EQ(succeeded->jobs(0).id(), done);
  by_state.set_state(v1::JOB_STATE_RUNNING);
  EXPECT_EQ(h.c().ListJobs(by_state)->jobs_size(), 0);
  lock.Release();
  ASSERT_TRUE(h.Stored());  // retried until stored
  EXPECT_EQ(h.Get(cancelled).store_error(), "");
  watched = h.c().WaitForJobChange(done, &last, std::chrono::steady_clock::now() +
                                                     std::chrono::seconds(30), &final);
  ASSERT_TRUE(watched.ok());
  EXPECT_TRUE(final);
  h.Reset();
  // After a restart the ended jobs stay ended: nothing runs again.
  Harness again(FileOptions(db));
  EXPECT_EQ(again.Get(done).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(again.Get(cancelled).state(), v1::JOB_STATE_CANCELLED);
  std::string w = again.AddWorker();
  EXPECT_EQ(again.Last(w).job_id(), 0) << "a finished job was assigned again";
}

// A real, small file system to fill: a 1 MiB tmpfs mounted at a fresh directory `name`
// beside the test databases, unmounted at the end of the scope. Root only: elsewhere (or
// where mount fails) `why_not` says why, and the test skips.
struct SmallTmpfs {
  explicit SmallTmpfs(const std::string& name)
      : dir(std::filesystem::path(TempDb()).parent_path() / name) {
    if (geteuid() != 0) {
      why_not = "mounting a small tmpfs needs root";
      return;
    }
    std::filesystem::create_directories(dir);
    if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
      why_not = std::string("cannot mount a tmpfs here: ") + std::strerror(errno);
      return;
    }
    mounted = true;
  }
  ~SmallTmpfs() {
    if (mounted) umount2(dir.c_str(), MNT_DETACH);
  }
  std::filesystem::path dir;
  std::string why_not;
  bool mounted = false;
};

// Issue 23: a coordinator whose disk is full says so (RESOURCE_EXHAUSTED, the store's
// words), not "cannot reach"; the jobs it stored before are intact once space is freed.
// A real full file system: a 1 MiB tmpfs (root only; skipped elsewhere).
TEST(CoordinatorStoreTest, AFullDiskIsItsOwnErrorAndLosesNothingStored) {
  SmallTmpfs fs("full");
  if (!fs.why_not.empty()) GTEST_SKIP() << fs.why_not;
  const std::filesystem::path& dir = fs.dir;
  const std::string db = (dir / "jobs.db").string();
  int64_t first = 0;
  {
    Harness h(FileOptions(db));
    first = h.Submit(FaultsSpec(1));
    ASSERT_TRUE(h.Stored());
    // Fill the file system.
    {
      std::ofstream filler(dir / "filler", std::ios::binary);
      const std::string block(4096, 'x');
      while (filler.write(block.data(), block.size())) {
      }
    }
    bool existing = false;
    v1::JobSpec big = FaultsSpec(1);
    (*big.mutable_labels())["pad"] = std::string(200, 'p');
    absl::StatusOr<int64_t> id = absl::InternalError("not tried");
    for (int i = 0; i < 50 && (id = h.c().Submit(big, "", &existing)).ok(); ++i) {
    }
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted) << id.status();
    EXPECT_NE(id.status().message().find("job store: "), std::string::npos) << id.status();
    EXPECT_NE(id.status().message().find("full"), std::string::npos) << id.status();
    std::filesystem::remove(dir / "filler");
  }
  Harness again(FileOptions(db));
  EXPECT_EQ(again.Get(first).state(), v1::JOB_STATE_PENDING);
}

// Inserts committed in groups (SqliteJobStore) on a disk that fills up under them: each
// insert acknowledged is stored, and none that failed is (a failure can roll the group's
// whole transaction back; a later insert of the group must not commit on its own).
TEST(CoordinatorStoreTest, OnAFillingDiskConcurrentInsertsAreStoredIffAcknowledged) {
  SmallTmpfs fs("filling");
  if (!fs.why_not.empty()) GTEST_SKIP() << fs.why_not;
  const std::filesystem::path& dir = fs.dir;
  const std::string location = "sqlite:" + (dir / "jobs.db").string();
  std::set<std::string> acknowledged;
  int failed = 0;
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(location);
    ASSERT_TRUE(store.ok()) << store.status();
    // Leave the database about 64 KiB to grow in.
    {
      std::ofstream filler(dir / "filler", std::ios::binary);
      const std::string block(4096, 'x');
      for (int i = 0; i < 256 - 16 - 16 && filler.write(block.data(), block.size()); ++i) {
      }
    }
    std::mutex mu;
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c) {
      clients.emplace_back([&, c] {
        for (int i = 0; i < 60; ++i) {
          v1::Job job;
          *job.mutable_spec() = FaultsSpec(1);
          (*job.mutable_spec()->mutable_labels())["pad"] = std::string(900, 'p');
          job.set_request_id("c" + std::to_string(c) + "-" + std::to_string(i));
          bool existing = false;
          const absl::Status s = (*store)->Insert(&job, &existing);
          std::lock_guard<std::mutex> lock(mu);
          if (s.ok()) {
            acknowledged.insert(job.request_id());
          } else {
            ++failed;
          }
        }
      });
    }
    for (auto& t : clients) t.join();
  }
  std::filesystem::remove(dir / "filler");
  ASSERT_GT(failed, 0) << "the disk never filled: the test proves nothing";
  ASSERT_FALSE(acknowledged.empty());
  absl::StatusOr<std::unique_ptr<JobStore>> reopened = JobStore::Open(location);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  std::set<std::string> stored;
  absl::StatusOr<std::vector<v1::Job>> all = (*reopened)->List(v1::JOB_STATE_UNSPECIFIED, 0, 10000);
  ASSERT_TRUE(all.ok()) << all.status();
  for (const v1::Job& j : *all) stored.insert(j.request_id());
  EXPECT_EQ(stored, acknowledged) << failed << " inserts failed";
}

TEST(CoordinatorStoreTest, SubmitFailsWithTheStoresReasonAndStoresNothing) {
  const std::string db = TempDb();
  Harness h(FileOptions(db));
  WriteLock lock(db);
  bool existing;
  auto id = h.c().Submit(FaultsSpec(1), "", &existing);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable);
  lock.Release();
  v1::ListJobsRequest all;
  EXPECT_EQ(h.c().ListJobs(all)->jobs_size(), 0);
  EXPECT_TRUE(h.c().Submit(FaultsSpec(1), "", &existing).ok());  // and the slot was given back
}

TEST(CoordinatorShutdownTest, AGracefulStopLeavesRunningAttemptsToBeRequeued) {
  const std::string db = TempDb();
  int64_t id;
  {
    Harness h(FileOptions(db));
    std::string w0 = h.AddWorker(), w1 = h.AddWorker();
    v1::JobSpec spec = FaultsSpec(2);
    spec.set_no_restarts(true);  // a failed attempt would end it FAILED
    id = h.Submit(spec);
    ASSERT_EQ(h.Get(id).state(), v1::JOB_STATE_RUNNING);
    h.c().BeginShutdown();
    // The server's shutdown ends every session: not lost workers.
    for (auto& [w, sink] : h.sinks) h.c().CloseSession(w, sink.get(), "server shutting down");
    EXPECT_EQ(h.Get(id).state(), v1::JOB_STATE_RUNNING);
  }
  Harness after(FileOptions(db));
  v1::Job job = after.Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.result().failed_attempts_size(), 0);
  EXPECT_NE(job.reason().find("re-queued"), std::string::npos) << job.reason();
  // The cut-short attempt is named as what it was (issue 23), not "pending".
  ASSERT_EQ(job.result().attempts_size(), 1);
  EXPECT_EQ(job.result().attempts(0).outcome(), v1::ATTEMPT_OUTCOME_INTERRUPTED);
  EXPECT_EQ(ProtoToJson(job).at("result").at("attempts").at(0).at("outcome"), "interrupted");
  std::string w0 = after.AddWorker(), w1 = after.AddWorker();
  EXPECT_EQ(after.Get(id).attempt(), 2);
}

// A coordinator that starts with an attempt running in its store (it took over from a
// leader, or restarted with a reattach window) adopts it when all its ranks come back.
struct Adoption {
  int64_t id = 0;
  std::string w0, w1;
  v1::Assignment a0, a1;
};
// Runs a two-rank job under a first coordinator on `db`, which then stops; with
// `rank1_done`, rank 1's result reached it first.
Adoption RunUnderAnEarlierCoordinator(const std::string& db, bool rank1_done = false) {
  Adoption a;
  Harness h(FileOptions(db));
  a.w0 = h.AddWorker();
  a.w1 = h.AddWorker();
  a.id = h.Submit(FaultsSpec(2));
  a.a0 = h.Last(a.w0);
  a.a1 = h.Last(a.w1);
  // Past its rendezvous: rank 0 made steps (only such an attempt is adopted).
  v1::WorkerMessage m;
  m.mutable_progress()->set_job_id(a.id);
  m.mutable_progress()->set_attempt(a.a0.attempt());
  m.mutable_progress()->set_rank(0);
  m.mutable_progress()->mutable_progress()->set_epoch(1);
  m.mutable_progress()->mutable_progress()->set_step(10);
  h.c().OnWorkerMessage(a.w0, m);
  if (rank1_done) h.Report(a.w1, a.a1, {.steps = 100, .samples = 6400});
  EXPECT_EQ(h.Get(a.id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(h.Get(a.id).progress().step(), 10);
  h.c().BeginShutdown();
  for (auto& [w, sink] : h.sinks) h.c().CloseSession(w, sink.get(), "server shutting down");
  return a;
}
absl::StatusOr<v1::RegisterWorkerResponse> Resume(Harness& h, const std::string& worker,
                                                  const v1::Assignment& a,
                                                  const std::string& host = "test", int pid = 0) {
  v1::RegisterWorkerRequest req;
  req.set_host(host);
  req.set_pid(pid);
  req.set_resume_worker_id(worker);
  req.set_resume_job_id(a.job_id());
  req.set_resume_attempt(a.attempt());
  return h.c().RegisterWorker(req);
}

TEST(CoordinatorAdoptionTest, AnAttemptWhoseRanksAllComeBackGoesOnAsItWas) {
  const std::string db = TempDb();
  const Adoption before = RunUnderAnEarlierCoordinator(db);
  CoordinatorOptions o = FileOptions(db);
  o.reattach_window = std::chrono::seconds(10);
  Harness h(o);
  ASSERT_EQ(h.Get(before.id).state(), v1::JOB_STATE_RUNNING);  // not re-queued
  // Another process claiming a rank (its id, its attempt) is not the one that ran it.
  EXPECT_FALSE(Resume(h, before.w0, before.a0, "elsewhere")->resumed());
  EXPECT_FALSE(Resume(h, before.w1, before.a1, "test", 4242)->resumed());
  for (const auto& [w, a] : {std::pair{before.w0, before.a0}, std::pair{before.w1, before.a1}}) {
    auto r = Resume(h, w, a);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->resumed());
    EXPECT_EQ(r->worker_id(), w);  // its id from the earlier coordinator
    h.sinks[w] = std::make_shared<FakeSessionSink>();
    ASSERT_TRUE(h.c().OpenSession(w, h.sinks[w]).ok());
  }
  h.clock.Advance(std::chrono::seconds(11));  // past the window: nothing to re-queue
  h.c().CheckHeartbeats(h.clock.Now());
  ASSERT_EQ(h.Get(before.id).state(), v1::JOB_STATE_RUNNING);
  h.Report(before.w0, before.a0, {.steps = 100, .samples = 6400});
  h.Report(before.w1, before.a1, {.steps = 100, .samples = 6400});
  const v1::Job job = h.Get(before.id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempt(), 1);
  ASSERT_EQ(job.result().attempts_size(), 1);
  EXPECT_EQ(job.result().ranks_size(), 2);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 20);  // both ranks, once each
}

TEST(CoordinatorAdoptionTest, AnAttemptMissingARankWhenTheWindowEndsIsRequeuedWithoutARestart) {
  const std::string db = TempDb();
  const Adoption before = RunUnderAnEarlierCoordinator(db);
  CoordinatorOptions o = FileOptions(db);
  o.reattach_window = std::chrono::seconds(10);
  Harness h(o);
  // Claims that do not fit the adopted attempt are not adopted: another attempt, a worker
  // id that is not one of its ranks.
  v1::Assignment wrong = before.a1;
  wrong.set_attempt(7);
  EXPECT_FALSE(Resume(h, before.w1, wrong)->resumed());
  EXPECT_FALSE(Resume(h, "w99.stranger", before.a1)->resumed());
  auto back = Resume(h, before.w0, before.a0);
  ASSERT_TRUE(back.ok() && back->resumed());
  h.sinks[before.w0] = std::make_shared<FakeSessionSink>();
  ASSERT_TRUE(h.c().OpenSession(before.w0, h.sinks[before.w0]).ok());
  h.clock.Advance(std::chrono::seconds(11));
  h.c().CheckHeartbeats(h.clock.Now());
  const v1::Job job = h.Get(before.id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_NE(job.reason().find("only 1 of the 2 ranks of attempt 1"), std::string::npos)
      << job.reason();
  ASSERT_EQ(job.result().attempts_size(), 1);
  EXPECT_EQ(job.result().attempts(0).outcome(), v1::ATTEMPT_OUTCOME_INTERRUPTED);
  EXPECT_EQ(job.result().failed_attempts_size(), 0);  // no restart spent
  // The rank that came back is told to stop.
  bool told = false;
  for (const auto& m : h.sinks[before.w0]->sent()) told |= m.has_cancel();
  EXPECT_TRUE(told);
  // The late rank is too late.
  EXPECT_FALSE(Resume(h, before.w1, before.a1)->resumed());
}

TEST(CoordinatorAdoptionTest, AResultSentAgainAfterTheFailoverIsCountedOnce) {
  const std::string db = TempDb();
  // Rank 1 finished under the first coordinator, which stored its result; its worker keeps
  // the result until a session takes it, so it comes back and sends it again.
  const Adoption before = RunUnderAnEarlierCoordinator(db, /*rank1_done=*/true);
  CoordinatorOptions o = FileOptions(db);
  o.reattach_window = std::chrono::seconds(10);
  Harness h(o);
  ASSERT_EQ(h.Get(before.id).result().ranks_size(), 1);
  for (const auto& [w, a] : {std::pair{before.w0, before.a0}, std::pair{before.w1, before.a1}}) {
    ASSERT_TRUE(Resume(h, w, a)->resumed());
    h.sinks[w] = std::make_shared<FakeSessionSink>();
    ASSERT_TRUE(h.c().OpenSession(w, h.sinks[w]).ok());
  }
  h.Report(before.w1, before.a1, {.steps = 100, .samples = 6400});
  EXPECT_EQ(h.Get(before.id).state(), v1::JOB_STATE_RUNNING);  // rank 0 still trains
  EXPECT_EQ(h.Get(before.id).result().ranks_size(), 1);
  h.Report(before.w0, before.a0, {.steps = 100, .samples = 6400});
  const v1::Job job = h.Get(before.id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.result().ranks_size(), 2);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 20);
}

TEST(CoordinatorAdoptionTest, AJobCancelledWhileAdoptingStaysCancelled) {
  const std::string db = TempDb();
  const Adoption before = RunUnderAnEarlierCoordinator(db);
  CoordinatorOptions o = FileOptions(db);
  o.reattach_window = std::chrono::seconds(10);
  Harness h(o);
  ASSERT_TRUE(Resume(h, before.w0, before.a0)->resumed());
  ASSERT_TRUE(h.c().CancelJob(before.id).ok());
  ASSERT_EQ(h.Get(before.id).state(), v1::JOB_STATE_CANCELLED);
  h.clock.Advance(std::chrono::seconds(11));  // the window's end finds nothing to re-queue
  h.c().CheckHeartbeats(h.clock.Now());
  const v1::Job job = h.Get(before.id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.result().attempts_size(), 1);
}

// A leader serves in its lease's epoch (the fencing token): it stamps it on everything it
// tells workers and on its rendezvous scopes, and refuses a worker that was given a newer
// one (it has been superseded without knowing), asking its lease to be checked.
TEST(CoordinatorFencingTest, EveryMessageCarriesTheEpochAndANewerOneIsRefused) {
  const std::string db = TempDb();
  int64_t epoch = 0;
  {
    auto store = JobStore::Open(db, 5000);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 3; ++i) {  // a few leaderships before this one
      auto lead = (*store)->Campaign("holder-" + std::to_string(i), "127.0.0.1:1", 0);
      ASSERT_TRUE(lead.ok()) << lead.status();
      epoch = lead->epoch;
    }
    auto lead = (*store)->Campaign("this-one", "127.0.0.1:2", 60000);
    ASSERT_TRUE(lead.ok() && lead->ours) << lead.status();
    epoch = lead->epoch;
  }
  ASSERT_GT(epoch, 1);
  CoordinatorOptions o = FileOptions(db);
  o.lease_epoch = epoch;
  std::vector<int64_t> newer_seen;
  bool confirmed = false;  // what the lease's check says
  o.newer_epoch_claimed = [&](int64_t seen) {
    newer_seen.push_back(seen);
    return confirmed;
  };
  Harness h(o);
  // Workers that were given this epoch, an older one, or none register.
  for (int64_t seen : {epoch, epoch - 1, int64_t{0}}) {
    v1::RegisterWorkerRequest req;
    req.set_host("test");
    req.set_leader_epoch_seen(seen);
    auto r = h.c().RegisterWorker(req);
    ASSERT_TRUE(r.ok()) << seen << ": " << r.status();
    EXPECT_EQ(r->leader_epoch(), epoch);
    EXPECT_FALSE(r->epoch_reset());
  }
  EXPECT_TRUE(newer_seen.empty());
  // One that was given a newer epoch is refused, and the leader is told.
  for (int64_t seen : {epoch + 1, int64_t{1} << 62}) {
    v1::RegisterWorkerRequest req;
    req.set_host("test");
    req.set_leader_epoch_seen(seen);
    auto r = h.c().RegisterWorker(req);
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
    EXPECT_NE(r.status().message().find("superseded"), std::string::npos) << r.status();
  }
  EXPECT_EQ(newer_seen, (std::vector<int64_t>{epoch + 1, int64_t{1} << 62}));
  // Once the store has confirmed this lease since the claim (the worker's epoch is not in
  // it: a restored store), the worker is taken, told to take this epoch.
  confirmed = true;
  {
    v1::RegisterWorkerRequest req;
    req.set_host("test");
    req.set_leader_epoch_seen(epoch + 1);
    auto r = h.c().RegisterWorker(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->epoch_reset());
    EXPECT_EQ(r->leader_epoch(), epoch);
  }
  // Assignments, cancels and acks carry the epoch; the rendezvous scope names it.
  const std::string w0 = h.AddWorker(), w1 = h.AddWorker();
  const int64_t id = h.Submit(FaultsSpec(2));
  EXPECT_EQ(h.Last(w0).job_id(), id);
  EXPECT_EQ(h.Last(w0).rendezvous_prefix(),
            "epoch/" + std::to_string(epoch) + "/job/" + std::to_string(id) + "/attempt/1");
  v1::WorkerMessage beat;
  beat.mutable_heartbeat()->set_unix_ms(1);
  h.c().OnWorkerMessage(w1, beat);
  ASSERT_TRUE(h.c().CancelJob(id).ok());
  int assignments = 0, cancels = 0, acks = 0;
  for (const std::string& w : {w0, w1}) {
    for (const auto& m : h.sinks[w]->sent()) {
      EXPECT_EQ(m.leader_epoch(), epoch) << m.DebugString();
      assignments += m.has_assignment();
      cancels += m.has_cancel();
      acks += m.has_heartbeat_ack();
    }
  }
  EXPECT_EQ(assignments, 2);
  EXPECT_EQ(cancels, 2);
  EXPECT_EQ(acks, 1);
}

// Without a lease (one coordinator): epoch 0 everywhere, nothing refused, scopes as before.
TEST(CoordinatorFencingTest, WithoutALeaseNothingIsStampedOrRefused) {
  std::vector<int64_t> newer_seen;
  CoordinatorOptions o;
  o.newer_epoch_claimed = [&](int64_t seen) {
    newer_seen.push_back(seen);
    return false;
  };
  Harness h(o);
  v1::RegisterWorkerRequest req;
  req.set_host("test");
  req.set_leader_epoch_seen(12);  // it served under an HA pair before
  auto r = h.c().RegisterWorker(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->leader_epoch(), 0);
  EXPECT_TRUE(newer_seen.empty());
  const std::string w0 = h.AddWorker();
  const int64_t id = h.Submit(FaultsSpec(1));
  EXPECT_EQ(h.Last(w0).rendezvous_prefix(), "job/" + std::to_string(id) + "/attempt/1");
}

TEST(CoordinatorAdoptionTest, AnAttemptStillAtItsRendezvousIsRequeuedAtOnce) {
  const std::string db = TempDb();
  int64_t id;
  {
    Harness h(FileOptions(db));
    h.AddWorker();
    h.AddWorker();
    id = h.Submit(FaultsSpec(2));  // assigned, no step made
    h.c().BeginShutdown();
    for (auto& [w, sink] : h.sinks) h.c().CloseSession(w, sink.get(), "server shutting down");
  }
  CoordinatorOptions o = FileOptions(db);
  o.reattach_window = std::chrono::seconds(10);
  Harness h(o);
  EXPECT_EQ(h.Get(id).state(), v1::JOB_STATE_PENDING);
}

TEST(CoordinatorShutdownTest, ARestartSaysWhyEachPendingJobWaits) {
  const std::string db = TempDb();
  int64_t id;
  {
    // A job stored PENDING without its reason, as a crash right after the submit leaves it.
    auto store = JobStore::Open(db);
    ASSERT_TRUE(store.ok());
    v1::Job job;
    *job.mutable_spec() = FaultsSpec(8);
    ASSERT_TRUE(NormalizeAndValidateSpec(*job.mutable_spec()).ok());
    job.set_state(v1::JOB_STATE_PENDING);
    bool existing;
    ASSERT_TRUE((*store)->Insert(&job, &existing).ok());
    id = job.id();
  }
  Harness h(FileOptions(db));
  EXPECT_EQ(h.Get(id).reason(), "waiting for 8 idle cpu workers: 0 registered, 0 idle");
}

TEST(CoordinatorClockTest, DurationsComeFromTheSteadyClockNotTheSystemClock) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker();
  int64_t id = h.Submit(FaultsSpec(1));
  h.clock.Advance(std::chrono::minutes(30));
  h.clock.Step(-std::chrono::hours(2));  // NTP steps the system clock back two hours
  h.Report(w0, h.Last(w0), {.steps = 100, .samples = 6400, .joules = 3600});
  v1::Job job = h.Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_DOUBLE_EQ(job.result().wall_seconds(), 1800);
  EXPECT_DOUBLE_EQ(job.result().energy().device_hours(), 0.5);
  EXPECT_DOUBLE_EQ(job.result().energy().average_watts(), 2);
  EXPECT_LT(job.finished_unix_ms(), job.started_unix_ms());  // timestamps stay wall-clock
}

TEST(CoordinatorEnergyTest, EveryFigureCoversEveryAttempt) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker(), w1 = h.AddWorker();
  int64_t id = h.Submit(FaultsSpec(2));
  // Attempt 1: an hour, then rank 1 fails (retryable); rank 0 stops, cancelled.
  h.clock.Advance(std::chrono::hours(1));
  v1::Assignment a0 = h.Last(w0), a1 = h.Last(w1);
  h.Report(w1, a1, {.ok = false, .code = absl::StatusCode::kUnavailable, .error = "peer gone",
                    .steps = 900, .samples = 57600, .joules = 3000, .source = "estimated"});
  h.Report(w0, a0, {.ok = false, .code = absl::StatusCode::kCancelled, .error = "cancelled",
                    .steps = 900, .samples = 57600, .joules = 4200});
  ASSERT_EQ(h.Get(id).state(), v1::JOB_STATE_RUNNING);  // attempt 2, resumed at step 900
  ASSERT_EQ(h.Get(id).attempt(), 2);
  // Attempt 2: six minutes, from the checkpoint at step 900 to step 1000.
  h.clock.Advance(std::chrono::minutes(6));
  h.Report(w0, h.Last(w0), {.steps = 1000, .resumed_from = 900, .samples = 6400, .joules = 360});
  h.Report(w1, h.Last(w1), {.steps = 1000, .resumed_from = 900, .samples = 6400, .joules = 360});
  v1::Job job = h.Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  const v1::EnergyReport& e = job.result().energy();
  ASSERT_EQ(job.result().attempts_size(), 2);
  EXPECT_DOUBLE_EQ(e.total_joules(), 7920);
  EXPECT_DOUBLE_EQ(e.earlier_attempts_joules(), 7200);
  EXPECT_DOUBLE_EQ(e.device_hours(), 2 * 1.0 + 2 * 0.1);
  EXPECT_DOUBLE_EQ(e.average_watts(), 7920.0 / 3960);
  EXPECT_DOUBLE_EQ(e.joules_per_device_hour(), 7920 / 2.2);
  EXPECT_EQ(job.result().samples(), 2 * 57600 + 2 * 6400);
  EXPECT_DOUBLE_EQ(e.samples_per_joule(), (2 * 57600 + 2 * 6400) / 7920.0);
  EXPECT_DOUBLE_EQ(e.updates_per_device_hour(), (900 + 100) / 2.2);  // not 1000 / 0.2
  EXPECT_TRUE(e.estimated());  // attempt 1's rank 1 was estimated
  EXPECT_EQ(job.result().steps(), 1000);
  EXPECT_DOUBLE_EQ(job.result().wall_seconds(), 360);  // the last attempt's
}

TEST(CoordinatorEnergyTest, CancellingAPendingJobKeepsWhatEarlierAttemptsSpent) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker();
  int64_t id = h.Submit(FaultsSpec(1));
  h.clock.Advance(std::chrono::minutes(1));
  h.Report(w0, h.Last(w0), {.ok = false, .code = absl::StatusCode::kUnavailable,
                            .error = "peer gone", .joules = 50});
  // Re-queued and running again on the same worker; lose the worker so it waits (its
  // session ends, and it does not come back within the heartbeat timeout).
  h.c().CloseSession(w0, h.sinks[w0].get(), "gone");
  h.clock.Advance(std::chrono::hours(25));
  h.c().CheckHeartbeats(h.clock.Now());
  ASSERT_EQ(h.Get(id).state(), v1::JOB_STATE_PENDING);
  auto cancelled = h.c().CancelJob(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_DOUBLE_EQ(cancelled->result().energy().total_joules(), 50);
  EXPECT_GT(cancelled->result().energy().device_hours(), 0);
  EXPECT_EQ(cancelled->finished_unix_ms() > 0, true);
}

TEST(CoordinatorEnergyTest, ARequeuedJobHasNoFinishTimeUntilItEnds) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker();
  v1::JobSpec spec = FaultsSpec(1);
  int64_t id = h.Submit(spec);
  h.Report(w0, h.Last(w0), {.ok = false, .code = absl::StatusCode::kUnavailable, .error = "x"});
  v1::Job job = h.Get(id);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.finished_unix_ms(), 0);
  EXPECT_GT(job.queued_unix_ms(), 0);
}

TEST(CoordinatorEnergyTest, LateResultsOfAnyAttemptAreCountedOnce) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker(), w1 = h.AddWorker(), w2 = h.AddWorker();
  int64_t id = h.Submit(FaultsSpec(2));
  v1::Assignment first1 = h.Last(w1);
  // w0's rank fails first: attempt 1 ends, attempt 2 starts on w0 and w2 (w1 still busy).
  h.Report(w0, h.Last(w0), {.ok = false, .code = absl::StatusCode::kUnavailable,
                            .error = "peer gone", .joules = 5});
  ASSERT_EQ(h.Get(id).attempt(), 2);
  // Attempt 2 ends first; w1's result for attempt 1 comes after the job ended.
  for (const std::string& w : {w0, w2}) {
    if (h.Last(w).attempt() == 2) h.Report(w, h.Last(w), {.joules = 100});
  }
  ASSERT_EQ(h.Get(id).state(), v1::JOB_STATE_SUCCEEDED);
  h.Report(w1, first1, {.ok = false, .code = absl::StatusCode::kCancelled, .joules = 7});
  h.Report(w1, first1, {.ok = false, .code = absl::StatusCode::kCancelled, .joules = 7});
  ASSERT_TRUE(h.Stored());
  v1::Job job = h.Get(id);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 5 + 7 + 200);
  EXPECT_EQ(job.result().attempts(0).ranks_reported_size(), 2);
}

TEST(CoordinatorEnergyTest, ARankWithoutMeteringIsAWarningNotSilence) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker(), w1 = h.AddWorker();
  int64_t id = h.Submit(FaultsSpec(2));
  h.Report(w0, h.Last(w0), {.joules = 10});
  h.Report(w1, h.Last(w1), {.metered = false});
  v1::Job job = h.Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  bool warned = false;
  for (const std::string& w : job.result().energy().warnings()) {
    warned |= w.find("rank 1") != std::string::npos && w.find("no energy") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

TEST(CoordinatorEnergyTest, ARestartKeepsTheInterruptedAttemptAndItsLateRanks) {
  const std::string db = TempDb();
  int64_t id;
  v1::Assignment a0;
  {
    Harness h(FileOptions(db));
    std::string w0 = h.AddWorker(), w1 = h.AddWorker();
    id = h.Submit(FaultsSpec(2));
    a0 = h.Last(w0);
    h.Report(w1, h.Last(w1), {.ok = true, .steps = 10, .samples = 640, .joules = 30});
    ASSERT_TRUE(h.Stored());
  }  // the coordinator stops (as after a crash: its state is the store's)
  Harness h(FileOptions(db));
  v1::Job job = h.Get(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_PENDING);
  ASSERT_EQ(job.result().attempts_size(), 1);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 30);
  // Rank 0's worker reconnects and delivers the result it kept.
  std::string w = h.AddWorker();
  h.Report(w, a0, {.ok = false, .code = absl::StatusCode::kCancelled, .joules = 12});
  job = h.Get(id);
  EXPECT_DOUBLE_EQ(job.result().energy().total_joules(), 42);
  EXPECT_EQ(job.result().attempts(0).ranks_reported_size(), 2);
}

TEST(CoordinatorRootCauseTest, ARanksOwnErrorIsTheReasonNotItsPeersSymptom) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker(), w1 = h.AddWorker(), w2 = h.AddWorker();
  v1::JobSpec spec = FaultsSpec(3);
  spec.set_no_restarts(true);
  int64_t id = h.Submit(spec);
  std::map<int, std::string> by_rank;
  for (const std::string& w : {w0, w1, w2}) by_rank[h.Last(w).rank()] = w;
  h.Report(by_rank[0], h.Last(by_rank[0]),
           {.ok = false, .code = absl::StatusCode::kAborted, .error = "rank 2 left the group"});
  h.Report(by_rank[2], h.Last(by_rank[2]),
           {.ok = false, .code = absl::StatusCode::kInternal, .error = "training failed: boom"});
  ASSERT_TRUE(h.Stored());
  v1::Job job = h.Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find("training failed: boom"), std::string::npos) << job.reason();
  // A later symptom does not replace the cause.
  h.Report(by_rank[1], h.Last(by_rank[1]),
           {.ok = false, .code = absl::StatusCode::kUnavailable, .error = "connection closed"});
  ASSERT_TRUE(h.Stored());
  EXPECT_NE(h.Get(id).reason().find("boom"), std::string::npos);
}

TEST(CoordinatorRootCauseTest, TheCauseIsKeptWhenTheJobIsRequeued) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker(), w1 = h.AddWorker(), w2 = h.AddWorker();
  int64_t id = h.Submit(FaultsSpec(3));  // restarts remain: the attempt is re-queued
  std::map<int, std::string> by_rank;
  for (const std::string& w : {w0, w1, w2}) by_rank[h.Last(w).rank()] = w;
  const v1::Assignment a2 = h.Last(by_rank[2]);
  h.Report(by_rank[0], h.Last(by_rank[0]),
           {.ok = false, .code = absl::StatusCode::kUnavailable, .error = "rank 2 left the group"});
  h.Report(by_rank[2], a2,
           {.ok = false, .code = absl::StatusCode::kInternal, .error = "training failed: boom"});
  v1::Job job = h.Get(id);
  ASSERT_EQ(job.result().failed_attempts_size(), 1);
  EXPECT_NE(job.result().failed_attempts(0).find("boom"), std::string::npos)
      << job.result().failed_attempts(0);
  EXPECT_NE(job.reason().find("boom"), std::string::npos) << job.reason();
}

TEST(CoordinatorEnergyTest, AResultOfAnotherJobWithTheSameIdIsIgnored) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker();
  int64_t id = h.Submit(FaultsSpec(1));
  v1::WorkerMessage m;
  m.mutable_result()->set_job_id(id);
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->set_job_uid("0123456789abcdef");  // a job of an earlier database
  m.mutable_result()->mutable_result()->set_ok(true);
  h.c().OnWorkerMessage(w0, m);
  EXPECT_EQ(h.Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(h.c().ListWorkers()[0].state(), v1::WORKER_STATE_BUSY);  // still its rank
}

TEST(CoordinatorRootCauseTest, RanksThatEndWithDifferentParametersFailTheJob) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker(), w1 = h.AddWorker();
  int64_t id = h.Submit(FaultsSpec(2));
  h.Report(w0, h.Last(w0), {.hash = "00000001"});
  h.Report(w1, h.Last(w1), {.hash = "00000002"});
  v1::Job job = h.Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find("different parameters"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("00000002"), std::string::npos) << job.reason();
}

TEST(CoordinatorSubmitTest, ConcurrentSubmitsGetDistinctUids) {
  Harness h(CoordinatorOptions{});
  std::vector<std::thread> threads;
  std::mutex mu;
  std::set<std::string> uids;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        bool existing;
        auto id = h.c().Submit(FaultsSpec(1), "", &existing);
        ASSERT_TRUE(id.ok());
        std::lock_guard<std::mutex> lock(mu);
        uids.insert(h.Get(*id).uid());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(uids.size(), 400u);
}

TEST(CoordinatorWorkerTest, BadNamesAreRefusedAtRegistrationAndListsStayServable) {
  Harness h(CoordinatorOptions{});
  std::string long_non_ascii;
  for (int i = 0; i < 200; ++i) long_non_ascii += "\xC3\xA9";  // 400 bytes of 'é'
  for (const std::string& bad : {long_non_ascii, std::string("host\xFF"), std::string("a\nb"),
                                 std::string("\xED\xA0\x80"), std::string(300, 'h')}) {
    v1::RegisterWorkerRequest req;
    req.set_host(bad);
    auto r = h.c().RegisterWorker(req);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("host"), std::string::npos) << r.status();
    req.set_host("ok");
    req.set_metrics_address(bad);
    EXPECT_EQ(h.c().RegisterWorker(req).status().code(), absl::StatusCode::kInvalidArgument);
  }
  v1::RegisterWorkerRequest good;
  good.set_host("n\xC5\x93ud-1");  // non-ASCII but valid
  good.set_metrics_address("127.0.0.1:9");
  auto r = h.c().RegisterWorker(good);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(h.c().OpenSession(r->worker_id(), std::make_shared<FakeSessionSink>()).ok());
  EXPECT_NE(h.c().HttpSdJson().find("n\xC5\x93ud-1"), std::string::npos);
  EXPECT_EQ(h.c().ListWorkers().size(), 1u);
}

TEST(CoordinatorSubmitTest, JobsThatCannotFitAreRefusedWithTheFigures) {
  Harness h(CoordinatorOptions{});
  bool existing;
  // Past any machine: refused before any worker is asked.
  v1::JobSpec huge_data = FaultsSpec(1);
  huge_data.set_dataset("synthetic:64x1024x1024:10:10000000");  // about 40 TB
  huge_data.set_model("logreg");
  huge_data.clear_hidden_sizes();
  auto r = h.c().Submit(huge_data, "", &existing);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("GiB"), std::string::npos) << r.status();
  // Past the workers' memory: refused with what it needs and what they have.
  v1::RegisterWorkerRequest req;
  req.set_host("small");
  req.set_memory_bytes(int64_t{8} << 30);
  ASSERT_TRUE(h.c().RegisterWorker(req).ok());
  std::vector<v1::JobSpec> too_big;
  v1::JobSpec wide = FaultsSpec(1);
  wide.add_hidden_sizes(65536);
  wide.add_hidden_sizes(65536);
  too_big.push_back(wide);
  v1::JobSpec big_images = FaultsSpec(1);
  big_images.set_model("resnet50");
  big_images.set_dataset("synthetic:3x224x224:1000:100000");  // 60 GB of float32
  too_big.push_back(big_images);
  for (const v1::JobSpec& spec : too_big) {
    auto refused = h.c().Submit(spec, "", &existing);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << spec.model();
    EXPECT_NE(refused.status().message().find("8.0 GiB available"), std::string::npos)
        << refused.status();
    EXPECT_EQ(refused.status().message().find('\n'), std::string::npos);
  }
  EXPECT_TRUE(h.c().Submit(FaultsSpec(1), "", &existing).ok());  // fashion-mnist mlp fits
  v1::ListJobsRequest all;
  EXPECT_EQ(h.c().ListJobs(all)->jobs_size(), 1);  // nothing refused was stored
}

std::string Scrape(Coordinator& c) {
  c.RefreshMetrics();
  return prometheus::TextSerializer().Serialize(c.registry()->Collect());
}

TEST(CoordinatorMetricsTest, JobSeriesAreBoundedAndNamed) {
  CoordinatorOptions options;
  options.metrics_finished_jobs = 2;
  Harness h(options);
  std::string w0 = h.AddWorker();
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(h.Submit(FaultsSpec(1)));
    h.Report(w0, h.Last(w0), {.joules = 1});
  }
  const std::string text = Scrape(h.c());
  EXPECT_NE(text.find("joule_build_info{"), std::string::npos);
  for (int i = 0; i < 5; ++i) {
    const std::string series = "joule_job=\"" + std::to_string(ids[i]) + "\"";
    const bool kept = i >= 3;
    EXPECT_EQ(text.find("joule_job_energy_joules_total{" + series) != std::string::npos, kept) << i;
    EXPECT_EQ(text.find(series) != std::string::npos, kept) << i;
  }
  EXPECT_NE(text.find("name=\"faults\""), std::string::npos);
  EXPECT_EQ(text.find("joule_job=\"\""), std::string::npos);
}

// `joule usage`'s figures as counters by submitter and device kind: energy as attempts end,
// jobs by final state, device-hours; one series per user, not per job.
TEST(CoordinatorMetricsTest, UsageCountersBySubmitterAndDeviceKind) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker();
  for (int i = 0; i < 3; ++i) {
    h.Submit(FaultsSpec(1));
    h.Report(w0, h.Last(w0), {.joules = 2.5});
  }
  const std::string text = Scrape(h.c());
  const std::string labels = "device_kind=\"cpu\",user=\"anonymous\"";
  EXPECT_NE(text.find("joule_usage_energy_joules_total{" + labels + "} 7.5"), std::string::npos)
      << text;
  // Prometheus sorts the labels.
  EXPECT_NE(text.find("joule_usage_jobs_total{device_kind=\"cpu\",state=\"succeeded\","
                      "user=\"anonymous\"} 3"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("joule_usage_device_hours_total{" + labels + "}"), std::string::npos) << text;
}

TEST(CoordinatorMetricsTest, JobRunningWhileAnAttemptRuns) {
  Harness h(CoordinatorOptions{});
  std::string w0 = h.AddWorker();
  const int64_t id = h.Submit(FaultsSpec(1));
  const std::string running = "joule_job_running{joule_job=\"" + std::to_string(id) + "\"} 1";
  EXPECT_NE(Scrape(h.c()).find(running), std::string::npos);
  h.Report(w0, h.Last(w0), {.joules = 1});
  EXPECT_EQ(Scrape(h.c()).find("joule_job_running{"), std::string::npos);
}

}  // namespace
}  // namespace joule::server
