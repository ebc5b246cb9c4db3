#ifndef JOULE_SERVER_JOB_STORE_H_
#define JOULE_SERVER_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

struct sqlite3;

namespace joule::server {

// The coordinator's durable job table: one SQLite file in WAL mode with
// synchronous=FULL, so a write that returned OK survives a crash of the process or the
// machine. Each row holds the whole Job message (serialized) plus the columns that are
// queried (state, request id).
//
// Owned by the Coordinator. Thread-safe: one mutex serialises calls (a call may wait up
// to the busy timeout for another process's lock on the file, so callers must not hold
// their own locks across it).
class JobStore {
 public:
  // Opens (creating if needed) the database at `path`; ":memory:" for a transient one.
  // Errors: UNAVAILABLE when the file cannot be opened or is not a Joule database.
  // A write that finds the file locked by another connection retries for
  // `busy_timeout_ms`, then fails UNAVAILABLE ("database is locked").
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                        int busy_timeout_ms = 5000);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Stores a new job and assigns `job->id`. If `job->request_id()` is set and a job with
  // that request id exists, stores nothing, fills `*job` with the stored one and sets
  // `*existing`. Durable when it returns OK.
  absl::Status Insert(v1::Job* job, bool* existing);

  // The job submitted with `request_id`; NOT_FOUND when there is none.
  absl::StatusOr<v1::Job> GetByRequestId(const std::string& request_id) const;

  // Replaces the stored job with the same id. NOT_FOUND if there is none.
  absl::Status Update(const v1::Job& job);

  // NOT_FOUND names the id when there is no such job.
  absl::StatusOr<v1::Job> Get(int64_t id) const;

  // Jobs with id < `before_id` (all when 0), newest first, at most `limit`, filtered by
  // `state` unless it is JOB_STATE_UNSPECIFIED.
  absl::StatusOr<std::vector<v1::Job>> List(v1::JobState state, int64_t before_id,
                                            int limit) const {
    return List(std::vector<v1::JobState>{state}, before_id, limit);
  }
  // The same, in any of `states` (all when empty or when one is JOB_STATE_UNSPECIFIED).
  absl::StatusOr<std::vector<v1::Job>> List(const std::vector<v1::JobState>& states,
                                            int64_t before_id, int limit) const;

  // Appends a job's log lines (their rank, attempt, unix_ms and text; seq is assigned,
  // increasing), then keeps only the job's newest `max_lines_per_job`. One transaction.
  absl::Status AppendLog(int64_t job_id, const std::vector<v1::LogLine>& lines,
                         int max_lines_per_job);
  // A job's log lines with seq > after_seq (after_seq < 0: the newest -after_seq), of
  // `rank` (-1: all), oldest first, at most `limit`.
  absl::StatusOr<std::vector<v1::LogLine>> ReadLog(int64_t job_id, int32_t rank,
                                                   int64_t after_seq, int limit) const;

  // Every PENDING or RUNNING job, oldest first: what a restarted coordinator resumes.
  absl::StatusOr<std::vector<v1::Job>> ListUnfinished() const;

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql);
  mutable std::mutex mu_;
  sqlite3* db_;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_JOB_STORE_H_
