#include "server/sqlite_job_store.h"

#include <sqlite3.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"

namespace joule::server {
namespace {

// RAII prepared statement.
// The last error of `db`, as the store reports it: a full disk (or database) is its own
// condition (RESOURCE_EXHAUSTED: no retry helps until space is freed), anything else
// UNAVAILABLE.
absl::Status StoreError(sqlite3* db, const std::string& what) {
  if ((sqlite3_extended_errcode(db) & 0xff) == SQLITE_FULL) {
    return absl::ResourceExhaustedError(absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db),
                                                     " (free space for the coordinator's "
                                                     "database)"));
  }
  return absl::UnavailableError(absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db)));
}

class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  absl::Status Error(const char* what) const { return StoreError(db_, what); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

absl::StatusOr<v1::Job> RowToJob(sqlite3_stmt* stmt, int column) {
  v1::Job job;
  const void* blob = sqlite3_column_blob(stmt, column);
  int size = sqlite3_column_bytes(stmt, column);
  if (!job.ParseFromArray(blob, size)) {
    return absl::DataLossError(absl::StrCat("job store: job ", sqlite3_column_int64(stmt, 0),
                                            " has a record that does not parse"));
  }
  job.set_id(sqlite3_column_int64(stmt, 0));  // the row's id is the truth (Insert stores 0)
  return job;
}

// Every row of a prepared "SELECT id, record ..." as jobs.
absl::StatusOr<std::vector<v1::Job>> Collect(Statement& q, const char* what) {
  std::vector<v1::Job> jobs;
  int rc;
  while ((rc = sqlite3_step(q.get())) == SQLITE_ROW) {
    absl::StatusOr<v1::Job> job = RowToJob(q.get(), 1);
    if (!job.ok()) return job.status();
    jobs.push_back(*std::move(job));
  }
  if (rc != SQLITE_DONE) return q.Error(what);
  return jobs;
}

// The SQL of each schema version's step (index 0: nothing to version 1), run in order
// from the stored version. Version 1 is the layout of every store written before versions
// were stamped, so its step is idempotent (IF NOT EXISTS) and stamps such a store.
// server/postgres_job_store.cc takes the same steps in PostgreSQL's dialect.
const std::vector<std::vector<const char*>>& MigrationSteps() {
  static const auto* steps = new std::vector<std::vector<const char*>>{
      {
          "CREATE TABLE IF NOT EXISTS jobs ("
          "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
          "  request_id TEXT UNIQUE,"
          "  state INTEGER NOT NULL,"
          "  record BLOB NOT NULL)",
          "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, id)",
          "CREATE TABLE IF NOT EXISTS job_logs ("
          "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
          "  job_id INTEGER NOT NULL,"
          "  rank INTEGER NOT NULL,"
          "  attempt INTEGER NOT NULL,"
          "  unix_ms INTEGER NOT NULL,"
          "  text TEXT NOT NULL)",
          "CREATE INDEX IF NOT EXISTS job_logs_job ON job_logs(job_id, seq)",
      },
      {
          "CREATE TABLE joule_leader ("
          "  id INTEGER PRIMARY KEY CHECK (id = 1),"
          "  epoch INTEGER NOT NULL,"
          "  holder BLOB NOT NULL,"
          "  address BLOB NOT NULL,"
          "  expires_ms INTEGER NOT NULL)",
      },
      {
          // Filled from the stored records by Migrate (BackfillLabels).
          "CREATE TABLE job_labels ("
          "  key BLOB NOT NULL,"
          "  value BLOB NOT NULL,"
          "  job_id INTEGER NOT NULL,"
          "  PRIMARY KEY (key, value, job_id)) WITHOUT ROWID",
      },
      {
          // Version 4: each label row holds its job's state. A store coming from before
          // version 3 gets its label rows (with their states) after the last step.
          "ALTER TABLE job_labels ADD COLUMN state INTEGER NOT NULL DEFAULT 0",
          "UPDATE job_labels SET state = coalesce((SELECT state FROM jobs WHERE jobs.id = "
          "job_labels.job_id), 0)",
          "CREATE INDEX job_labels_state ON job_labels(key, value, state, job_id)",
      },
  };
  return *steps;
}

// The lease row as of now; SQLite's writers take the file's lock one at a time, so a write
// that checks it in its own statement or transaction is ordered against every campaign.
constexpr const char* kLeaseHeld =
    "EXISTS (SELECT 1 FROM joule_leader WHERE id = 1 AND epoch = ?4)";
// The store's clock in unix milliseconds: the lease's only clock.
#define JOULE_SQLITE_NOW_MS "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> SqliteJobStore::Open(const std::string& path,
                                                               int busy_timeout_ms) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("job store: cannot open ", path, ": ", msg));
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db, path));
  sqlite3_busy_timeout(db, busy_timeout_ms);
  // Switching a new file to WAL needs it to itself: a second process opening it at the
  // same moment gets SQLITE_BUSY at once, without the busy handler, so that is retried
  // here until the busy timeout.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(busy_timeout_ms);
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    absl::Status s;
    while (!(s = store->Exec(sql)).ok() && (sqlite3_errcode(db) & 0xff) == SQLITE_BUSY &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat("job store: ", path, ": ", s.message()));
    }
  }
  if (absl::Status s = store->Migrate(); !s.ok()) {
    if (s.code() == absl::StatusCode::kFailedPrecondition) return s;
    return absl::UnavailableError(absl::StrCat("job store: ", path, ": ", s.message()));
  }
  return store;
}

