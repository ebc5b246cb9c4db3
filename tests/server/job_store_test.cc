#include "server/job_store.h"

#include <gtest/gtest.h>
#include <google/protobuf/util/message_differencer.h>

#include <filesystem>
#include <fstream>
#include "tests/testing/temp_cleanup.h"

namespace joule::server {
namespace {

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

TEST(JobStoreTest, RoundTripSurvivesReopen) {
  const std::string path = TempDb("roundtrip");
  v1::Job stored;
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::Job job = NewJob("a");
    bool existing = true;
    ASSERT_TRUE((*store)->Insert(&job, &existing).ok());
    EXPECT_FALSE(existing);
    EXPECT_GT(job.id(), 0);
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.mutable_result()->set_test_accuracy(0.85);
    ASSERT_TRUE((*store)->Update(job).ok());
    stored = job;
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto got = (*store)->Get(stored.id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*got, stored));
}

TEST(JobStoreTest, RequestIdMakesInsertIdempotent) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  v1::Job a = NewJob("a");
  a.set_request_id("req-1");
  bool existing = false;
  ASSERT_TRUE((*store)->Insert(&a, &existing).ok());
  v1::Job again = NewJob("different");
  again.set_request_id("req-1");
  ASSERT_TRUE((*store)->Insert(&again, &existing).ok());
  EXPECT_TRUE(existing);
  EXPECT_EQ(again.id(), a.id());
  EXPECT_EQ(again.spec().name(), "a");
  auto all = (*store)->List(v1::JOB_STATE_UNSPECIFIED, 0, 100);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 1u);
}

TEST(JobStoreTest, ListFiltersPagesAndFindsUnfinished) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) {
    v1::Job j = NewJob(std::string("j").append(std::to_string(i)));
    bool existing;
    ASSERT_TRUE((*store)->Insert(&j, &existing).ok());
    if (i % 2 == 0) {
      j.set_state(v1::JOB_STATE_FAILED);
      ASSERT_TRUE((*store)->Update(j).ok());
    }
    ids.push_back(j.id());
  }
  auto failed = (*store)->List(v1::JOB_STATE_FAILED, 0, 100);
  ASSERT_TRUE(failed.ok());
  ASSERT_EQ(failed->size(), 3u);
  EXPECT_EQ((*failed)[0].id(), ids[4]);  // newest first
  auto page = (*store)->List(v1::JOB_STATE_UNSPECIFIED, ids[3], 2);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id(), ids[2]);
  EXPECT_EQ((*page)[1].id(), ids[1]);
  auto unfinished = (*store)->ListUnfinished();
  ASSERT_TRUE(unfinished.ok());
  ASSERT_EQ(unfinished->size(), 2u);
  EXPECT_EQ((*unfinished)[0].id(), ids[1]);
}

TEST(JobStoreTest, ErrorsNameTheJob) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  auto missing = (*store)->Get(42);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.status().message()).find("job 42"), std::string::npos);
  v1::Job ghost = NewJob("ghost");
  ghost.set_id(7);
  EXPECT_EQ((*store)->Update(ghost).code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, RefusesAFileThatIsNotADatabase) {
  const std::string path = TempDb("garbage");
  std::ofstream(path) << std::string(8192, 'x');
  auto store = JobStore::Open(path);
  EXPECT_FALSE(store.ok());
  EXPECT_NE(std::string(store.status().message()).find(path), std::string::npos);
}

}  // namespace
}  // namespace joule::server

namespace joule::server {
namespace {

v1::LogLine Line(int rank, const std::string& text) {
  v1::LogLine l;
  l.set_rank(rank);
  l.set_attempt(1);
  l.set_unix_ms(1000 + rank);
  l.set_text(text);
  return l;
}

TEST(JobStoreLogTest, LinesComeBackInOrderByRankAndCursorAndOnlyTheNewestStay) {
  auto store = JobStore::Open(TempDb("logs"));
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<v1::LogLine> first;
  for (int i = 0; i < 6; ++i) first.push_back(Line(i % 2, "line " + std::to_string(i)));
  ASSERT_TRUE((*store)->AppendLog(7, first, 100).ok());
  ASSERT_TRUE((*store)->AppendLog(8, {Line(0, "other job")}, 100).ok());
  auto all = (*store)->ReadLog(7, -1, 0, 100);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 6u);
  EXPECT_EQ((*all)[0].text(), "line 0");
  EXPECT_LT((*all)[0].seq(), (*all)[5].seq());
  auto rank1 = (*store)->ReadLog(7, 1, 0, 100);
  ASSERT_EQ(rank1->size(), 3u);
  for (const v1::LogLine& l : *rank1) EXPECT_EQ(l.rank(), 1);
  auto after = (*store)->ReadLog(7, -1, (*all)[3].seq(), 100);  // a follower's cursor
  ASSERT_EQ(after->size(), 2u);
  EXPECT_EQ((*after)[0].text(), "line 4");
  auto tail = (*store)->ReadLog(7, -1, -2, 100);  // the newest 2, oldest first
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].text(), "line 4");
  EXPECT_EQ((*tail)[1].text(), "line 5");
  // The cap keeps the newest of the job, not of others.
  ASSERT_TRUE((*store)->AppendLog(7, {Line(0, "line 6"), Line(0, "line 7")}, 3).ok());
  all = (*store)->ReadLog(7, -1, 0, 100);
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].text(), "line 5");
  EXPECT_EQ((*all)[2].text(), "line 7");
  EXPECT_EQ((*store)->ReadLog(8, -1, 0, 100)->size(), 1u);
  EXPECT_TRUE((*store)->ReadLog(99, -1, 0, 100)->empty());
}

}  // namespace
}  // namespace joule::server
