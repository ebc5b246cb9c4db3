#include "server/postgres_job_store.h"

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace joule::server {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

// libpq's messages end in a newline and may span lines ("DETAIL: ..."): one line.
std::string OneLine(const char* message) {
  std::string s = absl::StrReplaceAll(message ? message : "", {{"\n", " "}, {"\t", " "}});
  absl::StripAsciiWhitespace(&s);
  return s.empty() ? "no message" : s;
}

// A statement's parameter: text (numbers, arrays) or binary (bytea), or NULL.
struct Param {
  std::string value;
  bool binary = false;
  bool null = false;
};
Param Int(int64_t v) { return {std::to_string(v)}; }
Param Bytes(const std::string& b) { return {b, true}; }
// A bytea[] in text form: {"\\x6162",...} (inside an array literal's quotes a backslash
// is escaped, and bytea's text input reads \x and hex digits).
Param ByteaArray(const std::vector<std::string>& items) {
  static const char kHex[] = "0123456789abcdef";
  std::string text = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    text += i == 0 ? "\"\\\\x" : ",\"\\\\x";
    for (unsigned char c : items[i]) {
      text += kHex[c >> 4];
      text += kHex[c & 15];
    }
    text += '"';
  }
  text += '}';
  return {text};
}
// A bigint[] in text form.
Param IntArray(const std::vector<int64_t>& items) {
  return {absl::StrCat("{", absl::StrJoin(items, ","), "}")};
}

// Waits until the connection's socket is readable (or writable too, when `write`), up to
// `deadline`. False on timeout; true when ready or on a poll error (libpq then reports
// the failure).
bool WaitSocket(PGconn* conn, bool write, SteadyClock::time_point deadline) {
  pollfd p{PQsocket(conn), static_cast<short>(POLLIN | (write ? POLLOUT : 0)), 0};
  if (p.fd < 0) return true;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return false;
    const int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;
  }
}

// Binary-format result cells: int4/int8 big-endian, bytea raw.
int64_t CellInt(const PGresult* r, int row, int col) {
  const auto* p = reinterpret_cast<const unsigned char*>(PQgetvalue(r, row, col));
  const int len = PQgetlength(r, row, col);
  uint64_t v = 0;
  for (int i = 0; i < len; ++i) v = (v << 8) | p[i];
  if (len == 4) return static_cast<int32_t>(static_cast<uint32_t>(v));
  return static_cast<int64_t>(v);
}
std::string CellBytes(const PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<size_t>(PQgetlength(r, row, col)));
}

absl::StatusOr<std::vector<v1::Job>> ResultJobs(const PGresult* r) {
  std::vector<v1::Job> jobs;
  jobs.reserve(PQntuples(r));
  for (int i = 0; i < PQntuples(r); ++i) {
    v1::Job job;
    const int64_t id = CellInt(r, i, 0);
    if (!job.ParseFromArray(PQgetvalue(r, i, 1), PQgetlength(r, i, 1))) {
      return absl::DataLossError(
          absl::StrCat("job store: job ", id, " has a record that does not parse"));
    }
    job.set_id(id);  // the row's id is the truth (Insert stores 0)
    jobs.push_back(std::move(job));
  }
  return jobs;
}

// The SQL of each schema version's step, as server/sqlite_job_store.cc numbers them.
const std::vector<std::vector<const char*>>& PgMigrationSteps() {
  static const auto* steps = new std::vector<std::vector<const char*>>{
      {
          "CREATE TABLE jobs ("
          "  id BIGSERIAL PRIMARY KEY,"
          "  request_id BYTEA UNIQUE,"
          "  state INTEGER NOT NULL,"
          "  record BYTEA NOT NULL)",
          "CREATE INDEX jobs_state ON jobs(state, id)",
          "CREATE TABLE job_logs ("
          "  seq BIGSERIAL PRIMARY KEY,"
          "  job_id BIGINT NOT NULL,"
          "  rank INTEGER NOT NULL,"
          "  attempt INTEGER NOT NULL,"
          "  unix_ms BIGINT NOT NULL,"
          "  text BYTEA NOT NULL)",
          "CREATE INDEX job_logs_job ON job_logs(job_id, seq)",
      },
      {
          "CREATE TABLE joule_leader ("
          "  id INTEGER PRIMARY KEY CHECK (id = 1),"
          "  epoch BIGINT NOT NULL,"
          "  holder BYTEA NOT NULL,"
          "  address BYTEA NOT NULL,"
          "  expires_ms BIGINT NOT NULL)",
      },
      {
          // Filled from the stored records by Migrate (BackfillLabels).
          "CREATE TABLE job_labels ("
          "  key BYTEA NOT NULL,"
          "  value BYTEA NOT NULL,"
          "  job_id BIGINT NOT NULL,"
          "  PRIMARY KEY (key, value, job_id))",
      },
      {
          // Version 4 (as SQLite's): each label row holds its job's state.
          "ALTER TABLE job_labels ADD COLUMN state INTEGER NOT NULL DEFAULT 0",
          "UPDATE job_labels l SET state = j.state FROM jobs j WHERE j.id = l.job_id",
          "CREATE INDEX job_labels_state ON job_labels(key, value, state, job_id)",
      },
  };
  return *steps;
}

