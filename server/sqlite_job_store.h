#ifndef JOULE_SERVER_SQLITE_JOB_STORE_H_
#define JOULE_SERVER_SQLITE_JOB_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/job_store.h"

struct sqlite3;

namespace joule::server {

// The embedded JobStore: one SQLite file in WAL mode with synchronous=FULL, so a write
// that returned OK survives a crash of the process or the machine. For one coordinator on
// one machine (several processes may open the file; each write takes the file's lock).
// Thread-safe: one mutex serialises calls.
//
// Inserts commit in groups: concurrent Insert calls queue, and the first to find no group
// being written writes every queued job in one transaction (each under a savepoint, so one
// job's error leaves the others stored) and one fsync, then wakes the others with their
// outcomes (a "leader-follower" group commit, as MySQL's binlog and RocksDB's write groups
// do). A durable submit costs one fsync per group, not per job; one caller alone still
// commits alone, at once.
class SqliteJobStore final : public JobStore {
 public:
  // Opens (creating or migrating if needed) the database at `path`; ":memory:" for a
  // transient one. A write that finds the file locked by another connection retries for
  // `busy_timeout_ms`, then fails UNAVAILABLE ("database is locked").
  // Errors: UNAVAILABLE when the file cannot be opened or is not a Joule database;
  // FAILED_PRECONDITION when a newer coordinator's schema is in it.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                        int busy_timeout_ms);
  ~SqliteJobStore() override;

  std::string Describe() const override { return "sqlite " + path_; }
  absl::Status Insert(v1::Job* job, bool* existing) override;
  absl::StatusOr<v1::Job> GetByRequestId(const std::string& request_id) const override;
  absl::Status Update(const v1::Job& job) override;
  absl::StatusOr<v1::Job> Get(int64_t id) const override;
  using JobStore::List;
  absl::StatusOr<std::vector<v1::Job>> List(const std::vector<v1::JobState>& states,
                                            const std::map<std::string, std::string>& labels,
                                            int64_t before_id, int limit) const override;
  absl::Status AppendLog(int64_t job_id, const std::vector<v1::LogLine>& lines,
                         int max_lines_per_job) override;
  absl::StatusOr<std::vector<v1::LogLine>> ReadLog(int64_t job_id, int32_t rank, int64_t after_seq,
                                                   int limit) const override;
  absl::StatusOr<std::vector<v1::Job>> ListUnfinished() const override;
  absl::StatusOr<Leadership> Campaign(const std::string& holder, const std::string& address,
                                      int64_t ttl_ms) override;
  absl::Status Resign(const std::string& holder) override;

 private:
  SqliteJobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql);
  // The lease's epoch (0: none). Callers hold mu_.
  int64_t CurrentEpochLocked() const;
  // Creates the tables or brings them to kJobStoreSchemaVersion, in one transaction.
  absl::Status Migrate();
  // Insert's statement `sql` (fenced at `fence` unless 0) and the job's labels, inside the
  // caller's transaction; sets last_insert_id_. Callers hold mu_.
  absl::Status InsertLocked(const v1::Job& job, const std::string& record, const std::string& sql,
                            int64_t fence);
  // One queued Insert: its arguments and, once `done`, its outcome (guarded by group_mu_).
  struct PendingInsert {
    v1::Job* job = nullptr;
    bool* existing = nullptr;
    absl::Status status;
    bool done = false;
  };
  // Writes `group` in one transaction; sets each entry's status. Callers hold mu_.
  void InsertGroupLocked(const std::vector<PendingInsert*>& group);
  // One job of a group inside its open transaction, under a savepoint: its request id
  // looked up, else the row and labels inserted and `*id` set. Callers hold mu_.
  absl::Status InsertOneLocked(PendingInsert& p, int64_t* id);
  // job_labels rows for `spec`'s labels, of a job in `state`. Callers hold mu_, in a
  // transaction.
  absl::Status InsertLabelsLocked(int64_t job_id, const v1::JobSpec& spec, int state);
  // Update's statement on the jobs table alone. Callers hold mu_.
  absl::Status UpdateLocked(const v1::Job& job);
  // job_labels from every stored record (the migration to schema version 3).
  absl::Status BackfillLabelsLocked();
  mutable std::mutex mu_;
  int64_t last_insert_id_ = 0;  // guarded by mu_
  // The group commit's queue (taken before mu_, never while holding it).
  std::mutex group_mu_;
  std::condition_variable group_cv_;
  std::vector<PendingInsert*> group_queue_;  // guarded by group_mu_
  bool group_writing_ = false;               // guarded by group_mu_
  sqlite3* db_;
  const std::string path_;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_SQLITE_JOB_STORE_H_
