// The coordinator's writer thread on a real SQLite store, made to fail on command by
// another connection's write lock.
#include "server/job_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>

#include "server/attempt.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/sqlite_write_lock.h"
#include "tests/testing/temp_cleanup.h"

namespace joule::server {
namespace {

const auto* const kWriterCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_writer_"));

using std::chrono::milliseconds;
using std::chrono::steady_clock;

std::string TempDb() {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("joule_writer_" + std::to_string(getpid()) + "_" + t->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return (dir / "jobs.db").string();
}

// The jobs a coordinator holds, as the writer's hooks see them, and what the writer told.
class Held {
 public:
  JobWriter::Hooks Hooks() {
    return JobWriter::Hooks{
        .snapshot =
            [this](const std::vector<int64_t>& ids) {
              std::lock_guard<std::mutex> lock(mu_);
              std::vector<std::pair<v1::Job, uint64_t>> out;
              for (int64_t id : ids) {
                if (auto it = jobs_.find(id); it != jobs_.end()) out.push_back(it->second);
              }
              return out;
            },
        .on_stored =
            [this](int64_t id, uint64_t version, const absl::Status& st) {
              std::lock_guard<std::mutex> lock(mu_);
              if (st.ok()) {
                stored_[id] = version;
              } else {
                errors_.push_back(std::string(st.message()));
              }
            },
        .on_late_result_stored =
            [this](const v1::Job& job, double joules) {
              std::lock_guard<std::mutex> lock(mu_);
              late_joules_[job.id()] += joules;
            }};
  }
  void Set(const v1::Job& job, uint64_t version) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_[job.id()] = {job, version};
  }
  void Forget(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.erase(id);
  }
  uint64_t StoredVersion(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return stored_.count(id) ? stored_[id] : 0;
  }
  std::vector<std::string> Errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  double LateJoules(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return late_joules_[id];
  }

 private:
  std::mutex mu_;
  std::map<int64_t, std::pair<v1::Job, uint64_t>> jobs_;
  std::map<int64_t, uint64_t> stored_;
  std::vector<std::string> errors_;
  std::map<int64_t, double> late_joules_;
};

v1::Job Inserted(JobStore& store, const std::string& name) {
  v1::Job job;
  job.mutable_spec()->set_name(name);
  job.mutable_spec()->set_workers(2);
  job.set_state(v1::JOB_STATE_PENDING);
  bool existing = false;
  EXPECT_TRUE(store.Insert(&job, &existing).ok());
  return job;
}

std::unique_ptr<JobStore> Open(const std::string& path) {
  auto store = JobStore::Open(path, /*busy_timeout_ms=*/20);
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

steady_clock::time_point In(milliseconds d) { return steady_clock::now() + d; }

TEST(JobWriterTest, AMarkedJobIsStoredInItsNewestState) {
  auto store = Open(TempDb());
  Held held;
  JobWriter writer(store.get(), 400, held.Hooks());
  v1::Job job = Inserted(*store, "a");
  job.set_state(v1::JOB_STATE_RUNNING);
  held.Set(job, 1);
  job.set_state(v1::JOB_STATE_SUCCEEDED);  // changed again before the writer read it
  held.Set(job, 2);
  writer.MarkDirty(job.id());
  writer.MarkDirty(job.id());
  ASSERT_TRUE(writer.WaitStored(In(milliseconds(10000))));
  EXPECT_EQ(held.StoredVersion(job.id()), 2u);
  EXPECT_EQ(store->Get(job.id())->state(), v1::JOB_STATE_SUCCEEDED);
  // A job no longer held is left alone.
  held.Forget(job.id());
  writer.MarkDirty(job.id());
  ASSERT_TRUE(writer.WaitStored(In(milliseconds(10000))));
  EXPECT_TRUE(held.Errors().empty());
}

TEST(JobWriterTest, AFailedWriteIsReportedAndRetriedUntilStored) {
  const std::string path = TempDb();
  auto store = Open(path);
  Held held;
  JobWriter writer(store.get(), 400, held.Hooks());
  v1::Job job = Inserted(*store, "a");
  joule::testing::SqliteWriteLock lock(path);
  job.set_state(v1::JOB_STATE_CANCELLED);
  held.Set(job, 1);
  writer.MarkDirty(job.id());
  // Not stored while the lock holds: WaitStored says so at its deadline, and the
  // coordinator heard why (the store's words).
  EXPECT_FALSE(writer.WaitStored(In(milliseconds(300))));
  ASSERT_FALSE(held.Errors().empty());
  EXPECT_NE(held.Errors().front().find("locked"), std::string::npos) << held.Errors().front();
  EXPECT_EQ(held.StoredVersion(job.id()), 0u);
  lock.Release();
  ASSERT_TRUE(writer.WaitStored(In(milliseconds(10000))));
  EXPECT_EQ(held.StoredVersion(job.id()), 1u);
  EXPECT_EQ(store->Get(job.id())->state(), v1::JOB_STATE_CANCELLED);
}

// A job that ended and was stored with rank 0's result; rank 1 reports afterwards.
v1::Job EndedWithOneRank(JobStore& store) {
  v1::Job job = Inserted(store, "late");
  StartAttempt(job, {"w0", "w1"}, 1000, 400);
  v1::RankResult* r0 = job.mutable_result()->add_ranks();
  r0->set_rank(0);
  r0->set_ok(false);
  r0->set_cancelled(true);
  v1::EnergyRecord* e = r0->add_energy();
  e->set_source("rapl");
  e->set_phase("forward");
  e->set_joules(10);
  CloseAttempt(job, v1::ATTEMPT_OUTCOME_CANCELLED, "cancelled by user", absl::StatusCode::kOk, 60,
               400);
  job.set_state(v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(store.Update(job).ok());
  return job;
}

JobWriter::LateResult LateRank1(const v1::Job& job, double joules) {
  JobWriter::LateResult late;
  late.rank = 1;
  late.worker_id = "w1";
  late.report.set_job_id(job.id());
  late.report.set_attempt(1);
  late.report.set_job_uid(job.uid());
  v1::RankResult* r = late.report.mutable_result();
  r->set_rank(1);
  r->set_cancelled(true);
  v1::EnergyRecord* e = r->add_energy();
  e->set_source("rapl");
  e->set_phase("forward");
  e->set_joules(joules);
  return late;
}

TEST(JobWriterTest, LateResultsJoinTheirStoredJobOnce) {
  auto store = Open(TempDb());
  Held held;
  JobWriter writer(store.get(), 400, held.Hooks());
  const v1::Job job = EndedWithOneRank(*store);
  const double before = store->Get(job.id())->result().energy().total_joules();
  ASSERT_TRUE(writer.AddLateResult(LateRank1(job, 7)));
  ASSERT_TRUE(writer.AddLateResult(LateRank1(job, 7)));  // the same rank again: not counted
  ASSERT_TRUE(writer.WaitStored(In(milliseconds(10000))));
  EXPECT_DOUBLE_EQ(store->Get(job.id())->result().energy().total_joules(), before + 7);
  EXPECT_DOUBLE_EQ(held.LateJoules(job.id()), 7);
  // For a job of another database (uid), a job not ended, or no job: nothing changes.
  JobWriter::LateResult other = LateRank1(job, 5);
  other.report.set_job_uid("another");
  v1::Job pending = Inserted(*store, "pending");
  JobWriter::LateResult not_ended = LateRank1(pending, 5);
  JobWriter::LateResult unknown = LateRank1(job, 5);
  unknown.report.set_job_id(9999);
  for (auto& l : {other, not_ended, unknown}) ASSERT_TRUE(writer.AddLateResult(l));
  ASSERT_TRUE(writer.WaitStored(In(milliseconds(10000))));
  EXPECT_DOUBLE_EQ(store->Get(job.id())->result().energy().total_joules(), before + 7);
  EXPECT_EQ(store->Get(pending.id())->result().attempts_size(), 0);
}

TEST(JobWriterTest, ALateResultIsTriedBoundedlyAgainstAStoreThatKeepsFailing) {
  const std::string path = TempDb();
  auto store = Open(path);
  Held held;
  const v1::Job job = EndedWithOneRank(*store);
  joule::testing::SqliteWriteLock lock(path);
  JobWriter writer(store.get(), 400, held.Hooks());
  ASSERT_TRUE(writer.AddLateResult(LateRank1(job, 7)));
  // kLateResultTries tries with backoff (50 ms doubling), then dropped: the writer is idle
  // again and nothing was merged.
  ASSERT_TRUE(writer.WaitStored(In(milliseconds(20000))));
  lock.Release();
  EXPECT_DOUBLE_EQ(held.LateJoules(job.id()), 0);
  EXPECT_DOUBLE_EQ(store->Get(job.id())->result().energy().total_joules(), 10);
  // The queue is bounded.
  for (size_t i = 0; i < JobWriter::kMaxLateResults + 10; ++i) {
    writer.AddLateResult(LateRank1(job, 1));
  }
  EXPECT_TRUE(writer.WaitStored(In(milliseconds(20000))));
}

TEST(JobWriterTest, LogLinesAreBoundedSanitizedAndStoredInOrder) {
  auto store = Open(TempDb());
  Held held;
  JobWriter writer(store.get(), 400, held.Hooks());
  const v1::Job job = Inserted(*store, "logs");
  v1::LogReport report;
  report.set_job_id(job.id());
  report.set_attempt(1);
  report.set_dropped(3);
  for (int i = 0; i < JobWriter::kMaxLinesPerReport + 100; ++i) {
    v1::LogLine* l = report.add_lines();
    l->set_unix_ms(1000 + i);
    l->set_text(i == 0 ? std::string("bad \xff\xfe utf-8") : "line " + std::to_string(i));
  }
  // The note of dropped lines and at most kMaxLinesPerReport lines of one report.
  EXPECT_EQ(writer.AppendLog(job.id(), 1, report, 42), JobWriter::kMaxLinesPerReport + 1);
  // Lines are written after a batch's jobs; once none is pending, they are stored.
  ASSERT_TRUE(joule::testing::PollUntil([&] { return !writer.LogPending(job.id()); },
                                        milliseconds(10000), milliseconds(10)));
  EXPECT_FALSE(writer.LogPending(job.id()));
  absl::StatusOr<std::vector<v1::LogLine>> lines = store->ReadLog(job.id(), -1, 0, 10000);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), static_cast<size_t>(JobWriter::kMaxLinesPerReport + 1));
  EXPECT_NE((*lines)[0].text().find("3 lines dropped by the worker"), std::string::npos);
  EXPECT_EQ((*lines)[0].unix_ms(), 42);
  EXPECT_EQ((*lines)[1].text().find("bad "), 0u);
  EXPECT_EQ((*lines)[1].text().find('\xff'), std::string::npos);
  for (size_t i = 1; i < lines->size(); ++i) {
    EXPECT_EQ((*lines)[i].rank(), 1);
    EXPECT_EQ((*lines)[i].attempt(), 1);
    if (i > 1) {
      EXPECT_EQ((*lines)[i].unix_ms(), 1000 + static_cast<int64_t>(i) - 1);
    }
  }
}

// Whether a job's log lines are still on their way to the store is about that job's
// lines only: queued, or in the batch being written. Another job's batch in flight (on a
// busy coordinator, nearly always) leaves an ended job's log ended for its followers.
TEST(JobWriterTest, OnlyAJobsOwnLinesKeepItsLogPending) {
  auto store = Open(TempDb());
  Held held;
  // Each batch with jobs stops in its snapshot until the test lets it go on.
  std::mutex mu;
  std::condition_variable cv;
  int snapshots = 0, permits = 0;
  JobWriter::Hooks hooks = held.Hooks();
  hooks.snapshot = [&, inner = hooks.snapshot](const std::vector<int64_t>& ids) {
    std::unique_lock<std::mutex> lock(mu);
    const int mine = ++snapshots;
    cv.notify_all();
    cv.wait(lock, [&] { return permits >= mine; });
    lock.unlock();
    return inner(ids);
  };
  const auto batches_in_flight = [&](int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return snapshots >= n; });
  };
  const auto let_go = [&](int n) {
    std::lock_guard<std::mutex> lock(mu);
    permits = n;
    cv.notify_all();
  };
  const v1::Job other = Inserted(*store, "other");
  const v1::Job ended = Inserted(*store, "ended");
  const v1::Job quiet = Inserted(*store, "quiet");
  held.Set(other, 1);
  held.Set(ended, 1);
  JobWriter blocking(store.get(), 400, hooks);
  // Whatever fails below, every batch is let go before the writer stops.
  struct LetGoAll {
    std::function<void()> release;
    ~LetGoAll() { release(); }
  } let_go_all{[&] { let_go(1000); }};
  blocking.MarkDirty(other.id());
  ASSERT_TRUE(batches_in_flight(1));
  // The first batch (another job's) is being written; `ended`'s lines are queued.
  v1::LogReport report;
  report.set_attempt(1);
  report.add_lines()->set_text("last words");
  report.add_lines()->set_text("really");
  EXPECT_EQ(blocking.AppendLog(ended.id(), 0, report, 0), 2);
  blocking.MarkDirty(ended.id());
  EXPECT_TRUE(blocking.LogPending(ended.id()));
  EXPECT_FALSE(blocking.LogPending(quiet.id()));
  // The second batch holds `ended`'s lines: still pending while they are written.
  let_go(1);
  ASSERT_TRUE(batches_in_flight(2));
  EXPECT_TRUE(blocking.LogPending(ended.id()));
  EXPECT_FALSE(blocking.LogPending(quiet.id()));
  let_go(2);
  ASSERT_TRUE(joule::testing::PollUntil([&] { return !blocking.LogPending(ended.id()); },
                                        milliseconds(10000), milliseconds(10)));
  absl::StatusOr<std::vector<v1::LogLine>> lines = store->ReadLog(ended.id(), -1, 0, 100);
  ASSERT_TRUE(lines.ok()) << lines.status();
  EXPECT_EQ(lines->size(), 2u);
}

