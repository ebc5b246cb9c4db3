#ifndef JOULE_SERVER_JOB_WRITER_H_
#define JOULE_SERVER_JOB_WRITER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "server/job_store.h"

namespace joule::server {

// Writes the coordinator's job changes to the store on a thread of its own, so that the
// coordinator never does I/O under its lock (DESIGN.md, "Durability"): changed jobs
// (MarkDirty), results that arrive after their job was stored as ended (AddLateResult),
// and the ranks' log lines (AppendLog).
//
// A batch: the jobs marked since the last one are read through Hooks::snapshot (their
// newest state, whatever happened since they were marked), stored one by one, and each
// write's outcome goes to Hooks::on_stored; then the late results are merged into their
// stored jobs (MergeLateResult, attempt.h); then the log lines, by job, in arrival order
// (after the jobs' state: diagnostics never delay what is durable). A failed job write is
// retried in the next batch; after a batch with a failure the writer waits (50 ms,
// doubling to 2 s) before the next. A late result is tried kLateResultTries times, then
// dropped with a log line; log lines a write could not store are dropped with a warning.
//
// Bounds: at most kMaxLateResults late results and kMaxPendingLogLines log lines wait
// (kMaxPendingLogLinesPerJob of one job, so a noisy job cannot crowd out the others');
// what comes beyond is dropped and counted.
//
// Thread-safe. Hooks run on the writer's thread without the writer's lock, so they may
// take the caller's lock; MarkDirty, AddLateResult and AppendLog may be called under it
// (the order is: the caller's lock, then the writer's).
class JobWriter {
 public:
  struct Hooks {
    // The newest state of each job of `ids` still held, with its version (a counter the
    // caller bumps at every change); jobs no longer held are left out.
    std::function<std::vector<std::pair<v1::Job, uint64_t>>(const std::vector<int64_t>& ids)>
        snapshot;
    // The write of job `id` at `version` ended: OK when stored, else the store's error
    // (the writer tries the job again in its next batch).
    std::function<void(int64_t id, uint64_t version, const absl::Status& status)> on_stored;
    // A late result was merged into a job that had ended and was stored: the job as it is
    // stored now, and the joules the result added.
    std::function<void(const v1::Job& job, double added_joules)> on_late_result_stored;
  };
  struct LateResult {
    int32_t rank = 0;
    std::string worker_id;
    v1::ResultReport report;
  };

  static constexpr size_t kMaxLateResults = 1024;
  static constexpr int kLateResultTries = 5;
  static constexpr size_t kMaxPendingLogLines = 100000;
  static constexpr size_t kMaxPendingLogLinesPerJob = 10000;
  // Lines the store keeps per job (the newest).
  static constexpr int kMaxLogLinesPerJob = 20000;
  // At most this many lines of one LogReport are taken.
  static constexpr int kMaxLinesPerReport = 500;

  // `store` is not owned and outlives the writer. `grid_gco2_per_kwh` prices the CO2 of
  // late results' energy (EnergyReport). Starts the thread.
  JobWriter(JobStore* store, double grid_gco2_per_kwh, Hooks hooks);
  // Stops the thread (Stop with no wait, when it was not called).
  ~JobWriter();
  JobWriter(const JobWriter&) = delete;
  JobWriter& operator=(const JobWriter&) = delete;

  // Job `id` changed: its newest state is written in the next batch.
  void MarkDirty(int64_t id);
  // A result for a job the caller no longer holds (ended and stored). False when
  // kMaxLateResults already wait (it is dropped, with a log line).
  bool AddLateResult(LateResult late);
  // The lines of `report` (a rank's log; at most kMaxLinesPerReport of them, their text
  // made valid UTF-8 and cut to 2 KiB) as lines of `rank`, plus a line saying how many
  // the worker dropped, stamped `now_unix_ms`; returns how many were taken (the rest
  // are past the bounds).
  int AppendLog(int64_t job_id, int32_t rank, const v1::LogReport& report, int64_t now_unix_ms);
  // Whether log lines of `job_id` wait for the store or are being written to it: a
  // follower of an ended job's log is not done yet. (Other jobs' writes do not count: on
  // a busy coordinator a batch is nearly always being written.)
  bool LogPending(int64_t job_id) const;

  // Blocks until everything marked or added so far is stored (or dropped, for late
  // results past their tries) and no batch is in flight, or `deadline` passes; false on
  // timeout. Log lines are not waited for.
  bool WaitStored(std::chrono::steady_clock::time_point deadline);
  // Gives what is queued until `deadline` to be stored, then stops the thread; false when
  // something was left unstored. Idempotent; nothing is written after it returns.
  bool Stop(std::chrono::steady_clock::time_point deadline);

 private:
  void Loop();
  bool IdleLocked() const { return dirty_.empty() && late_.empty() && !writing_; }
  // Merges `late` into their stored jobs; returns those to try again.
  std::deque<std::pair<LateResult, int>> StoreLateResults(
      std::deque<std::pair<LateResult, int>> late);

  JobStore* const store_;
  const double grid_gco2_per_kwh_;
  const Hooks hooks_;

  mutable std::mutex mu_;
  std::condition_variable wake_;    // work arrived, or stop
  std::condition_variable stored_;  // a batch ended
  std::set<int64_t> dirty_;
  std::deque<std::pair<LateResult, int>> late_;  // with the tries so far
  std::vector<std::pair<int64_t, v1::LogLine>> logs_;
  std::map<int64_t, size_t> logs_by_job_;
  bool writing_ = false;  // a batch is being written outside mu_
  std::set<int64_t> logs_writing_;  // the jobs whose log lines that batch holds
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_JOB_WRITER_H_
