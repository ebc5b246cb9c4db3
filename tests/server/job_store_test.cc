#include "server/job_store.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#if JOULE_WITH_POSTGRESQL
#include <libpq-fe.h>
#endif
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "tests/testing/postgres_server.h"
#include "tests/testing/temp_cleanup.h"

namespace joule::server {
namespace {

using joule::testing::PostgresServer;

const auto* const kStoreCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_store_"));

std::string TempDb(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("joule_store_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return (dir / "jobs.db").string();
}

v1::Job NewJob(const std::string& name) {
  v1::Job job;
  job.mutable_spec()->set_name(name);
  job.mutable_spec()->set_model("mlp");
  job.mutable_spec()->set_workers(2);
  job.set_state(v1::JOB_STATE_PENDING);
  return job;
}

#if JOULE_WITH_POSTGRESQL
// One PostgreSQL server for the whole test program (started on first use, stopped at exit).
struct SharedPostgres {
  std::unique_ptr<PostgresServer> server;
  std::string why;
  bool skip = false;
};
SharedPostgres& Postgres() {
  static SharedPostgres* shared = [] {
    auto* s = new SharedPostgres;
    s->server = PostgresServer::Start(&s->why, &s->skip);
    std::atexit([] { Postgres().server.reset(); });
    return s;
  }();
  return *shared;
}

#endif  // JOULE_WITH_POSTGRESQL

// Runs one SQL statement on the store's database behind the store's back.
bool RawExec(const std::string& location, const std::string& sql) {
#if JOULE_WITH_POSTGRESQL
  if (absl::StartsWith(location, "postgresql://")) {
    PGconn* c = PQconnectdb(location.c_str());
    PGresult* r = PQexec(c, sql.c_str());
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    PQfinish(c);
    return ok;
  }
#endif
  sqlite3* db = nullptr;
  bool ok = sqlite3_open(location.substr(7).c_str(), &db) == SQLITE_OK &&
            sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
  sqlite3_close(db);
  return ok;
}

// Every test runs on both engines: a SQLite file, and a database of its own on a real
// PostgreSQL server started by the test program.
class JobStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "postgresql") return;
#if !JOULE_WITH_POSTGRESQL
    GTEST_SKIP() << "built without PostgreSQL (libpq-dev)";
#else
    SharedPostgres& pg = Postgres();
    if (pg.skip) GTEST_SKIP() << pg.why;
    ASSERT_NE(pg.server, nullptr) << pg.why;
#endif
  }

  // A new, empty store's location: a file, or a database created for it.
  std::string Location(const std::string& name) {
    if (GetParam() == "sqlite") return "sqlite:" + TempDb(name);
#if !JOULE_WITH_POSTGRESQL
    return "";
#else
    static std::atomic<int> serial{0};
    std::string why;
    std::string uri =
        Postgres().server->CreateDatabase("t_" + name + "_" + std::to_string(serial++), &why);
    EXPECT_FALSE(uri.empty()) << why;
    return uri;
#endif
  }

  std::unique_ptr<JobStore> Open(const std::string& location, int timeout_ms = 5000) {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(location, timeout_ms);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
};

INSTANTIATE_TEST_SUITE_P(Engines, JobStoreTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

TEST_P(JobStoreTest, RoundTripSurvivesReopen) {
  const std::string location = Location("roundtrip");
  v1::Job stored;
  {
    auto store = Open(location);
    ASSERT_NE(store, nullptr);
    v1::Job job = NewJob("a");
    bool existing = true;
    ASSERT_TRUE(store->Insert(&job, &existing).ok());
    EXPECT_FALSE(existing);
    EXPECT_GT(job.id(), 0);
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.mutable_result()->set_test_accuracy(0.85);
    ASSERT_TRUE(store->Update(job).ok());
    stored = job;
  }
  auto store = Open(location);
  ASSERT_NE(store, nullptr);
  auto got = store->Get(stored.id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*got, stored));
}

TEST_P(JobStoreTest, RequestIdMakesInsertIdempotentForAnyBytes) {
  auto store = Open(Location("idempotent"));
  ASSERT_NE(store, nullptr);
  // Request ids are a client's bytes: plain, non-ASCII, with a NUL, with quotes.
  for (const std::string& request : {std::string("req-1"), std::string("r\xc3\xa9q"),
                                     std::string("a\0b", 3), std::string("'; DROP TABLE jobs")}) {
    v1::Job a = NewJob("a");
    a.set_request_id(request);
    bool existing = true;
    ASSERT_TRUE(store->Insert(&a, &existing).ok());
    EXPECT_FALSE(existing);
    v1::Job again = NewJob("different");
    again.set_request_id(request);
    ASSERT_TRUE(store->Insert(&again, &existing).ok());
    EXPECT_TRUE(existing);
    EXPECT_EQ(again.id(), a.id());
    EXPECT_EQ(again.spec().name(), "a");
    auto by_request = store->GetByRequestId(request);
    ASSERT_TRUE(by_request.ok()) << by_request.status();
    EXPECT_EQ(by_request->id(), a.id());
  }
  EXPECT_EQ(store->GetByRequestId("a").status().code(), absl::StatusCode::kNotFound);
  auto all = store->List(v1::JOB_STATE_UNSPECIFIED, 0, 100);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 4u);
}

