#ifndef JOULE_TESTS_TESTING_SQLITE_WRITE_LOCK_H_
#define JOULE_TESTS_TESTING_SQLITE_WRITE_LOCK_H_

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

namespace joule::testing {

// Holds SQLite's write lock on a database file from another connection, as another
// process would (a backup tool, a second coordinator): the job store's writes fail with
// "database is locked" (UNAVAILABLE) once their busy timeout passes, until Release.
// A store that fails on command, with the real engine. Not thread-safe.
class SqliteWriteLock {
 public:
  explicit SqliteWriteLock(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  }
  void Release() {
    if (db_ == nullptr) return;
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
    db_ = nullptr;
  }
  ~SqliteWriteLock() { Release(); }
  SqliteWriteLock(const SqliteWriteLock&) = delete;
  SqliteWriteLock& operator=(const SqliteWriteLock&) = delete;

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_SQLITE_WRITE_LOCK_H_