absl::Status SqliteJobStore::Migrate() {
  // BEGIN IMMEDIATE takes the write lock first: two coordinators opening one file migrate
  // one after the other, and the second finds the version stamped.
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    if (absl::Status s = Exec("CREATE TABLE IF NOT EXISTS joule_schema (version INTEGER NOT NULL)");
        !s.ok()) {
      return s;
    }
    int stored = 0;
    {
      Statement q(db_, "SELECT coalesce(max(version), 0) FROM joule_schema");
      if (!q.ok() || sqlite3_step(q.get()) != SQLITE_ROW) return q.Error("schema version");
      stored = sqlite3_column_int(q.get(), 0);
    }
    if (absl::Status s = CheckSchemaVersion(stored, path_); !s.ok()) return s;
    const auto& steps = MigrationSteps();
    for (int v = stored; v < kJobStoreSchemaVersion; ++v) {
      for (const char* sql : steps[v]) {
        if (absl::Status s = Exec(sql); !s.ok()) return s;
      }
    }
    // job_labels was made by this migration: filled from the records, in today's layout.
    if (stored < 3) {
      if (absl::Status s = BackfillLabelsLocked(); !s.ok()) return s;
    }
    if (stored == kJobStoreSchemaVersion) return absl::OkStatus();
    Statement stamp(db_, "INSERT INTO joule_schema(version) VALUES (?)");
    if (!stamp.ok()) return stamp.Error("prepare stamp");
    sqlite3_bind_int(stamp.get(), 1, kJobStoreSchemaVersion);
    if (sqlite3_step(stamp.get()) != SQLITE_DONE) return stamp.Error("stamp schema version");
    return absl::OkStatus();
  }();
  if (status.ok()) status = Exec("COMMIT");
  if (!status.ok() && sqlite3_get_autocommit(db_) == 0) (void)Exec("ROLLBACK");
  return status;
}

SqliteJobStore::~SqliteJobStore() { sqlite3_close(db_); }

absl::Status SqliteJobStore::Exec(const char* sql) {
  if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return StoreError(db_, sql);
  return absl::OkStatus();
}