// The server's clock in unix milliseconds: the lease's only clock.
#define JOULE_PG_NOW_MS "(extract(epoch from clock_timestamp()) * 1000)::bigint"

// The lease row, locked for share until the statement's transaction ends: a campaign
// that would move the epoch waits for the write, and a write after it finds no row.
constexpr const char* kLeaseCte =
    "WITH lease AS (SELECT epoch FROM joule_leader WHERE id = 1 AND epoch = $4::bigint FOR "
    "SHARE) ";

// OK when the lease is at `epoch`, else the fenced refusal (also when no lease exists).
absl::Status CheckLease(PgConnection& c, int64_t epoch);
// Fills job_labels from the stored records (PostgresJobStore::List).
absl::Status BackfillLabels(PgConnection& conn);

// How long one migration statement may take (a whole table rewritten on a large store).
constexpr std::chrono::minutes kMigrationTimeout{30};

// The advisory lock every coordinator takes to migrate (its value: "joule" in ASCII).
constexpr int64_t kMigrationLock = 0x6a6f756c65;

}  // namespace

// One libpq connection in non-blocking mode. Not thread-safe: the pool hands it to one
// call at a time.
class PgConnection {
 public:
  ~PgConnection() { PQfinish(conn_); }

  static absl::StatusOr<std::unique_ptr<PgConnection>> Connect(
      const std::vector<std::string>& keywords, const std::vector<std::string>& values,
      const std::string& where, std::chrono::milliseconds timeout) {
    std::vector<const char*> k, v;
    for (size_t i = 0; i < keywords.size(); ++i) {
      k.push_back(keywords[i].c_str());
      v.push_back(values[i].c_str());
    }
    k.push_back(nullptr);
    v.push_back(nullptr);
    auto c = std::unique_ptr<PgConnection>(
        new PgConnection(PQconnectStartParams(k.data(), v.data(), /*expand_dbname=*/0)));
    if (c->conn_ == nullptr) return absl::ResourceExhaustedError("job store: out of memory");
    const auto deadline = SteadyClock::now() + timeout;
    PostgresPollingStatusType poll_status = PGRES_POLLING_WRITING;
    while (PQstatus(c->conn_) != CONNECTION_BAD && poll_status != PGRES_POLLING_OK &&
           poll_status != PGRES_POLLING_FAILED) {
      if (!WaitSocket(c->conn_, poll_status == PGRES_POLLING_WRITING, deadline)) {
        return absl::UnavailableError(absl::StrCat("job store: cannot connect to ", where,
                                                   ": no answer within ", timeout.count(), " ms"));
      }
      poll_status = PQconnectPoll(c->conn_);
    }
    if (PQstatus(c->conn_) != CONNECTION_OK) {
      return absl::UnavailableError(absl::StrCat("job store: cannot connect to ", where, ": ",
                                                 OneLine(PQerrorMessage(c->conn_))));
    }
    // The server's notices (a WARNING as it shuts down) would go to stderr.
    PQsetNoticeProcessor(
        c->conn_, [](void*, const char*) {}, nullptr);
    if (PQsetnonblocking(c->conn_, 1) != 0) {
      return absl::UnavailableError(
          absl::StrCat("job store: ", where, ": ", OneLine(PQerrorMessage(c->conn_))));
    }
    c->timeout_ = timeout;
    // Acknowledge a write only once it is flushed (and replicated where the server asks
    // for synchronous standbys), whatever the server's or role's default.
    // A statement the server starts late (it was paused, it waited for a lock) and that
    // runs past this store's timeout is ended by the server: this side has long reported
    // it failed.
    for (const std::string& setting : {std::string("SET synchronous_commit TO on"),
                                       absl::StrCat("SET statement_timeout TO ", timeout.count()),
                                       absl::StrCat("SET lock_timeout TO ", timeout.count())}) {
      if (absl::StatusOr<Result> r = c->Exec(setting.c_str(), {}, "connect"); !r.ok()) {
        return r.status();
      }
    }
    return c;
  }