TEST_P(JobStoreTest, ConcurrentSubmitsStoreEachRequestOnce) {
  auto store = Open(Location("concurrent"));
  ASSERT_NE(store, nullptr);
  // 8 clients submit 40 requests each; every request id is sent by two clients.
  constexpr int kClients = 8, kEach = 40;
  std::vector<std::vector<int64_t>> ids(kClients);
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kEach; ++i) {
        v1::Job j = NewJob("c" + std::to_string(c));
        j.set_request_id("r" + std::to_string(c / 2) + "-" + std::to_string(i));
        bool existing;
        if (!store->Insert(&j, &existing).ok()) ++failures;
        ids[c].push_back(j.id());
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int c = 0; c < kClients; c += 2) EXPECT_EQ(ids[c], ids[c + 1]);  // the same jobs
  auto all = store->List(v1::JOB_STATE_UNSPECIFIED, 0, 1000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), static_cast<size_t>(kClients / 2 * kEach));
  std::set<int64_t> distinct;
  for (const v1::Job& j : *all) distinct.insert(j.id());
  EXPECT_EQ(distinct.size(), all->size());
}

TEST_P(JobStoreTest, ListFiltersPagesAndFindsUnfinished) {
  auto store = Open(Location("list"));
  ASSERT_NE(store, nullptr);
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) {
    v1::Job j = NewJob(std::string("j").append(std::to_string(i)));
    bool existing;
    ASSERT_TRUE(store->Insert(&j, &existing).ok());
    if (i % 2 == 0) {
      j.set_state(v1::JOB_STATE_FAILED);
      ASSERT_TRUE(store->Update(j).ok());
    }
    if (i == 1) {
      j.set_state(v1::JOB_STATE_RUNNING);
      ASSERT_TRUE(store->Update(j).ok());
    }
    ids.push_back(j.id());
  }
  auto failed = store->List(v1::JOB_STATE_FAILED, 0, 100);
  ASSERT_TRUE(failed.ok());
  ASSERT_EQ(failed->size(), 3u);
  EXPECT_EQ((*failed)[0].id(), ids[4]);  // newest first
  auto two_states = store->List({v1::JOB_STATE_RUNNING, v1::JOB_STATE_PENDING}, 0, 100);
  ASSERT_TRUE(two_states.ok());
  ASSERT_EQ(two_states->size(), 2u);
  EXPECT_EQ((*two_states)[0].id(), ids[3]);
  EXPECT_EQ((*two_states)[1].id(), ids[1]);
  auto page = store->List(v1::JOB_STATE_UNSPECIFIED, ids[3], 2);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id(), ids[2]);
  EXPECT_EQ((*page)[1].id(), ids[1]);
  auto unfinished = store->ListUnfinished();
  ASSERT_TRUE(unfinished.ok());
  ASSERT_EQ(unfinished->size(), 2u);
  EXPECT_EQ((*unfinished)[0].id(), ids[1]);  // oldest first
  EXPECT_EQ((*unfinished)[0].state(), v1::JOB_STATE_RUNNING);
}

