#ifndef JOULE_SERVER_JOB_STORE_H_
#define JOULE_SERVER_JOB_STORE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace joule::server {

// The schema version this coordinator writes. Both engines number their schema the same
// way and take the same steps between versions (server/sqlite_job_store.cc and
// server/postgres_job_store.cc each hold the SQL of every step); a store stamped with a
// newer version than this is refused, an older one is migrated on open, in one
// transaction, under a lock that keeps two coordinators from migrating at once.
// Versions: 1, the jobs and their logs; 2, the leader's lease (joule_leader); 3, the jobs'
// labels (job_labels, filled from the stored records when a store is migrated to it); 4,
// each label row also holds its job's state (job_labels.state, kept by Insert and Update,
// indexed with the label), so a page of one label's jobs in a rare state is one index
// range, not a walk over the label's jobs.
inline constexpr int kJobStoreSchemaVersion = 4;

// The lease of the coordinator that leads, as the store holds it.
struct Leadership {
  // The fencing token: 1 for the first leader, one more for each new one. Every write of
  // a fenced store (JobStore::Fence) carries it; the store refuses one whose epoch is not
  // the lease's.
  int64_t epoch = 0;
  std::string holder;   // the leader's id; "" when nobody ever led
  std::string address;  // the leader's gRPC address, for standbys to give clients
  bool ours = false;    // the caller holds the lease (and it runs for the ttl asked)
};

// The coordinator's durable job table: every job's record (the whole Job message,
// serialized) plus the columns that are queried (state, request id), and each job's log.
// Two engines behind one interface:
//   - SQLite (server/sqlite_job_store.h), the embedded default for one machine: one file
//     in WAL mode with synchronous=FULL;
//   - PostgreSQL (server/postgres_job_store.h), which several coordinators may share.
// A write that returned OK is durable: it survives a crash of the process or the machine
// (the engine's commit returned).
//
// Thread-safe; a call may wait up to the store's timeout (a lock, a server that does not
// answer), so callers must not hold their own locks across it. Errors: UNAVAILABLE when
// the store cannot be reached or is locked past the timeout (retry later),
// RESOURCE_EXHAUSTED when it is out of space, DATA_LOSS for a stored record that does not
// parse, NOT_FOUND as each call says.
class JobStore {
 public:
  // Opens the store at `location`, creating or migrating its schema:
  //   - "postgresql://..." or "postgres://..." (a libpq connection URI; credentials come
  //     from a password file or libpq's environment, never from the URI: one carrying a
  //     password is refused);
  //   - "sqlite:PATH", or a plain PATH, or ":memory:" for a transient SQLite store.
  // `timeout_ms`: how long a call waits for a lock (SQLite's busy timeout) or for the
  // server's answer (PostgreSQL), then fails UNAVAILABLE.
  // Errors: INVALID_ARGUMENT for a location of an unknown engine or a refused URI;
  // UNAVAILABLE when the store cannot be opened (PostgreSQL: no answer, a refused login);
  // FAILED_PRECONDITION for a schema newer than kJobStoreSchemaVersion or a PostgreSQL
  // database that is not a Joule store.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& location,
                                                        int timeout_ms = 5000);
  virtual ~JobStore() = default;

  // The engine and where the store is ("sqlite /path/jobs.db", "postgresql
  // joule@db.example:5432/joule"), for logs: never a credential.
  virtual std::string Describe() const = 0;

  // Stores a new job and assigns `job->id`. If `job->request_id()` is set and a job with
  // that request id exists, stores nothing, fills `*job` with the stored one and sets
  // `*existing`. Durable when it returns OK.
  virtual absl::Status Insert(v1::Job* job, bool* existing) = 0;

  // The job submitted with `request_id`; NOT_FOUND when there is none.
  virtual absl::StatusOr<v1::Job> GetByRequestId(const std::string& request_id) const = 0;

  // Replaces the stored job with the same id. NOT_FOUND if there is none.
  virtual absl::Status Update(const v1::Job& job) = 0;

  // NOT_FOUND names the id when there is no such job.
  virtual absl::StatusOr<v1::Job> Get(int64_t id) const = 0;

  // Jobs with id < `before_id` (all when 0), newest first, at most `limit`, filtered by
  // `state` unless it is JOB_STATE_UNSPECIFIED.
  absl::StatusOr<std::vector<v1::Job>> List(v1::JobState state, int64_t before_id,
                                            int limit) const {
    return List(std::vector<v1::JobState>{state}, {}, before_id, limit);
  }
  // The same, in any of `states` (all when empty or when one is JOB_STATE_UNSPECIFIED).
  absl::StatusOr<std::vector<v1::Job>> List(const std::vector<v1::JobState>& states,
                                            int64_t before_id, int limit) const {
    return List(states, {}, before_id, limit);
  }
  // The same, of the jobs whose spec has every one of `labels` (key and value, compared
  // byte for byte; a job's labels are those it was submitted with). Served by indexes at
  // any depth: jobs(state, id), job_labels(key, value, job_id) and job_labels(key, value,
  // state, job_id).
  virtual absl::StatusOr<std::vector<v1::Job>> List(
      const std::vector<v1::JobState>& states, const std::map<std::string, std::string>& labels,
      int64_t before_id, int limit) const = 0;

  // Appends a job's log lines (their rank, attempt, unix_ms and text; seq is assigned,
  // increasing), then keeps only the job's newest `max_lines_per_job`. One transaction.
  virtual absl::Status AppendLog(int64_t job_id, const std::vector<v1::LogLine>& lines,
                                 int max_lines_per_job) = 0;
  // A job's log lines with seq > after_seq (after_seq < 0: the newest -after_seq), of
  // `rank` (-1: all), oldest first, at most `limit`.
  virtual absl::StatusOr<std::vector<v1::LogLine>> ReadLog(int64_t job_id, int32_t rank,
                                                           int64_t after_seq, int limit) const = 0;

  // Every PENDING or RUNNING job, oldest first: what a restarted coordinator resumes.
  virtual absl::StatusOr<std::vector<v1::Job>> ListUnfinished() const = 0;

  // Leadership among coordinators sharing the store: one lease row whose expiry the
  // store's own clock decides (coordinators' clocks need not agree).
  // Campaign takes the lease for `ttl_ms` when nobody holds it, it has expired, or
  // `holder` (unique per coordinator process) holds it already (a renewal: same epoch,
  // unless it had expired, then a new one). Otherwise it returns the holder, not ours.
  // One atomic statement: two campaigners never both win.
  virtual absl::StatusOr<Leadership> Campaign(const std::string& holder, const std::string& address,
                                              int64_t ttl_ms) = 0;
  // Ends `holder`'s lease now (a clean shutdown), so that a standby need not wait for it
  // to expire. OK when `holder` does not hold it.
  virtual absl::Status Resign(const std::string& holder) = 0;
  // From now on every write (Insert, Update, AppendLog) succeeds only while the lease's
  // epoch is `epoch`, checked in the write's own transaction; a later leader's writes are
  // ordered after it. A refused write fails FAILED_PRECONDITION ("fenced") and stores
  // nothing. 0 (the default): writes are not fenced (one coordinator, no lease).
  void Fence(int64_t epoch) { fence_epoch_.store(epoch); }
  int64_t fence_epoch() const { return fence_epoch_.load(); }

 protected:
  JobStore() = default;
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

 private:
  std::atomic<int64_t> fence_epoch_{0};
};

