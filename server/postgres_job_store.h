#ifndef JOULE_SERVER_POSTGRES_JOB_STORE_H_
#define JOULE_SERVER_POSTGRES_JOB_STORE_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/job_store.h"

namespace joule::server {

class PgConnection;

// The JobStore on a PostgreSQL server (libpq), which several coordinators may share.
// Tables: jobs (BIGSERIAL id, request_id BYTEA UNIQUE, state, record BYTEA) and job_logs;
// the request id and log text are stored as bytes, so any string a client sends (a NUL
// included) round-trips. A write is acknowledged when its COMMIT returned with
// synchronous_commit on (set by the store on every connection), so on a server with
// synchronous replication it is on the standby too.
//
// Calls never hang: each runs on a non-blocking connection and fails UNAVAILABLE when the
// server has not answered within the timeout; that connection is then dropped (a statement
// it sent may still commit, which is why submits carry request ids). A dropped or broken
// connection is replaced on the next call; reads are retried once on a fresh one.
//
// Thread-safe: a pool of at most kMaxConnections connections, one per call in flight.
class PostgresJobStore final : public JobStore {
 public:
  static constexpr int kMaxConnections = 8;

  // `uri`: a libpq connection URI (postgresql://[user@]host[:port][/dbname][?param=...];
  // https://www.postgresql.org/docs/15/libpq-connect.html). The password comes from a
  // password file (passfile=, PGPASSFILE, ~/.pgpass), PGPASSWORD or a service file; a URI
  // that carries one is refused (INVALID_ARGUMENT), and no error or log line repeats it.
  // Connects once (`timeout_ms` for the connection and for every statement after it) and
  // creates or migrates the schema. Errors: INVALID_ARGUMENT (a URI libpq cannot parse or
  // one with a password), UNAVAILABLE (no server, refused login, not a Joule database),
  // FAILED_PRECONDITION (a newer schema).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& uri, int timeout_ms);
  ~PostgresJobStore() override;

  std::string Describe() const override { return "postgresql " + where_; }
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
  PostgresJobStore(std::vector<std::string> keywords, std::vector<std::string> values,
                   std::string where, int timeout_ms);
  // A connection of the pool (an idle one, else a new one while fewer than
  // kMaxConnections are open, else the first one released).
  absl::StatusOr<std::unique_ptr<PgConnection>> Acquire() const;
  // Back to the pool, or closed when it broke.
  void Release(std::unique_ptr<PgConnection> conn) const;
  // Runs `call` on a pooled connection; once more on a new connection when the first
  // broke and `retry` (reads and other calls that are safe to repeat).
  template <typename T, typename F>
  absl::StatusOr<T> Run(bool retry, F call) const;
  absl::Status Migrate(PgConnection& conn) const;

  const std::vector<std::string> keywords_, values_;  // libpq's options, no password
  const std::string where_;                           // user@host:port/dbname
  const int timeout_ms_;
  mutable std::mutex mu_;
  mutable std::condition_variable released_;
  mutable std::vector<std::unique_ptr<PgConnection>> idle_;
  mutable int open_ = 0;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_POSTGRES_JOB_STORE_H_