// Every combination of states, page start and size gives what filtering all jobs by hand
// gives: the newest `limit` of those states below `before`, newest first.
TEST_P(JobStoreTest, EveryStateFilterAndPageMatchesAFilterByHand) {
  auto store = Open(Location("pages"));
  ASSERT_NE(store, nullptr);
  const std::vector<v1::JobState> kinds = {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING,
                                           v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED,
                                           v1::JOB_STATE_CANCELLED};
  std::vector<std::pair<int64_t, v1::JobState>> all;  // oldest first
  for (int i = 0; i < 40; ++i) {
    v1::Job j = NewJob("p" + std::to_string(i));
    bool existing;
    ASSERT_TRUE(store->Insert(&j, &existing).ok());
    j.set_state(kinds[(i * 7 + i / 3) % kinds.size()]);
    ASSERT_TRUE(store->Update(j).ok());
    all.emplace_back(j.id(), j.state());
  }
  const std::vector<std::vector<v1::JobState>> filters = {
      {},
      {v1::JOB_STATE_SUCCEEDED},
      {v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED},
      {v1::JOB_STATE_CANCELLED, v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING},
      {v1::JOB_STATE_BUDGET_EXCEEDED},                       // nobody
      {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_UNSPECIFIED},  // UNSPECIFIED: every state
  };
  for (const auto& states : filters) {
    for (int64_t before : {int64_t{0}, all[25].first, all[3].first, all[0].first}) {
      for (int limit : {1, 3, 100}) {
        std::vector<int64_t> expected;
        for (auto it = all.rbegin(); it != all.rend(); ++it) {
          const bool any = states.empty() || std::find(states.begin(), states.end(),
                                                       v1::JOB_STATE_UNSPECIFIED) != states.end();
          if (before > 0 && it->first >= before) continue;
          if (!any && std::find(states.begin(), states.end(), it->second) == states.end()) {
            continue;
          }
          if (static_cast<int>(expected.size()) < limit) expected.push_back(it->first);
        }
        auto got = store->List(states, before, limit);
        ASSERT_TRUE(got.ok()) << got.status();
        std::vector<int64_t> ids;
        for (const v1::Job& j : *got) ids.push_back(j.id());
        EXPECT_EQ(ids, expected) << states.size() << " states, before " << before << ", limit "
                                 << limit;
      }
    }
  }
}

