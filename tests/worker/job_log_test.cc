#include "worker/agent/job_log.h"

#include <gtest/gtest.h>
#include <spdlog/logger.h>

#include <memory>

namespace joule::worker {
namespace {

TEST(JobLogSinkTest, KeepsOnlyWhatIsLoggedWhileAnAttemptIsBound) {
  auto sink = std::make_shared<JobLogSink>();
  spdlog::logger log("test", sink);
  log.info("before");
  sink->Bind(4, 2);
  log.warn("during {}", 1);
  log.info(std::string(5000, 'y') + "\xc3");  // too long, and a cut UTF-8 sequence
  sink->Unbind();
  log.info("after");
  JobLogSink::Taken t = sink->Take();
  EXPECT_EQ(t.job_id, 4);
  EXPECT_EQ(t.attempt, 2);
  ASSERT_EQ(t.lines.size(), 2u);
  EXPECT_EQ(t.lines[0].text(), "W during 1");
  EXPECT_GT(t.lines[0].unix_ms(), 0);
  EXPECT_LE(t.lines[1].text().size(), JobLogSink::kMaxLineBytes + 2);
  EXPECT_EQ(t.lines[1].text().find('\xc3'), std::string::npos);
  EXPECT_TRUE(sink->Take().lines.empty());
}

TEST(JobLogSinkTest, IsBoundedCountsWhatItDropsAndHandsOutBatches) {
  auto sink = std::make_shared<JobLogSink>();
  spdlog::logger log("test", sink);
  sink->Bind(1, 1);
  const size_t n = JobLogSink::kMaxPending + 10;
  for (size_t i = 0; i < n; ++i) log.info("line {}", i);
  JobLogSink::Taken t = sink->Take();
  EXPECT_EQ(t.dropped, 10);
  ASSERT_EQ(t.lines.size(), JobLogSink::kMaxTake);
  EXPECT_EQ(t.lines[0].text(), "I line 10");  // the oldest were dropped
  size_t total = t.lines.size();
  while (!(t = sink->Take()).lines.empty()) {
    total += t.lines.size();
    EXPECT_EQ(t.dropped, 0);
  }
  EXPECT_EQ(total, JobLogSink::kMaxPending);
  // A new attempt does not inherit the last one's lines.
  log.info("left over");
  sink->Bind(1, 2);
  EXPECT_TRUE(sink->Take().lines.empty());
}

}  // namespace
}  // namespace joule::worker