  bool broken() const { return broken_ || PQstatus(conn_) != CONNECTION_OK; }
  // How long a statement may go unanswered before the call fails (Connect's timeout).
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // No transaction open.
  bool idle() const { return PQtransactionStatus(conn_) == PQTRANS_IDLE; }

  // False when the server may have closed this idle connection (a restart, an
  // administrator's pg_terminate_backend, an idle timeout): an idle session is sent nothing
  // by a server that keeps it (this store LISTENs to nothing), so a readable socket means
  // end-of-file or the server's goodbye. Nothing is sent.
  bool StillOpen() const {
    pollfd p{PQsocket(conn_), POLLIN, 0};
    if (p.fd < 0 || broken()) return false;
    return poll(&p, 1, 0) == 0;
  }

  // Runs one statement with `params`, results in binary format. Errors: UNAVAILABLE
  // (RESOURCE_EXHAUSTED for the server's SQLSTATE class 53, out of space or memory), the
  // message prefixed with `what`; the connection is broken() after a timeout or a lost
  // connection.
  absl::StatusOr<Result> Exec(const char* sql, const std::vector<Param>& params,
                              absl::string_view what) {
    std::vector<const char*> values;
    std::vector<int> lengths, formats;
    for (const Param& p : params) {
      values.push_back(p.null ? nullptr : p.value.data());
      lengths.push_back(static_cast<int>(p.value.size()));
      formats.push_back(p.binary ? 1 : 0);
    }
    const auto deadline = SteadyClock::now() + timeout_;
    if (!PQsendQueryParams(conn_, sql, static_cast<int>(params.size()), nullptr, values.data(),
                           lengths.data(), formats.data(), /*resultFormat=*/1)) {
      return Failed(what);
    }
    int flushed;
    while ((flushed = PQflush(conn_)) == 1) {
      if (!WaitSocket(conn_, /*write=*/true, deadline)) return TimedOut(what);
      if (!PQconsumeInput(conn_)) return Failed(what);
    }
    if (flushed < 0) return Failed(what);
    Result last;
    absl::Status error;
    for (;;) {
      while (PQisBusy(conn_)) {
        if (!WaitSocket(conn_, /*write=*/false, deadline)) return TimedOut(what);
        if (!PQconsumeInput(conn_)) return Failed(what);
      }
      Result r(PQgetResult(conn_));
      if (!r) break;
      const ExecStatusType st = PQresultStatus(r.get());
      if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && error.ok()) {
        error = ResultError(r.get(), what);
      }
      last = std::move(r);
    }
    if (!error.ok()) return error;
    if (!last) return Failed(what);
    return last;
  }

 private:
  explicit PgConnection(PGconn* conn) : conn_(conn) {}

  absl::Status Failed(absl::string_view what) {
    broken_ = true;
    return absl::UnavailableError(
        absl::StrCat("job store: ", what, ": ", OneLine(PQerrorMessage(conn_))));
  }
  absl::Status TimedOut(absl::string_view what) {
    broken_ = true;  // the statement may still run: never reuse a connection mid-statement
    return absl::UnavailableError(absl::StrCat(
        "job store: ", what, ": the server gave no answer within ", timeout_.count(), " ms"));
  }
  absl::Status ResultError(const PGresult* r, absl::string_view what) {
    const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    std::string message = absl::StrCat("job store: ", what, ": ", OneLine(PQresultErrorMessage(r)));
    if (state != nullptr && std::strncmp(state, "53", 2) == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat(message, " (free space or memory on the PostgreSQL server)"));
    }
    // Class 08 (connection) and 57P (the server shutting down) end the session.
    if (state != nullptr &&
        (std::strncmp(state, "08", 2) == 0 || std::strncmp(state, "57P", 3) == 0)) {
      broken_ = true;
    }
    return absl::UnavailableError(message);
  }

  PGconn* conn_;
  bool broken_ = false;
  std::chrono::milliseconds timeout_{5000};
};