TEST(JobWriterTest, OneJobCannotCrowdOutTheOthersLines) {
  const std::string path = TempDb();
  auto store = Open(path);
  Held held;
  const v1::Job noisy = Inserted(*store, "noisy");
  const v1::Job quiet = Inserted(*store, "quiet");
  // Held by a lock, the writer cannot empty its queue: the bounds are what is measured.
  joule::testing::SqliteWriteLock lock(path);
  JobWriter writer(store.get(), 400, held.Hooks());
  v1::LogReport report;
  report.set_attempt(1);
  for (int i = 0; i < JobWriter::kMaxLinesPerReport; ++i) report.add_lines()->set_text("x");
  size_t noisy_taken = 0;
  for (size_t i = 0; i < 2 * JobWriter::kMaxPendingLogLinesPerJob / JobWriter::kMaxLinesPerReport;
       ++i) {
    noisy_taken += writer.AppendLog(noisy.id(), 0, report, 0);
  }
  // The writer may have taken one batch (its write fails and the lines are dropped), so
  // the noisy job got at most two jobs' bound, and the quiet one still has room.
  EXPECT_LE(noisy_taken, 2 * JobWriter::kMaxPendingLogLinesPerJob);
  EXPECT_EQ(writer.AppendLog(quiet.id(), 0, report, 0), JobWriter::kMaxLinesPerReport);
  lock.Release();
}

TEST(JobWriterTest, StopEndsPromptlyWhateverTheStoreDoes) {
  const std::string path = TempDb();
  auto store = Open(path);
  Held held;
  v1::Job job = Inserted(*store, "a");
  joule::testing::SqliteWriteLock lock(path);
  JobWriter writer(store.get(), 400, held.Hooks());
  job.set_state(v1::JOB_STATE_FAILED);
  held.Set(job, 1);
  writer.MarkDirty(job.id());
  const auto start = steady_clock::now();
  EXPECT_FALSE(writer.Stop(In(milliseconds(200))));
  // Bounded by the deadline plus one write's busy timeout and backoff, not by the store.
  EXPECT_LT(steady_clock::now() - start, milliseconds(5000));
  writer.Stop(In(milliseconds(0)));  // idempotent
  writer.MarkDirty(job.id());         // after Stop: queued, never written
  lock.Release();
  EXPECT_FALSE(writer.WaitStored(In(milliseconds(100))));
  EXPECT_EQ(held.StoredVersion(job.id()), 0u);
}

}  // namespace
}  // namespace joule::server