// Label filters (with states and pages) give what filtering by hand gives, for keys and
// values with the bytes an array literal or SQL would trip on; a store from schema version
// 2 gets its labels from the stored records when it is opened.
TEST_P(JobStoreTest, LabelFiltersMatchAFilterByHandBeforeAndAfterAMigration) {
  const std::string location = Location("labels");
  auto store = Open(location);
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> values = {
      "s1", "s2",       "a \"quoted\", {braced} \\back\\slashed", std::string("nul\0byte", 8),
      "",   "ünïcødé ✓"};
  struct Stored {
    int64_t id;
    v1::JobState state;
    std::map<std::string, std::string> labels;
  };
  std::vector<Stored> all;  // oldest first
  for (int i = 0; i < 36; ++i) {
    v1::Job j = NewJob("l" + std::to_string(i));
    auto& labels = *j.mutable_spec()->mutable_labels();
    labels["sweep"] = values[i % values.size()];
    if (i % 3 != 0) labels["team"] = i % 3 == 1 ? "red" : "blue";
    if (i % 5 == 0) labels["odd key ,{}\"\\"] = values[(i / 5) % values.size()];
    bool existing;
    ASSERT_TRUE(store->Insert(&j, &existing).ok());
    if (i % 7 != 6) {  // the others stay as inserted
      j.set_state(i % 4 == 0 ? v1::JOB_STATE_FAILED : v1::JOB_STATE_SUCCEEDED);
      ASSERT_TRUE(store->Update(j).ok());
    }
    all.push_back({j.id(), j.state(), {labels.begin(), labels.end()}});
  }
  std::vector<std::map<std::string, std::string>> filters = {
      {{"team", "red"}}, {{"team", "blue"}, {"sweep", "s2"}}, {{"team", "green"}}, {{"sweep", ""}}};
  for (const std::string& v : values) filters.push_back({{"sweep", v}});
  filters.push_back({{"odd key ,{}\"\\", values[2]}});
  filters.push_back({{"odd key ,{}\"\\", values[3]}, {"sweep", values[3]}});
  auto check = [&](JobStore& s, const std::string& when) {
    for (const auto& labels : filters) {
      for (const std::vector<v1::JobState>& states :
           {std::vector<v1::JobState>{},
            {v1::JOB_STATE_FAILED},
            {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED},
            {v1::JOB_STATE_PENDING}}) {
        for (int64_t before : {int64_t{0}, all[20].id}) {
          for (int limit : {2, 100}) {
            std::vector<int64_t> expected;
            for (auto it = all.rbegin(); it != all.rend(); ++it) {
              bool match = (before == 0 || it->id < before) &&
                           (states.empty() ||
                            std::find(states.begin(), states.end(), it->state) != states.end());
              for (const auto& [k, v] : labels) {
                auto found = it->labels.find(k);
                match = match && found != it->labels.end() && found->second == v;
              }
              if (match && static_cast<int>(expected.size()) < limit) expected.push_back(it->id);
            }
            auto got = s.List(states, labels, before, limit);
            ASSERT_TRUE(got.ok()) << got.status();
            std::vector<int64_t> ids;
            for (const v1::Job& j : *got) ids.push_back(j.id());
            EXPECT_EQ(ids, expected) << when << ": " << labels.begin()->first << "="
                                     << labels.begin()->second << ", before " << before;
          }
        }
      }
    }
  };
  check(*store, "stored");
  // The same store as schema version 3 left it (label rows without their job's state),
  // opened again: the label rows take their jobs' states.
  store.reset();
  ASSERT_TRUE(RawExec(location, "DROP INDEX job_labels_state"));
  ASSERT_TRUE(RawExec(location, "ALTER TABLE job_labels DROP COLUMN state"));
  ASSERT_TRUE(RawExec(location, "DELETE FROM joule_schema"));
  ASSERT_TRUE(RawExec(location, "INSERT INTO joule_schema(version) VALUES (3)"));
  store = Open(location);
  ASSERT_NE(store, nullptr);
  check(*store, "migrated from version 3");
  // The same store as schema version 2 left it (no job_labels), opened again.
  store.reset();
  ASSERT_TRUE(RawExec(location, "DROP TABLE job_labels"));
  ASSERT_TRUE(RawExec(location, "DELETE FROM joule_schema"));
  ASSERT_TRUE(RawExec(location, "INSERT INTO joule_schema(version) VALUES (2)"));
  store = Open(location);
  ASSERT_NE(store, nullptr);
  check(*store, "migrated");
}

TEST_P(JobStoreTest, ErrorsNameTheJob) {
  auto store = Open(Location("errors"));
  ASSERT_NE(store, nullptr);
  auto missing = store->Get(42);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.status().message()).find("job 42"), std::string::npos);
  v1::Job ghost = NewJob("ghost");
  ghost.set_id(7);
  EXPECT_EQ(store->Update(ghost).code(), absl::StatusCode::kNotFound);
}

TEST_P(JobStoreTest, ARecordThatDoesNotParseIsDataLossNamingTheJob) {
  const std::string location = Location("corrupt");
  auto store = Open(location);
  ASSERT_NE(store, nullptr);
  v1::Job j = NewJob("x");
  bool existing;
  ASSERT_TRUE(store->Insert(&j, &existing).ok());
  // A truncated varint: no Job message parses from it.
  ASSERT_TRUE(RawExec(location, GetParam() == "sqlite"
                                    ? "UPDATE jobs SET record = x'08ff'"
                                    : "UPDATE jobs SET record = '\\x08ff'::bytea"));
  auto got = store->Get(j.id());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "job " + std::to_string(j.id())));
  EXPECT_EQ(store->ListUnfinished().status().code(), absl::StatusCode::kDataLoss);
}

TEST_P(JobStoreTest, SchemaIsStampedAndANewerOneIsRefused) {
  const std::string location = Location("schema");
  ASSERT_NE(Open(location), nullptr);
  ASSERT_NE(Open(location), nullptr);  // reopening stamps nothing twice
  ASSERT_TRUE(RawExec(location, "INSERT INTO joule_schema(version) VALUES (" +
                                    std::to_string(kJobStoreSchemaVersion + 1) + ")"));
  auto newer = JobStore::Open(location);
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(newer.status().message(), "newer than this coordinator"))
      << newer.status();
}