absl::Status SqliteJobStore::Insert(v1::Job* job, bool* existing) {
  PendingInsert me;
  me.job = job;
  me.existing = existing;
  std::unique_lock<std::mutex> queue(group_mu_);
  group_queue_.push_back(&me);
  while (!me.done) {
    if (group_writing_) {
      group_cv_.wait(queue);
      continue;
    }
    // No group is being written: this caller writes every queued insert, its own too.
    group_writing_ = true;
    std::vector<PendingInsert*> group;
    group.swap(group_queue_);
    queue.unlock();
    {
      std::lock_guard<std::mutex> lock(mu_);
      InsertGroupLocked(group);
    }
    queue.lock();
    for (PendingInsert* p : group) p->done = true;  // the waiters' frames: touched no more
    group_writing_ = false;
    group_cv_.notify_all();
  }
  return me.status;
}

void SqliteJobStore::InsertGroupLocked(const std::vector<PendingInsert*>& group) {
  const auto fail_all = [&](const absl::Status& s) {
    for (PendingInsert* p : group) {
      p->status = s;
      *p->existing = false;
    }
  };
  if (sqlite3_get_autocommit(db_) == 0) (void)Exec("ROLLBACK");  // a transaction left open
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return fail_all(s);
  std::vector<int64_t> ids(group.size(), 0);
  for (size_t i = 0; i < group.size(); ++i) {
    group[i]->status = InsertOneLocked(*group[i], &ids[i]);
    // Some errors (SQLITE_FULL, SQLITE_IOERR, SQLITE_NOMEM) roll the whole transaction
    // back: every insert of the group is lost, and a later SAVEPOINT would start (and its
    // RELEASE commit) a transaction of its own. The group fails with that error.
    if (!group[i]->status.ok() && sqlite3_get_autocommit(db_) != 0) {
      const absl::Status lost = group[i]->status;
      for (PendingInsert* p : group) {
        p->status = lost;
        *p->existing = false;
      }
      return;
    }
  }
  // One durable commit for the group: nobody's insert is acknowledged before it.
  if (absl::Status s = Exec("COMMIT"); !s.ok()) {
    if (sqlite3_get_autocommit(db_) == 0) (void)Exec("ROLLBACK");
    for (PendingInsert* p : group) {
      if (p->status.ok()) p->status = s;  // an entry's own error stays its own
      *p->existing = false;
    }
    return;
  }
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i]->status.ok() && !*group[i]->existing) group[i]->job->set_id(ids[i]);
  }
}

absl::Status SqliteJobStore::InsertOneLocked(PendingInsert& p, int64_t* id) {
  v1::Job* job = p.job;
  *p.existing = false;
  if (!job->request_id().empty()) {
    // Also finds a job an earlier insert of the same group stored.
    Statement q(db_, "SELECT id, record FROM jobs WHERE request_id = ?");
    if (!q.ok()) return q.Error("prepare lookup");
    sqlite3_bind_text(q.get(), 1, job->request_id().data(),
                      static_cast<int>(job->request_id().size()), SQLITE_TRANSIENT);
    if (sqlite3_step(q.get()) == SQLITE_ROW) {
      absl::StatusOr<v1::Job> stored = RowToJob(q.get(), 1);
      if (!stored.ok()) return stored.status();
      *job = *std::move(stored);
      *p.existing = true;
      return absl::OkStatus();
    }
  }
  // The record is stored without its id, which the row's id supplies on every read.
  job->set_id(0);
  const std::string record = job->SerializeAsString();
  const int64_t fence = fence_epoch();
  const std::string sql =
      fence == 0 ? std::string("INSERT INTO jobs(request_id, state, record) VALUES(?1, ?2, ?3)")
                 : absl::StrCat(
                       "INSERT INTO jobs(request_id, state, record) SELECT ?1, ?2, ?3 "
                       "WHERE ",
                       kLeaseHeld);
  // The job and its labels, or neither.
  if (absl::Status s = Exec("SAVEPOINT joule_insert"); !s.ok()) return s;
  absl::Status stored = InsertLocked(*job, record, sql, fence);
  if (!stored.ok()) {
    (void)Exec("ROLLBACK TO joule_insert");
    (void)Exec("RELEASE joule_insert");
    return stored;
  }
  if (absl::Status s = Exec("RELEASE joule_insert"); !s.ok()) return s;
  *id = last_insert_id_;
  return absl::OkStatus();
}