// The refusal of a store stamped `stored` by a newer coordinator (FAILED_PRECONDITION),
// or OK when this coordinator knows that version. Shared by both engines.
absl::Status CheckSchemaVersion(int stored, const std::string& where);

// The refusal of a write fenced at `epoch` when the lease is at `current`
// (FAILED_PRECONDITION), shared by both engines.
absl::Status FencedError(int64_t epoch, int64_t current);

// A bit per state for List's filter (0: every state), shared by both engines.
int64_t StateMask(const std::vector<v1::JobState>& states);

// The SQL of List, newest first, selecting (id, record). Its parameters: 1 before_id, 2
// limit, then each label's key and value (3 and 4, 5 and 6, ...); `postgres` picks
// PostgreSQL's placeholders ($1::bigint) over SQLite's (?1). The states of `mask`
// (StateMask) are inlined as integers.
//  - States only: one index range scan of jobs(state, id) per state, each stopped at the
//    page's size, then merged, so that a page costs the same at any depth and a state
//    nobody is in costs nothing (one `state IN (...)` scan would read and sort every row of
//    those states below before_id).
//  - Labels: the first label's range of job_labels(key, value, state, job_id) per state
//    asked (of job_labels(key, value, job_id) for any state), newest first and cut at the
//    page's size like the states', each row checked for the other labels.
std::string ListJobsSql(int64_t mask, size_t labels, bool postgres);

}  // namespace joule::server

#endif  // JOULE_SERVER_JOB_STORE_H_