TEST_P(JobStoreTest, TwoCoordinatorsOpenOneStoreTogether) {
  const std::string location = Location("together");
  std::unique_ptr<JobStore> a, b;
  std::thread ta([&] { a = Open(location); });
  std::thread tb([&] { b = Open(location); });
  ta.join();
  tb.join();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  v1::Job j = NewJob("shared");
  bool existing;
  ASSERT_TRUE(a->Insert(&j, &existing).ok());
  auto seen = b->Get(j.id());
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->spec().name(), "shared");
}

v1::LogLine Line(int rank, const std::string& text) {
  v1::LogLine l;
  l.set_rank(rank);
  l.set_attempt(1);
  l.set_unix_ms(1000 + rank);
  l.set_text(text);
  return l;
}

TEST_P(JobStoreTest, LogLinesComeBackInOrderByRankAndCursorAndOnlyTheNewestStay) {
  auto store = Open(Location("logs"));
  ASSERT_NE(store, nullptr);
  std::vector<v1::LogLine> first;
  for (int i = 0; i < 6; ++i) first.push_back(Line(i % 2, "line " + std::to_string(i)));
  ASSERT_TRUE(store->AppendLog(7, first, 100).ok());
  ASSERT_TRUE(store->AppendLog(8, {Line(0, "other job")}, 100).ok());
  auto all = store->ReadLog(7, -1, 0, 100);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 6u);
  EXPECT_EQ((*all)[0].text(), "line 0");
  EXPECT_EQ((*all)[0].unix_ms(), 1000);
  EXPECT_EQ((*all)[1].rank(), 1);
  EXPECT_LT((*all)[0].seq(), (*all)[5].seq());
  auto rank1 = store->ReadLog(7, 1, 0, 100);
  ASSERT_EQ(rank1->size(), 3u);
  for (const v1::LogLine& l : *rank1) EXPECT_EQ(l.rank(), 1);
  auto after = store->ReadLog(7, -1, (*all)[3].seq(), 100);  // a follower's cursor
  ASSERT_EQ(after->size(), 2u);
  EXPECT_EQ((*after)[0].text(), "line 4");
  auto tail = store->ReadLog(7, -1, -2, 100);  // the newest 2, oldest first
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].text(), "line 4");
  EXPECT_EQ((*tail)[1].text(), "line 5");
  // The cap keeps the newest of the job, not of others.
  ASSERT_TRUE(store->AppendLog(7, {Line(0, "line 6"), Line(0, "line 7")}, 3).ok());
  all = store->ReadLog(7, -1, 0, 100);
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].text(), "line 5");
  EXPECT_EQ((*all)[2].text(), "line 7");
  EXPECT_EQ(store->ReadLog(8, -1, 0, 100)->size(), 1u);
  EXPECT_TRUE(store->ReadLog(99, -1, 0, 100)->empty());
}

TEST_P(JobStoreTest, LogTextIsKeptByteForByte) {
  auto store = Open(Location("logbytes"));
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> texts = {std::string("nul\0inside", 10), "caf\xc3\xa9",
                                          "bad utf-8 \xff\xfe", std::string(100000, 'x')};
  std::vector<v1::LogLine> lines;
  for (const std::string& t : texts) lines.push_back(Line(0, t));
  ASSERT_TRUE(store->AppendLog(1, lines, 100).ok());
  auto back = store->ReadLog(1, -1, 0, 100);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ((*back)[i].text(), texts[i]) << i;
}

// --- Leadership and fencing, on both engines ----------------------------------------

// Campaigns until `holder` leads (the lease it waits for expires on the store's clock) or
// `deadline` passes.
Leadership CampaignUntilLeading(JobStore& store, const std::string& holder,
                                std::chrono::milliseconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  Leadership lead;
  do {
    absl::StatusOr<Leadership> got = store.Campaign(holder, holder + ":7070", 60000);
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok()) lead = *got;
    if (lead.ours) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < end);
  return lead;
}