absl::StatusOr<std::unique_ptr<JobStore>> PostgresJobStore::Open(const std::string& uri,
                                                                 int timeout_ms) {
  char* parse_error = nullptr;
  PQconninfoOption* options = PQconninfoParse(uri.c_str(), &parse_error);
  if (options == nullptr) {
    // libpq's message quotes the part it could not read, which may be a password: only
    // what kind of thing is wrong, never the text.
    PQfreemem(parse_error);
    return absl::InvalidArgumentError(
        "job store: not a PostgreSQL connection URI (postgresql://[user@]host[:port][/dbname]"
        "[?param=value...]; "
        "https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-CONNSTRING)");
  }
  std::vector<std::string> keywords, values;
  std::string user, host, port, dbname;
  bool password = false;
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const std::string k = o->keyword;
    if (k == "password" || k == "sslpassword") {
      password = true;
      continue;
    }
    if (k == "user") user = o->val;
    if (k == "host" || k == "hostaddr") host = host.empty() ? o->val : host;
    if (k == "port") port = o->val;
    if (k == "dbname") dbname = o->val;
    keywords.push_back(k);
    values.push_back(o->val);
  }
  PQconninfoFree(options);
  if (password) {
    return absl::InvalidArgumentError(
        "job store: the PostgreSQL URI carries a password (password= or sslpassword=); give "
        "it in a password file "
        "(passfile=, PGPASSFILE or ~/.pgpass), PGPASSWORD or a service file instead, so that "
        "it is never on a command line or in a log");
  }
  if (std::find(keywords.begin(), keywords.end(), "application_name") == keywords.end()) {
    keywords.push_back("application_name");
    values.push_back("joule-coordinator");
  }
  std::string where =
      absl::StrCat(user.empty() ? "" : user + "@", host.empty() ? "localhost" : host,
                   port.empty() ? "" : ":" + port, "/", dbname);
  std::unique_ptr<PostgresJobStore> store(
      new PostgresJobStore(std::move(keywords), std::move(values), std::move(where), timeout_ms));
  absl::StatusOr<std::unique_ptr<PgConnection>> conn = store->Acquire();
  if (!conn.ok()) return conn.status();
  absl::Status migrated = store->Migrate(**conn);
  store->Release(*std::move(conn));
  if (!migrated.ok()) return migrated;
  return store;
}

PostgresJobStore::PostgresJobStore(std::vector<std::string> keywords,
                                   std::vector<std::string> values, std::string where,
                                   int timeout_ms)
    : keywords_(std::move(keywords)),
      values_(std::move(values)),
      where_(std::move(where)),
      timeout_ms_(timeout_ms) {}

PostgresJobStore::~PostgresJobStore() = default;

absl::StatusOr<std::unique_ptr<PgConnection>> PostgresJobStore::Acquire() const {
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      released_.wait(lock, [&] { return !idle_.empty() || open_ < kMaxConnections; });
      if (idle_.empty()) break;
      std::unique_ptr<PgConnection> c = std::move(idle_.back());
      idle_.pop_back();
      if (c->StillOpen()) return c;
      --open_;  // closed by the server while idle: replaced below or by the next idle one
      released_.notify_one();
    }
    ++open_;  // reserved while connecting, outside the lock
  }
  absl::StatusOr<std::unique_ptr<PgConnection>> c =
      PgConnection::Connect(keywords_, values_, where_, std::chrono::milliseconds(timeout_ms_));
  if (!c.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    --open_;
    released_.notify_one();
  }
  return c;
}

void PostgresJobStore::Release(std::unique_ptr<PgConnection> conn) const {
  // One left inside a transaction (a ROLLBACK that failed) is never reused.
  const bool broken = conn->broken() || !conn->idle();
  if (broken) conn.reset();  // closed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (broken) {
    --open_;
  } else {
    idle_.push_back(std::move(conn));
  }
  released_.notify_one();
}

template <typename T, typename F>
absl::StatusOr<T> PostgresJobStore::Run(bool retry, F call) const {
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<std::unique_ptr<PgConnection>> conn = Acquire();
    if (!conn.ok()) return conn.status();
    absl::StatusOr<T> result = call(**conn);
    const bool broke = (*conn)->broken();
    Release(*std::move(conn));
    // A connection the server closed while it sat idle (a restart) fails the first
    // statement sent on it; a read is safe to send again on a new one.
    if (result.ok() || !broke || !retry || attempt > 0) return result;
  }
}