absl::Status SqliteJobStore::InsertLocked(const v1::Job& job, const std::string& record,
                                          const std::string& sql, int64_t fence) {
  Statement ins(db_, sql.c_str());
  if (!ins.ok()) return ins.Error("prepare insert");
  if (fence != 0) sqlite3_bind_int64(ins.get(), 4, fence);
  if (job.request_id().empty()) {
    sqlite3_bind_null(ins.get(), 1);
  } else {
    sqlite3_bind_text(ins.get(), 1, job.request_id().data(),
                      static_cast<int>(job.request_id().size()), SQLITE_TRANSIENT);
  }
  sqlite3_bind_int(ins.get(), 2, job.state());
  sqlite3_bind_blob(ins.get(), 3, record.data(), static_cast<int>(record.size()), SQLITE_STATIC);
  if (sqlite3_step(ins.get()) != SQLITE_DONE) return ins.Error("insert");
  if (sqlite3_changes(db_) == 0) return FencedError(fence, CurrentEpochLocked());
  last_insert_id_ = sqlite3_last_insert_rowid(db_);
  return InsertLabelsLocked(last_insert_id_, job.spec(), job.state());
}

absl::Status SqliteJobStore::InsertLabelsLocked(int64_t job_id, const v1::JobSpec& spec,
                                                int state) {
  if (spec.labels().empty()) return absl::OkStatus();
  Statement label(db_,
                  "INSERT OR IGNORE INTO job_labels(key, value, job_id, state) VALUES (?1, ?2, "
                  "?3, ?4)");
  if (!label.ok()) return label.Error("prepare label insert");
  for (const auto& [key, value] : spec.labels()) {
    sqlite3_bind_blob(label.get(), 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_blob(label.get(), 2, value.data(), static_cast<int>(value.size()), SQLITE_STATIC);
    sqlite3_bind_int64(label.get(), 3, job_id);
    sqlite3_bind_int(label.get(), 4, state);
    if (sqlite3_step(label.get()) != SQLITE_DONE) return label.Error("insert label");
    sqlite3_reset(label.get());
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::BackfillLabelsLocked() {
  Statement rows(db_, "SELECT id, record, state FROM jobs");
  if (!rows.ok()) return rows.Error("prepare label backfill");
  int rc;
  while ((rc = sqlite3_step(rows.get())) == SQLITE_ROW) {
    v1::Job job;
    // A record that does not parse keeps no labels here; reading it says DATA_LOSS.
    if (!job.ParseFromArray(sqlite3_column_blob(rows.get(), 1),
                            sqlite3_column_bytes(rows.get(), 1))) {
      continue;
    }
    if (absl::Status s = InsertLabelsLocked(sqlite3_column_int64(rows.get(), 0), job.spec(),
                                            sqlite3_column_int(rows.get(), 2));
        !s.ok()) {
      return s;
    }
  }
  return rc == SQLITE_DONE ? absl::OkStatus() : rows.Error("label backfill");
}

absl::StatusOr<v1::Job> SqliteJobStore::GetByRequestId(const std::string& request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  Statement q(db_, "SELECT id, record FROM jobs WHERE request_id = ?");
  if (!q.ok()) return q.Error("prepare lookup");
  sqlite3_bind_text(q.get(), 1, request_id.data(), static_cast<int>(request_id.size()),
                    SQLITE_TRANSIENT);
  int rc = sqlite3_step(q.get());
  if (rc == SQLITE_ROW) return RowToJob(q.get(), 1);
  if (rc == SQLITE_DONE) {
    return absl::NotFoundError(absl::StrCat("no job with request id ", request_id));
  }
  return q.Error("lookup");
}

absl::Status SqliteJobStore::Update(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (job.spec().labels().empty()) return UpdateLocked(job);
  // The job and its label rows' copy of its state together (one transaction, one fsync).
  if (sqlite3_get_autocommit(db_) == 0) (void)Exec("ROLLBACK");  // a transaction left open
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = UpdateLocked(job);
  if (status.ok()) {
    Statement label(db_,
                    "UPDATE job_labels SET state = ?1 WHERE key = ?2 AND value = ?3 AND job_id = "
                    "?4 AND state <> ?1");
    if (!label.ok()) status = label.Error("prepare label update");
    for (const auto& [key, value] : job.spec().labels()) {
      if (!status.ok()) break;
      sqlite3_bind_int(label.get(), 1, job.state());
      sqlite3_bind_blob(label.get(), 2, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
      sqlite3_bind_blob(label.get(), 3, value.data(), static_cast<int>(value.size()),
                        SQLITE_STATIC);
      sqlite3_bind_int64(label.get(), 4, job.id());
      if (sqlite3_step(label.get()) != SQLITE_DONE) status = label.Error("update label");
      sqlite3_reset(label.get());
    }
  }
  if (status.ok()) status = Exec("COMMIT");
  if (!status.ok() && sqlite3_get_autocommit(db_) == 0) (void)Exec("ROLLBACK");
  return status;
}

absl::Status SqliteJobStore::UpdateLocked(const v1::Job& job) {
  const int64_t fence = fence_epoch();
  const std::string sql =
      fence == 0
          ? std::string("UPDATE jobs SET state = ?1, record = ?2 WHERE id = ?3")
          : absl::StrCat("UPDATE jobs SET state = ?1, record = ?2 WHERE id = ?3 AND ", kLeaseHeld);
  Statement q(db_, sql.c_str());
  if (!q.ok()) return q.Error("prepare update");
  if (fence != 0) sqlite3_bind_int64(q.get(), 4, fence);
  std::string record = job.SerializeAsString();
  sqlite3_bind_int(q.get(), 1, job.state());
  sqlite3_bind_blob(q.get(), 2, record.data(), static_cast<int>(record.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(q.get(), 3, job.id());
  if (sqlite3_step(q.get()) != SQLITE_DONE) return q.Error("update");
  if (sqlite3_changes(db_) == 0) {
    if (fence != 0) {
      if (const int64_t current = CurrentEpochLocked(); current != fence) {
        return FencedError(fence, current);
      }
    }
    return absl::NotFoundError(absl::StrCat("job store: no job ", job.id(), " to update"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> SqliteJobStore::Get(int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  Statement q(db_, "SELECT id, record FROM jobs WHERE id = ?");
  if (!q.ok()) return q.Error("prepare get");
  sqlite3_bind_int64(q.get(), 1, id);
  int rc = sqlite3_step(q.get());
  if (rc == SQLITE_ROW) return RowToJob(q.get(), 1);
  if (rc == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("job ", id, " does not exist"));
  return q.Error("get");
}

absl::StatusOr<std::vector<v1::Job>> SqliteJobStore::List(
    const std::vector<v1::JobState>& states, const std::map<std::string, std::string>& labels,
    int64_t before_id, int limit) const {
  const std::string sql = ListJobsSql(StateMask(states), labels.size(), /*postgres=*/false);
  std::lock_guard<std::mutex> lock(mu_);
  Statement q(db_, sql.c_str());
  if (!q.ok()) return q.Error("prepare list");
  sqlite3_bind_int64(q.get(), 1, before_id > 0 ? before_id : INT64_MAX);
  sqlite3_bind_int(q.get(), 2, limit);
  int n = 3;
  for (const auto& [key, value] : labels) {
    sqlite3_bind_blob(q.get(), n++, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_blob(q.get(), n++, value.data(), static_cast<int>(value.size()), SQLITE_STATIC);
  }
  return Collect(q, "list");
}

absl::Status SqliteJobStore::AppendLog(int64_t job_id, const std::vector<v1::LogLine>& lines,
                                       int max_lines_per_job) {
  if (lines.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (sqlite3_get_autocommit(db_) == 0) (void)Exec("ROLLBACK");  // a transaction left open
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  if (const int64_t fence = fence_epoch(); fence != 0) {
    if (const int64_t current = CurrentEpochLocked(); current != fence) {
      (void)Exec("ROLLBACK");
      return FencedError(fence, current);
    }
  }
  bool ok = true;
  {
    Statement q(
        db_, "INSERT INTO job_logs (job_id, rank, attempt, unix_ms, text) VALUES (?, ?, ?, ?, ?)");
    ok = q.ok();
    for (size_t i = 0; ok && i < lines.size(); ++i) {
      const v1::LogLine& l = lines[i];
      sqlite3_reset(q.get());
      sqlite3_bind_int64(q.get(), 1, job_id);
      sqlite3_bind_int(q.get(), 2, l.rank());
      sqlite3_bind_int(q.get(), 3, l.attempt());
      sqlite3_bind_int64(q.get(), 4, l.unix_ms());
      sqlite3_bind_text(q.get(), 5, l.text().data(), static_cast<int>(l.text().size()),
                        SQLITE_TRANSIENT);
      ok = sqlite3_step(q.get()) == SQLITE_DONE;
    }
  }
  if (ok) {
    // Only the newest max_lines_per_job of the job stay.
    Statement trim(db_,
                   "DELETE FROM job_logs WHERE job_id = ?1 AND seq <= (SELECT seq FROM job_logs "
                   "WHERE job_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)");
    ok = trim.ok();
    if (ok) {
      sqlite3_bind_int64(trim.get(), 1, job_id);
      sqlite3_bind_int(trim.get(), 2, max_lines_per_job);
      ok = sqlite3_step(trim.get()) == SQLITE_DONE;
    }
  }
  absl::Status status =
      ok ? Exec("COMMIT")
         : absl::UnavailableError(absl::StrCat("append log: ", sqlite3_errmsg(db_)));
  // A failed COMMIT (disk full, I/O error) leaves the transaction open: end it, or every
  // later write of the store would join a transaction nobody commits.
  if (!status.ok() && sqlite3_get_autocommit(db_) == 0) (void)Exec("ROLLBACK");
  return status;
}

absl::StatusOr<std::vector<v1::LogLine>> SqliteJobStore::ReadLog(int64_t job_id, int32_t rank,
                                                                 int64_t after_seq,
                                                                 int limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  // after_seq < 0: the newest -after_seq lines, oldest first.
  Statement q(db_, after_seq >= 0
                       ? "SELECT seq, rank, attempt, unix_ms, text FROM job_logs WHERE job_id = ?1 "
                         "AND seq > ?2 AND (?3 < 0 OR rank = ?3) ORDER BY seq LIMIT ?4"
                       : "SELECT * FROM (SELECT seq, rank, attempt, unix_ms, text FROM job_logs "
                         "WHERE job_id = ?1 AND (?3 < 0 OR rank = ?3) ORDER BY seq DESC LIMIT "
                         "min(?4, -?2)) ORDER BY seq");
  if (!q.ok()) return q.Error("prepare read log");
  sqlite3_bind_int64(q.get(), 1, job_id);
  sqlite3_bind_int64(q.get(), 2, after_seq);
  sqlite3_bind_int(q.get(), 3, rank);
  sqlite3_bind_int(q.get(), 4, limit);
  std::vector<v1::LogLine> out;
  int rc;
  while ((rc = sqlite3_step(q.get())) == SQLITE_ROW) {
    v1::LogLine l;
    l.set_seq(sqlite3_column_int64(q.get(), 0));
    l.set_rank(sqlite3_column_int(q.get(), 1));
    l.set_attempt(sqlite3_column_int(q.get(), 2));
    l.set_unix_ms(sqlite3_column_int64(q.get(), 3));
    const unsigned char* text = sqlite3_column_text(q.get(), 4);
    l.set_text(text ? reinterpret_cast<const char*>(text) : "",
               static_cast<size_t>(sqlite3_column_bytes(q.get(), 4)));
    out.push_back(std::move(l));
  }
  if (rc != SQLITE_DONE) return q.Error("read log");
  return out;
}

absl::StatusOr<std::vector<v1::Job>> SqliteJobStore::ListUnfinished() const {
  std::lock_guard<std::mutex> lock(mu_);
  Statement q(db_, "SELECT id, record FROM jobs WHERE state IN (?1, ?2) ORDER BY id");
  if (!q.ok()) return q.Error("prepare list unfinished");
  sqlite3_bind_int(q.get(), 1, v1::JOB_STATE_PENDING);
  sqlite3_bind_int(q.get(), 2, v1::JOB_STATE_RUNNING);
  return Collect(q, "list unfinished");
}

int64_t SqliteJobStore::CurrentEpochLocked() const {
  Statement q(db_, "SELECT epoch FROM joule_leader WHERE id = 1");
  return q.ok() && sqlite3_step(q.get()) == SQLITE_ROW ? sqlite3_column_int64(q.get(), 0) : 0;
}

absl::StatusOr<Leadership> SqliteJobStore::Campaign(const std::string& holder,
                                                    const std::string& address, int64_t ttl_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  // As PostgresJobStore::Campaign: a renewal of an expired lease starts a new epoch.
  Statement q(db_,
              "INSERT INTO joule_leader (id, epoch, holder, address, expires_ms) VALUES (1, 1, ?1, "
              "?2, " JOULE_SQLITE_NOW_MS
              " + ?3) ON CONFLICT (id) DO UPDATE SET epoch = CASE "
              "WHEN joule_leader.holder = ?1 AND joule_leader.expires_ms > " JOULE_SQLITE_NOW_MS
              " THEN joule_leader.epoch ELSE joule_leader.epoch + 1 END, holder = ?1, address = "
              "?2, expires_ms = " JOULE_SQLITE_NOW_MS
              " + ?3 WHERE joule_leader.holder = ?1 OR "
              "joule_leader.expires_ms <= " JOULE_SQLITE_NOW_MS " RETURNING epoch");
  if (!q.ok()) return q.Error("prepare campaign");
  sqlite3_bind_blob(q.get(), 1, holder.data(), static_cast<int>(holder.size()), SQLITE_STATIC);
  sqlite3_bind_blob(q.get(), 2, address.data(), static_cast<int>(address.size()), SQLITE_STATIC);
  sqlite3_bind_int64(q.get(), 3, ttl_ms);
  Leadership lead;
  int rc = sqlite3_step(q.get());
  if (rc == SQLITE_ROW) {
    lead.epoch = sqlite3_column_int64(q.get(), 0);
    lead.holder = holder;
    lead.address = address;
    lead.ours = true;
    rc = sqlite3_step(q.get());
  }
  if (rc != SQLITE_DONE) return q.Error("campaign");
  if (lead.ours) return lead;
  Statement other(db_, "SELECT epoch, holder, address FROM joule_leader WHERE id = 1");
  if (!other.ok()) return other.Error("prepare campaign");
  if (sqlite3_step(other.get()) == SQLITE_ROW) {
    lead.epoch = sqlite3_column_int64(other.get(), 0);
    lead.holder.assign(static_cast<const char*>(sqlite3_column_blob(other.get(), 1)),
                       sqlite3_column_bytes(other.get(), 1));
    lead.address.assign(static_cast<const char*>(sqlite3_column_blob(other.get(), 2)),
                        sqlite3_column_bytes(other.get(), 2));
  }
  return lead;
}

absl::Status SqliteJobStore::Resign(const std::string& holder) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement q(db_, "UPDATE joule_leader SET expires_ms = 0 WHERE id = 1 AND holder = ?1");
  if (!q.ok()) return q.Error("prepare resign");
  sqlite3_bind_blob(q.get(), 1, holder.data(), static_cast<int>(holder.size()), SQLITE_STATIC);
  if (sqlite3_step(q.get()) != SQLITE_DONE) return q.Error("resign");
  return absl::OkStatus();
}

}  // namespace joule::server