TEST_P(JobStoreTest, OneCampaignerLeadsOthersLearnItsAddressAndItRenews) {
  const std::string location = Location("campaign");
  auto a = Open(location);
  auto b = Open(location);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto first = a->Campaign("a", "10.0.0.1:7070", 60000);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->ours);
  EXPECT_EQ(first->epoch, 1);
  auto other = b->Campaign("b", "10.0.0.2:7070", 60000);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(other->ours);
  EXPECT_EQ(other->holder, "a");
  EXPECT_EQ(other->address, "10.0.0.1:7070");
  EXPECT_EQ(other->epoch, 1);
  auto renewed = a->Campaign("a", "10.0.0.1:7070", 60000);
  ASSERT_TRUE(renewed.ok());
  EXPECT_TRUE(renewed->ours);
  EXPECT_EQ(renewed->epoch, 1);  // a renewal keeps the epoch
}

TEST_P(JobStoreTest, ConcurrentCampaignsElectExactlyOne) {
  auto store = Open(Location("election"));
  ASSERT_NE(store, nullptr);
  constexpr int kCandidates = 8;
  std::atomic<int> won{0};
  std::vector<std::thread> candidates;
  for (int i = 0; i < kCandidates; ++i) {
    candidates.emplace_back([&, i] {
      auto lead = store->Campaign("c" + std::to_string(i), "x", 60000);
      EXPECT_TRUE(lead.ok()) << lead.status();
      if (lead.ok() && lead->ours) ++won;
    });
  }
  for (auto& t : candidates) t.join();
  EXPECT_EQ(won.load(), 1);
}

TEST_P(JobStoreTest, AnExpiredOrResignedLeaseGoesToTheNextWithANewEpoch) {
  const std::string location = Location("lease");
  auto a = Open(location);
  auto b = Open(location);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto held = a->Campaign("a", "a:1", /*ttl_ms=*/1000);
  ASSERT_TRUE(held.ok() && held->ours) << held.status();
  // While a's lease runs (asked at once; 1 s is long for one statement), b does not lead.
  auto refused = b->Campaign("b", "b:1", 60000);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->ours);
  const Leadership taken = CampaignUntilLeading(*b, "b", std::chrono::seconds(30));
  ASSERT_TRUE(taken.ours);
  EXPECT_EQ(taken.epoch, 2);
  auto late = a->Campaign("a", "a:1", 300);  // a, back from a pause, finds b leading
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->ours);
  EXPECT_EQ(late->holder, "b");
  ASSERT_TRUE(b->Resign("b").ok());
  ASSERT_TRUE(a->Resign("a").ok());  // not the holder: changes nothing
  auto next = a->Campaign("a", "a:1", 60000);
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(next->ours);  // at once: b resigned
  EXPECT_EQ(next->epoch, 3);
}