absl::Status PostgresJobStore::Migrate(PgConnection& conn) const {
  auto step = [&](const char* sql, std::vector<Param> params = {}) -> absl::StatusOr<Result> {
    return conn.Exec(sql, params, "schema");
  };
  absl::Status status = [&]() -> absl::Status {
    if (auto r = step("BEGIN"); !r.ok()) return r.status();
    if (auto r = step("SELECT pg_advisory_xact_lock($1::bigint)", {Int(kMigrationLock)}); !r.ok()) {
      return r.status();
    }
    // A database with a jobs table but no version stamp is someone else's.
    absl::StatusOr<Result> probe =
        step("SELECT to_regclass('joule_schema') IS NOT NULL, to_regclass('jobs') IS NOT NULL");
    if (!probe.ok()) return probe.status();
    const bool has_schema = PQgetvalue(probe->get(), 0, 0)[0] != 0;
    const bool has_jobs = PQgetvalue(probe->get(), 0, 1)[0] != 0;
    if (!has_schema && has_jobs) {
      return absl::FailedPreconditionError(
          absl::StrCat("job store: ", where_,
                       " has a jobs table that Joule did not create "
                       "(no joule_schema table): not a Joule store"));
    }
    int stored = 0;
    if (has_schema) {
      absl::StatusOr<Result> v = step("SELECT coalesce(max(version), 0)::bigint FROM joule_schema");
      if (!v.ok()) return v.status();
      stored = static_cast<int>(CellInt(v->get(), 0, 0));
    } else if (auto r = step("CREATE TABLE joule_schema (version INTEGER NOT NULL)"); !r.ok()) {
      return r.status();
    }
    if (absl::Status s = CheckSchemaVersion(stored, Describe()); !s.ok()) return s;
    if (stored < kJobStoreSchemaVersion) {
      // Steps that rewrite whole tables (version 4 gives every label row its job's state)
      // take minutes on millions of jobs: not under the store's per-statement timeout.
      conn.set_timeout(kMigrationTimeout);
      if (auto r = step("SET LOCAL statement_timeout = 0"); !r.ok()) return r.status();
    }
    for (int v = stored; v < kJobStoreSchemaVersion; ++v) {
      for (const char* sql : PgMigrationSteps()[v]) {
        if (auto r = step(sql); !r.ok()) return r.status();
      }
    }
    // job_labels was made by this migration: filled from the records, in today's layout.
    if (stored < 3) {
      if (absl::Status s = BackfillLabels(conn); !s.ok()) return s;
    }
    if (stored < kJobStoreSchemaVersion) {
      if (auto r = step("INSERT INTO joule_schema(version) VALUES ($1::int)",
                        {Int(kJobStoreSchemaVersion)});
          !r.ok()) {
        return r.status();
      }
    }
    auto r = step("COMMIT");
    return r.status();
  }();
  if (!status.ok() && !conn.broken()) (void)conn.Exec("ROLLBACK", {}, "schema");
  conn.set_timeout(std::chrono::milliseconds(timeout_ms_));
  return status;
}

