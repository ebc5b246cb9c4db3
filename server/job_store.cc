#include "server/job_store.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#if JOULE_WITH_POSTGRESQL
#include "server/postgres_job_store.h"
#endif
#include "server/sqlite_job_store.h"

namespace joule::server {

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& location,
                                                         int timeout_ms) {
  if (absl::StartsWith(location, "postgresql://") || absl::StartsWith(location, "postgres://")) {
#if JOULE_WITH_POSTGRESQL
    return PostgresJobStore::Open(location, timeout_ms);
#else
    return absl::UnimplementedError(
        "job store: this joule-coordinator was built without PostgreSQL (libpq-dev was not "
        "installed); use sqlite:PATH or rebuild");
#endif
  }
  if (absl::StartsWith(location, "sqlite:")) {
    const std::string path = location.substr(7);
    if (path.empty()) return absl::InvalidArgumentError("job store: sqlite: names no file");
    return SqliteJobStore::Open(path, timeout_ms);
  }
  // Another engine's URI ("mysql://...") is refused rather than taken for a file name.
  if (const size_t scheme = location.find("://"); scheme != std::string::npos) {
    const std::string name = location.substr(0, scheme);
    if (!name.empty() && name.find('/') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("job store: unknown engine '", name,
                       "' (the store is sqlite:PATH, a file path, or postgresql://...)"));
    }
  }
  if (location.empty()) return absl::InvalidArgumentError("job store: no location given");
  return SqliteJobStore::Open(location, timeout_ms);
}

absl::Status CheckSchemaVersion(int stored, const std::string& where) {
  if (stored <= kJobStoreSchemaVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "job store: ", where, " has schema version ", stored, ", newer than this coordinator's ",
      kJobStoreSchemaVersion, ": run the joule-coordinator that wrote it, or a newer one"));
}

absl::Status FencedError(int64_t epoch, int64_t current) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job store: fenced: this coordinator's leadership (epoch ", epoch,
      ") is over; the lease is at epoch ", current, " now, and only its holder writes"));
}

int64_t StateMask(const std::vector<v1::JobState>& states) {
  int64_t mask = 0;
  for (v1::JobState s : states) {
    if (s == v1::JOB_STATE_UNSPECIFIED || s < 0 || s >= 62) return 0;
    mask |= int64_t{1} << s;
  }
  return mask;
}

std::string ListJobsSql(int64_t mask, size_t labels, bool postgres) {
  const auto param = [postgres](int n, const char* type) {
    return postgres ? absl::StrCat("$", n, "::", type) : absl::StrCat("?", n);
  };
  const std::string before = param(1, "bigint"), limit = param(2, "int");
  std::vector<int> states;
  for (int state = 0; state < 62; ++state) {
    if ((mask >> state) & 1) states.push_back(state);
  }
  if (labels > 0) {
    // The first label's rows, one (key, value, state, job_id) index range per state asked
    // (or its (key, value, job_id) range for any state), each cut at the page's size; the
    // other labels checked per row.
    const auto label_rows = [&](const std::string& state_cond, const std::string& alias) {
      std::string sql = absl::StrCat(
          "SELECT * FROM (SELECT l.job_id FROM job_labels l WHERE l.key = ", param(3, "bytea"),
          " AND l.value = ", param(4, "bytea"), state_cond, " AND l.job_id < ", before);
      for (size_t i = 1; i < labels; ++i) {
        const int k = 3 + 2 * static_cast<int>(i);
        absl::StrAppend(&sql,
                        " AND EXISTS (SELECT 1 FROM job_labels m WHERE m.key = ", param(k, "bytea"),
                        " AND m.value = ", param(k + 1, "bytea"), " AND m.job_id = l.job_id)");
      }
      absl::StrAppend(&sql, " ORDER BY l.job_id DESC LIMIT ", limit, ") AS ", alias);
      return sql;
    };
    std::vector<std::string> arms;
    if (states.empty()) arms.push_back(label_rows("", "s"));
    for (int state : states) {
      arms.push_back(label_rows(absl::StrCat(" AND l.state = ", state), absl::StrCat("s", state)));
    }
    std::string sql =
        absl::StrCat("SELECT j.id, j.record FROM (", absl::StrJoin(arms, " UNION ALL "),
                     ") AS u JOIN jobs j ON j.id = u.job_id");
    // The jobs' own state too (the label rows hold a copy).
    if (!states.empty()) {
      absl::StrAppend(&sql, " WHERE j.state IN (", absl::StrJoin(states, ","), ")");
    }
    absl::StrAppend(&sql, " ORDER BY j.id DESC LIMIT ", limit);
    return sql;
  }
  if (states.empty()) {
    return absl::StrCat("SELECT id, record FROM jobs WHERE id < ", before,
                        " ORDER BY id DESC LIMIT ", limit);
  }
  std::vector<std::string> arms;
  for (int state : states) {
    arms.push_back(absl::StrCat("SELECT * FROM (SELECT id, record FROM jobs WHERE state = ", state,
                                " AND id < ", before, " ORDER BY id DESC LIMIT ", limit, ") AS s",
                                state));
  }
  // The outer ORDER BY also for one arm: a derived table's order is not the query's.
  return absl::StrCat("SELECT id, record FROM (", absl::StrJoin(arms, " UNION ALL "),
                      ") AS u ORDER BY id DESC LIMIT ", limit);
}

}  // namespace joule::server