TEST_P(JobStoreTest, AFencedLeaderCanWriteNothingAfterItsEpoch) {
  const std::string location = Location("fence");
  auto old_leader = Open(location);
  auto new_leader = Open(location);
  ASSERT_NE(old_leader, nullptr);
  ASSERT_NE(new_leader, nullptr);
  const auto first = old_leader->Campaign("old", "old:1", 60000);
  ASSERT_TRUE(first.ok() && first->ours);
  old_leader->Fence(first->epoch);
  v1::Job job = NewJob("before");
  bool existing;
  ASSERT_TRUE(old_leader->Insert(&job, &existing).ok());  // its epoch: writes land
  ASSERT_TRUE(old_leader->AppendLog(job.id(), {Line(0, "kept")}, 100).ok());
  ASSERT_TRUE(old_leader->Resign("old").ok());  // or its lease lapsed while it was paused
  const auto second = new_leader->Campaign("new", "new:1", 60000);
  ASSERT_TRUE(second.ok() && second->ours);
  ASSERT_EQ(second->epoch, first->epoch + 1);
  new_leader->Fence(second->epoch);
  // Every kind of write by the old leader is refused, and stores nothing.
  v1::Job stale = NewJob("stale");
  absl::Status insert = old_leader->Insert(&stale, &existing);
  EXPECT_EQ(insert.code(), absl::StatusCode::kFailedPrecondition) << insert;
  EXPECT_TRUE(absl::StrContains(insert.message(), "fenced")) << insert;
  v1::Job changed = job;
  changed.set_state(v1::JOB_STATE_FAILED);
  EXPECT_EQ(old_leader->Update(changed).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(old_leader->AppendLog(job.id(), {Line(0, "stale")}, 100).code(),
            absl::StatusCode::kFailedPrecondition);
  auto all = new_leader->List(v1::JOB_STATE_UNSPECIFIED, 0, 10);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(new_leader->ReadLog(job.id(), -1, 0, 10)->size(), 1u);
  // The new leader writes; reads were never fenced.
  changed.set_state(v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(new_leader->Update(changed).ok());
  EXPECT_TRUE(new_leader->AppendLog(job.id(), {Line(0, "new")}, 100).ok());
  EXPECT_EQ(old_leader->Get(job.id())->state(), v1::JOB_STATE_SUCCEEDED);
  // A missing job is still NOT_FOUND for the leader, not fenced.
  v1::Job ghost = NewJob("ghost");
  ghost.set_id(9999);
  EXPECT_EQ(new_leader->Update(ghost).code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreOpenTest, AStoreFromBeforeSchemaVersionsIsMigratedKeepingItsJobs) {
  // The layout every SQLite store had before versions were stamped, with one job in it.
  const std::string path = TempDb("legacy");
  v1::Job job = NewJob("legacy");
  const std::string record = job.SerializeAsString();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, request_id "
                         "TEXT UNIQUE, state INTEGER NOT NULL, record BLOB NOT NULL);"
                         "CREATE TABLE job_logs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id "
                         "INTEGER NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL, "
                         "unix_ms INTEGER NOT NULL, text TEXT NOT NULL);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_stmt* ins = nullptr;
  sqlite3_prepare_v2(db, "INSERT INTO jobs(state, record) VALUES (1, ?)", -1, &ins, nullptr);
  sqlite3_bind_blob(ins, 1, record.data(), static_cast<int>(record.size()), SQLITE_STATIC);
  ASSERT_EQ(sqlite3_step(ins), SQLITE_DONE);
  sqlite3_finalize(ins);
  sqlite3_close(db);
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto got = (*store)->Get(1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->spec().name(), "legacy");
  auto lead = (*store)->Campaign("a", "a:1", 1000);  // version 2's lease table is there
  ASSERT_TRUE(lead.ok()) << lead.status();
  EXPECT_TRUE(lead->ours);
}

TEST(JobStoreOpenTest, RefusesAFileThatIsNotADatabase) {
  const std::string path = TempDb("garbage");
  std::ofstream(path) << std::string(8192, 'x');
  auto store = JobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(store.status().message()).find(path), std::string::npos);
}

TEST(JobStoreOpenTest, RefusesUnknownEnginesAndEmptyLocations) {
  for (const char* location : {"mysql://db/joule", "redis://x", "sqlite:", ""}) {
    auto store = JobStore::Open(location);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << location;
  }
  auto sqlite = JobStore::Open("sqlite:" + TempDb("prefixed"));
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  EXPECT_TRUE(absl::StartsWith((*sqlite)->Describe(), "sqlite /")) << (*sqlite)->Describe();
}

#if JOULE_WITH_POSTGRESQL
// --- PostgreSQL only: credentials, an unreachable, paused or restarted server ---------

class PostgresStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SharedPostgres& pg = Postgres();
    if (pg.skip) GTEST_SKIP() << pg.why;
    ASSERT_NE(pg.server, nullptr) << pg.why;
    server_ = pg.server.get();
  }
  std::string NewDatabase(const std::string& name) {
    std::string why;
    static std::atomic<int> serial{0};
    std::string uri = server_->CreateDatabase("p_" + name + "_" + std::to_string(serial++), &why);
    EXPECT_FALSE(uri.empty()) << why;
    return uri;
  }
  PostgresServer* server_ = nullptr;
};

TEST_F(PostgresStoreTest, APasswordInTheUriIsRefusedAndNeverRepeated) {
  const std::string port = std::to_string(server_->port());
  for (const std::string& uri :
       {"postgresql://joule:s3cr3t-pw@127.0.0.1:" + port + "/postgres",
        "postgres://joule@127.0.0.1:" + port + "/postgres?password=s3cr3t-pw",
        std::string("postgresql://joule:s3cr3t-pw@[::1"),             // does not parse
        std::string("postgresql://joule:s3cr3t-pw%zz@127.0.0.1/db"),  // libpq quotes the token
        std::string("postgresql://joule@127.0.0.1/db?sslpassword=s3cr3t-pw"),
        std::string("postgresql://joule:s3cr3t-pw@127.0.0.1/db?nonsense=s3cr3t-pw")}) {
    auto store = JobStore::Open(uri);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << uri;
    EXPECT_FALSE(absl::StrContains(store.status().message(), "s3cr3t-pw")) << store.status();
  }
}