absl::Status PostgresJobStore::Insert(v1::Job* job, bool* existing) {
  *existing = false;
  // The record is stored without its id, which the row's id supplies on every read. One
  // statement, committed on its own: acknowledged only once durable. A request id already
  // stored inserts nothing and returns no row.
  job->set_id(0);
  const std::string record = job->SerializeAsString();
  Param request = job->request_id().empty() ? Param{"", false, true} : Bytes(job->request_id());
  const int64_t fence = fence_epoch();
  // The job and its labels in one statement (a data-modifying WITH runs once, whether or
  // not the query reads it); fenced, the lease row is locked for share first.
  const int labels_param = fence == 0 ? 4 : 5;
  const std::string insert_job =
      fence == 0 ? "INSERT INTO jobs(request_id, state, record) VALUES ($1::bytea, $2::int, "
                   "$3::bytea) ON CONFLICT (request_id) DO NOTHING RETURNING id"
                 : "INSERT INTO jobs(request_id, state, record) SELECT $1::bytea, $2::int, "
                   "$3::bytea FROM lease ON CONFLICT (request_id) DO NOTHING RETURNING id";
  const std::string sql = absl::StrCat(
      fence == 0 ? "WITH " : absl::StrCat(kLeaseCte, ", "), "ins AS (", insert_job,
      "), labels AS (INSERT INTO job_labels(key, value, job_id, state) SELECT l.key, l.value, "
      "ins.id, $2::int FROM ins, unnest($",
      labels_param, "::bytea[], $", labels_param + 1,
      "::bytea[]) AS l(key, value)) SELECT id FROM ins");
  std::vector<std::string> keys, values;
  for (const auto& [key, value] : job->spec().labels()) {
    keys.push_back(key);
    values.push_back(value);
  }
  std::vector<Param> params = {request, Int(job->state()), Bytes(record)};
  if (fence != 0) params.push_back(Int(fence));
  params.push_back(ByteaArray(keys));
  params.push_back(ByteaArray(values));
  absl::StatusOr<int64_t> id = Run<int64_t>(false, [&](PgConnection& c) -> absl::StatusOr<int64_t> {
    absl::StatusOr<Result> r = c.Exec(sql.c_str(), params, "insert");
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) == 1) return CellInt(r->get(), 0, 0);
    // No row: the request id is stored already, or the lease moved on.
    if (fence != 0) {
      if (absl::Status s = CheckLease(c, fence); !s.ok()) return s;
    }
    return int64_t{0};
  });
  if (!id.ok()) return id.status();
  if (*id > 0) {
    job->set_id(*id);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::Job> stored = GetByRequestId(job->request_id());
  if (!stored.ok()) return stored.status();
  *job = *std::move(stored);
  *existing = true;
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> PostgresJobStore::GetByRequestId(const std::string& request_id) const {
  absl::StatusOr<std::vector<v1::Job>> jobs =
      Run<std::vector<v1::Job>>(true, [&](PgConnection& c) -> absl::StatusOr<std::vector<v1::Job>> {
        absl::StatusOr<Result> r =
            c.Exec("SELECT id, record FROM jobs WHERE request_id = $1::bytea", {Bytes(request_id)},
                   "lookup");
        if (!r.ok()) return r.status();
        return ResultJobs(r->get());
      });
  if (!jobs.ok()) return jobs.status();
  if (jobs->empty())
    return absl::NotFoundError(absl::StrCat("no job with request id ", request_id));
  return std::move(jobs->front());
}

absl::Status PostgresJobStore::Update(const v1::Job& job) {
  const std::string record = job.SerializeAsString();
  // The same record written twice is the same row: safe to send again.
  const int64_t fence = fence_epoch();
  const bool labels = !job.spec().labels().empty();
  const std::string update_job = absl::StrCat(
      "UPDATE jobs SET state = $1::int, record = $2::bytea WHERE id = $3::bigint",
      fence == 0 ? "" : " AND EXISTS (SELECT 1 FROM lease)", labels ? " RETURNING id" : "");
  std::string sql;
  std::vector<Param> params = {Int(job.state()), Bytes(record), Int(job.id())};
  if (fence != 0) params.push_back(Int(fence));
  if (!labels) {
    sql = fence == 0 ? update_job : absl::StrCat(kLeaseCte, update_job);
  } else {
    // The job's label rows take its state in the same statement (a data-modifying WITH
    // runs whether or not the query reads it).
    const int k = static_cast<int>(params.size()) + 1;
    sql = absl::StrCat(fence == 0 ? "WITH " : absl::StrCat(kLeaseCte, ", "), "upd AS (", update_job,
                       "), labels AS (UPDATE job_labels SET state = $1::int WHERE job_id = "
                       "$3::bigint AND EXISTS (SELECT 1 FROM upd) AND (key, value) IN (SELECT * "
                       "FROM unnest($",
                       k, "::bytea[], $", k + 1,
                       "::bytea[])) AND state <> $1::int) SELECT count(*) FROM upd");
    std::vector<std::string> keys, values;
    for (const auto& [key, value] : job.spec().labels()) {
      keys.push_back(key);
      values.push_back(value);
    }
    params.push_back(ByteaArray(keys));
    params.push_back(ByteaArray(values));
  }
  absl::StatusOr<bool> updated = Run<bool>(true, [&](PgConnection& c) -> absl::StatusOr<bool> {
    absl::StatusOr<Result> r = c.Exec(sql.c_str(), params, "update");
    if (!r.ok()) return r.status();
    const bool done = labels ? PQntuples(r->get()) == 1 && CellInt(r->get(), 0, 0) > 0
                             : absl::string_view(PQcmdTuples(r->get())) != "0";
    if (done) return true;
    if (fence != 0) {
      if (absl::Status s = CheckLease(c, fence); !s.ok()) return s;
    }
    return false;
  });
  if (!updated.ok()) return updated.status();
  if (!*updated) {
    return absl::NotFoundError(absl::StrCat("job store: no job ", job.id(), " to update"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> PostgresJobStore::Get(int64_t id) const {
  absl::StatusOr<std::vector<v1::Job>> jobs =
      Run<std::vector<v1::Job>>(true, [&](PgConnection& c) -> absl::StatusOr<std::vector<v1::Job>> {
        absl::StatusOr<Result> r =
            c.Exec("SELECT id, record FROM jobs WHERE id = $1::bigint", {Int(id)}, "get");
        if (!r.ok()) return r.status();
        return ResultJobs(r->get());
      });
  if (!jobs.ok()) return jobs.status();
  if (jobs->empty()) return absl::NotFoundError(absl::StrCat("job ", id, " does not exist"));
  return std::move(jobs->front());
}

absl::StatusOr<std::vector<v1::Job>> PostgresJobStore::List(
    const std::vector<v1::JobState>& states, const std::map<std::string, std::string>& labels,
    int64_t before_id, int limit) const {
  std::vector<Param> params = {Int(before_id > 0 ? before_id : INT64_MAX), Int(limit)};
  for (const auto& [key, value] : labels) {
    params.push_back(Bytes(key));
    params.push_back(Bytes(value));
  }
  const std::string sql = ListJobsSql(StateMask(states), labels.size(), /*postgres=*/true);
  return Run<std::vector<v1::Job>>(true,
                                   [&](PgConnection& c) -> absl::StatusOr<std::vector<v1::Job>> {
                                     absl::StatusOr<Result> r = c.Exec(sql.c_str(), params, "list");
                                     if (!r.ok()) return r.status();
                                     return ResultJobs(r->get());
                                   });
}

// job_labels from every stored record, 5,000 rows at a time, in the caller's transaction
// (the migration to schema version 3). A record that does not parse keeps no labels here;
// reading it says DATA_LOSS.
namespace {
absl::Status BackfillLabels(PgConnection& conn) {
  int64_t after = 0;
  for (;;) {
    absl::StatusOr<Result> rows =
        conn.Exec("SELECT id, record, state FROM jobs WHERE id > $1::bigint ORDER BY id LIMIT 5000",
                  {Int(after)}, "label backfill");
    if (!rows.ok()) return rows.status();
    const int n = PQntuples(rows->get());
    if (n == 0) return absl::OkStatus();
    std::vector<std::string> keys, values;
    std::vector<int64_t> ids, states;
    for (int i = 0; i < n; ++i) {
      after = CellInt(rows->get(), i, 0);
      v1::Job job;
      if (!job.ParseFromArray(PQgetvalue(rows->get(), i, 1), PQgetlength(rows->get(), i, 1))) {
        continue;
      }
      for (const auto& [key, value] : job.spec().labels()) {
        keys.push_back(key);
        values.push_back(value);
        ids.push_back(after);
        states.push_back(CellInt(rows->get(), i, 2));
      }
    }
    if (ids.empty()) continue;
    if (auto r = conn.Exec("INSERT INTO job_labels(key, value, job_id, state) SELECT * FROM "
                           "unnest($1::bytea[], $2::bytea[], $3::bigint[], $4::int[]) ON CONFLICT "
                           "DO NOTHING",
                           {ByteaArray(keys), ByteaArray(values), IntArray(ids), IntArray(states)},
                           "label backfill");
        !r.ok()) {
      return r.status();
    }
  }
}
}  // namespace

absl::Status PostgresJobStore::AppendLog(int64_t job_id, const std::vector<v1::LogLine>& lines,
                                         int max_lines_per_job) {
  if (lines.empty()) return absl::OkStatus();
  // Not repeated on a new connection: a COMMIT whose answer was lost may have stored them.
  absl::StatusOr<bool> done = Run<bool>(false, [&](PgConnection& c) -> absl::StatusOr<bool> {
    absl::Status status = [&]() -> absl::Status {
      if (auto r = c.Exec("BEGIN", {}, "append log"); !r.ok()) return r.status();
      if (const int64_t fence = fence_epoch(); fence != 0) {
        if (absl::Status s = CheckLease(c, fence); !s.ok()) return s;
      }
      for (const v1::LogLine& l : lines) {
        auto r = c.Exec(
            "INSERT INTO job_logs (job_id, rank, attempt, unix_ms, text) VALUES ($1::bigint, "
            "$2::int, $3::int, $4::bigint, $5::bytea)",
            {Int(job_id), Int(l.rank()), Int(l.attempt()), Int(l.unix_ms()), Bytes(l.text())},
            "append log");
        if (!r.ok()) return r.status();
      }
      // Only the newest max_lines_per_job of the job stay.
      auto trim = c.Exec(
          "DELETE FROM job_logs WHERE job_id = $1::bigint AND seq <= (SELECT seq FROM job_logs "
          "WHERE job_id = $1::bigint ORDER BY seq DESC LIMIT 1 OFFSET $2::int)",
          {Int(job_id), Int(max_lines_per_job)}, "trim log");
      if (!trim.ok()) return trim.status();
      return c.Exec("COMMIT", {}, "append log").status();
    }();
    if (!status.ok() && !c.broken()) (void)c.Exec("ROLLBACK", {}, "append log");
    if (!status.ok()) return status;
    return true;
  });
  return done.status();
}

absl::StatusOr<std::vector<v1::LogLine>> PostgresJobStore::ReadLog(int64_t job_id, int32_t rank,
                                                                   int64_t after_seq,
                                                                   int limit) const {
  // after_seq < 0: the newest -after_seq lines, oldest first.
  const char* sql =
      after_seq >= 0
          ? "SELECT seq, rank, attempt, unix_ms, text FROM job_logs WHERE job_id = $1::bigint "
            "AND seq > $2::bigint AND ($3::int < 0 OR rank = $3::int) ORDER BY seq LIMIT $4::int"
          : "SELECT * FROM (SELECT seq, rank, attempt, unix_ms, text FROM job_logs WHERE "
            "job_id = $1::bigint AND ($3::int < 0 OR rank = $3::int) ORDER BY seq DESC LIMIT "
            "least($4::bigint, -$2::bigint)) newest ORDER BY seq";
  return Run<std::vector<v1::LogLine>>(
      true, [&](PgConnection& c) -> absl::StatusOr<std::vector<v1::LogLine>> {
        absl::StatusOr<Result> r =
            c.Exec(sql, {Int(job_id), Int(after_seq), Int(rank), Int(limit)}, "read log");
        if (!r.ok()) return r.status();
        std::vector<v1::LogLine> out;
        for (int i = 0; i < PQntuples(r->get()); ++i) {
          v1::LogLine l;
          l.set_seq(CellInt(r->get(), i, 0));
          l.set_rank(static_cast<int32_t>(CellInt(r->get(), i, 1)));
          l.set_attempt(static_cast<int32_t>(CellInt(r->get(), i, 2)));
          l.set_unix_ms(CellInt(r->get(), i, 3));
          l.set_text(CellBytes(r->get(), i, 4));
          out.push_back(std::move(l));
        }
        return out;
      });
}

absl::StatusOr<std::vector<v1::Job>> PostgresJobStore::ListUnfinished() const {
  return Run<std::vector<v1::Job>>(
      true, [&](PgConnection& c) -> absl::StatusOr<std::vector<v1::Job>> {
        absl::StatusOr<Result> r =
            c.Exec("SELECT id, record FROM jobs WHERE state IN ($1::int, $2::int) ORDER BY id",
                   {Int(v1::JOB_STATE_PENDING), Int(v1::JOB_STATE_RUNNING)}, "list unfinished");
        if (!r.ok()) return r.status();
        return ResultJobs(r->get());
      });
}

absl::StatusOr<Leadership> PostgresJobStore::Campaign(const std::string& holder,
                                                      const std::string& address, int64_t ttl_ms) {
  // A renewal that finds its own lease expired starts a new epoch: the holder may have
  // stopped acting on the old one, and a write fenced at it must fail.
  return Run<Leadership>(true, [&](PgConnection& c) -> absl::StatusOr<Leadership> {
    absl::StatusOr<Result> r = c.Exec(
        "INSERT INTO joule_leader AS l (id, epoch, holder, address, expires_ms) VALUES (1, 1, "
        "$1::bytea, $2::bytea, " JOULE_PG_NOW_MS
        " + $3::bigint) ON CONFLICT (id) DO UPDATE "
        "SET epoch = CASE WHEN l.holder = $1::bytea AND l.expires_ms > " JOULE_PG_NOW_MS
        " THEN l.epoch ELSE l.epoch + 1 END, holder = $1::bytea, address = $2::bytea, "
        "expires_ms = " JOULE_PG_NOW_MS
        " + $3::bigint WHERE l.holder = $1::bytea OR "
        "l.expires_ms <= " JOULE_PG_NOW_MS " RETURNING epoch",
        {Bytes(holder), Bytes(address), Int(ttl_ms)}, "campaign");
    if (!r.ok()) return r.status();
    Leadership lead;
    if (PQntuples(r->get()) == 1) {
      lead.epoch = CellInt(r->get(), 0, 0);
      lead.holder = holder;
      lead.address = address;
      lead.ours = true;
      return lead;
    }
    absl::StatusOr<Result> other =
        c.Exec("SELECT epoch, holder, address FROM joule_leader WHERE id = 1", {}, "campaign");
    if (!other.ok()) return other.status();
    if (PQntuples(other->get()) == 1) {
      lead.epoch = CellInt(other->get(), 0, 0);
      lead.holder = CellBytes(other->get(), 0, 1);
      lead.address = CellBytes(other->get(), 0, 2);
    }
    return lead;
  });
}

absl::Status PostgresJobStore::Resign(const std::string& holder) {
  return Run<bool>(
             true,
             [&](PgConnection& c) -> absl::StatusOr<bool> {
               absl::StatusOr<Result> r = c.Exec(
                   "UPDATE joule_leader SET expires_ms = 0 WHERE id = 1 AND holder = $1::bytea",
                   {Bytes(holder)}, "resign");
               if (!r.ok()) return r.status();
               return true;
             })
      .status();
}

namespace {

absl::Status CheckLease(PgConnection& c, int64_t epoch) {
  absl::StatusOr<Result> r =
      c.Exec("SELECT epoch FROM joule_leader WHERE id = 1 FOR SHARE", {}, "lease");
  if (!r.ok()) return r.status();
  const int64_t current = PQntuples(r->get()) == 1 ? CellInt(r->get(), 0, 0) : 0;
  if (current == epoch) return absl::OkStatus();
  return FencedError(epoch, current);
}

}  // namespace

}  // namespace joule::server