TEST_F(PostgresStoreTest, ARefusedLoginOrNoServerIsUnavailableWithoutTheSecret) {
  // A password file with the wrong password: the server refuses the login.
  const std::string wrong = ::testing::TempDir() + "/wrong.pgpass";
  std::ofstream(wrong) << "*:*:*:joule:not-the-password\n";
  std::filesystem::permissions(
      wrong, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::string port = std::to_string(server_->port());
  auto refused =
      JobStore::Open("postgresql://joule@127.0.0.1:" + port + "/postgres?passfile=" + wrong);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "password authentication failed"))
      << refused.status();
  EXPECT_FALSE(absl::StrContains(refused.status().message(), "not-the-password"));
  // Nothing listens on a port just freed: refused at once, not after the timeout.
  const auto start = std::chrono::steady_clock::now();
  auto nobody = JobStore::Open("postgresql://joule@127.0.0.1:1/postgres", 60000);
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST_F(PostgresStoreTest, ADatabaseOfSomeoneElseIsRefused) {
  const std::string uri = NewDatabase("foreign");
  ASSERT_TRUE(RawExec(uri, "CREATE TABLE jobs (name TEXT)"));
  auto store = JobStore::Open(uri);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(store.status().message(), "not a Joule store")) << store.status();
}

TEST_F(PostgresStoreTest, APausedServerFailsCallsAtTheTimeoutAndTheStoreRecovers) {
  auto store = JobStore::Open(NewDatabase("paused"), /*timeout_ms=*/1500);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::Job j = NewJob("before");
  bool existing;
  ASSERT_TRUE((*store)->Insert(&j, &existing).ok());
  server_->Pause();
  const auto start = std::chrono::steady_clock::now();
  auto got = (*store)->Get(j.id());
  const auto waited = std::chrono::steady_clock::now() - start;
  server_->Resume();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "no answer within 1500 ms"))
      << got.status();
  EXPECT_GE(waited, std::chrono::milliseconds(1400));
  EXPECT_LT(waited, std::chrono::seconds(20));
  auto after = (*store)->Get(j.id());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->spec().name(), "before");
}

TEST_F(PostgresStoreTest, ARestartedServerFailsWritesWhileDownAndServesAtOnceAfter) {
  const std::string uri = NewDatabase("restart");
  auto store = JobStore::Open(uri, /*timeout_ms=*/3000);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::Job j = NewJob("kept");
  bool existing;
  ASSERT_TRUE((*store)->Insert(&j, &existing).ok());
  // Calls at once fill the pool with several connections, all of which the restart kills.
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      for (int i = 0; i < 20; ++i) EXPECT_TRUE((*store)->Get(j.id()).ok());
    });
  }
  for (auto& t : readers) t.join();
  ASSERT_TRUE(server_->Stop());
  v1::Job lost = NewJob("while down");
  absl::Status down = (*store)->Insert(&lost, &existing);
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  ASSERT_TRUE(server_->Restart());
  // Every call succeeds at once: the pooled connections the server closed are dropped
  // before use, writes included (which are never sent twice).
  for (int i = 0; i < 6; ++i) {
    v1::Job later = NewJob("after " + std::to_string(i));
    absl::Status inserted = (*store)->Insert(&later, &existing);
    ASSERT_TRUE(inserted.ok()) << inserted;
  }
  auto got = (*store)->Get(j.id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->spec().name(), "kept");
  auto all = (*store)->List(v1::JOB_STATE_UNSPECIFIED, 0, 10);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 7u);  // the write refused while down was never stored
  EXPECT_TRUE(absl::StartsWith((*store)->Describe(), "postgresql joule@127.0.0.1:"))
      << (*store)->Describe();
}

#endif  // JOULE_WITH_POSTGRESQL

}  // namespace
}  // namespace joule::server
