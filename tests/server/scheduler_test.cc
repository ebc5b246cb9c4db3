#include "server/scheduler.h"

#include <gtest/gtest.h>

namespace joule::server {
namespace {

constexpr auto kCpu = v1::DEVICE_KIND_CPU;
constexpr auto kGpu = v1::DEVICE_KIND_GPU;

PendingJob Job(int64_t id, int32_t priority, v1::DeviceKind kind, int32_t workers,
               const std::string& region = "") {
  return {id, priority, kind, workers, region, ""};
}

std::vector<WorkerSlot> Idle(int n, v1::DeviceKind kind, const std::string& prefix = "w",
                             const std::string& region = "default") {
  std::vector<WorkerSlot> out;
  for (int i = 0; i < n; ++i) out.push_back({prefix + std::to_string(i), kind, true, region});
  return out;
}

TEST(SchedulerTest, PlacesWholeGangInWorkerOrder) {
  ScheduleDecision d = Schedule({Job(1, 0, kCpu, 2)}, Idle(3, kCpu));
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].job_id, 1);
  EXPECT_EQ(d.placements[0].workers, (std::vector<std::string>{"w0", "w1"}));
  EXPECT_TRUE(d.waiting.empty());
}

TEST(SchedulerTest, NeverStartsAPartialGang) {
  ScheduleDecision d = Schedule({Job(1, 0, kCpu, 3)}, Idle(2, kCpu));
  EXPECT_TRUE(d.placements.empty());
  ASSERT_TRUE(d.waiting.contains(1));
  EXPECT_EQ(d.waiting[1], "waiting for 3 idle cpu workers: 2 registered, 2 idle");
}

TEST(SchedulerTest, BusyWorkersCountAsRegisteredNotIdle) {
  std::vector<WorkerSlot> w = Idle(2, kCpu);
  w[0].idle = false;
  ScheduleDecision d = Schedule({Job(1, 0, kCpu, 2)}, w);
  EXPECT_TRUE(d.placements.empty());
  EXPECT_EQ(d.waiting[1], "waiting for 2 idle cpu workers: 2 registered, 1 idle");
}

TEST(SchedulerTest, MatchesDeviceKind) {
  ScheduleDecision d = Schedule({Job(1, 0, kGpu, 1), Job(2, 0, kCpu, 1)}, Idle(2, kCpu));
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].job_id, 2);
  EXPECT_EQ(d.waiting[1], "waiting for 1 idle gpu workers: 0 registered, 0 idle");
}

TEST(SchedulerTest, PriorityThenFifo) {
  ScheduleDecision d =
      Schedule({Job(5, 0, kCpu, 1), Job(3, 0, kCpu, 1), Job(9, 10, kCpu, 1)}, Idle(2, kCpu));
  ASSERT_EQ(d.placements.size(), 2u);
  EXPECT_EQ(d.placements[0].job_id, 9);  // highest priority
  EXPECT_EQ(d.placements[1].job_id, 3);  // then the oldest
  EXPECT_TRUE(d.waiting.contains(5));
}

TEST(SchedulerTest, NoBackfillPastAGangThatBusyWorkersWillServe) {
  // Job 1 needs 3; 3 are registered but one is busy: job 2 (needs 1) must not jump the
  // queue, or a stream of small jobs could starve job 1 forever.
  std::vector<WorkerSlot> w = Idle(3, kCpu);
  w[2].idle = false;
  ScheduleDecision d = Schedule({Job(1, 0, kCpu, 3), Job(2, 0, kCpu, 1)}, w);
  EXPECT_TRUE(d.placements.empty());
  EXPECT_EQ(d.waiting[2], "queued behind job 1 for cpu workers");
}

TEST(SchedulerTest, AGangLargerThanTheClusterDoesNotBlockTheQueue) {
  // Job 1 needs 4 but only 2 are registered: it waits for workers to join, and job 2
  // runs meanwhile.
  ScheduleDecision d = Schedule({Job(1, 0, kCpu, 4), Job(2, 0, kCpu, 1)}, Idle(2, kCpu));
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].job_id, 2);
  EXPECT_EQ(d.waiting[1], "waiting for 4 idle cpu workers: 2 registered, 2 idle");
}

TEST(SchedulerTest, SeveralGangsShareThePool) {
  ScheduleDecision d = Schedule({Job(1, 0, kCpu, 2), Job(2, 0, kCpu, 2)}, Idle(4, kCpu));
  ASSERT_EQ(d.placements.size(), 2u);
  EXPECT_EQ(d.placements[1].workers, (std::vector<std::string>{"w2", "w3"}));
}

// Regions (a carbon-aware job planned for one): a pinned job takes only its region's
// workers, and blocks only them; a job with none takes its gang from one region when it
// can.
TEST(SchedulerTest, AJobWithARegionTakesOnlyThatRegionsWorkers) {
  std::vector<WorkerSlot> w = Idle(2, kCpu, "de", "DE");
  for (WorkerSlot& s : Idle(2, kCpu, "fr", "FR")) w.push_back(s);
  ScheduleDecision d = Schedule({Job(1, 0, kCpu, 2, "FR")}, w);
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].workers, (std::vector<std::string>{"fr0", "fr1"}));
  // Three in FR: it waits, saying where, and does not take DE's.
  d = Schedule({Job(1, 0, kCpu, 3, "FR")}, w);
  EXPECT_TRUE(d.placements.empty());
  EXPECT_EQ(d.waiting[1], "waiting for 3 idle cpu workers in region FR: 2 registered, 2 idle");
}

TEST(SchedulerTest, ABlockedRegionalJobHoldsBackOnlyItsRegion) {
  std::vector<WorkerSlot> w = Idle(2, kCpu, "de", "DE");
  for (WorkerSlot& s : Idle(2, kCpu, "fr", "FR")) w.push_back(s);
  w[3].idle = false;  // fr1 busy: job 1 (both FR workers) waits for it
  ScheduleDecision d = Schedule(
      {Job(1, 0, kCpu, 2, "FR"), Job(2, 0, kCpu, 1, "FR"), Job(3, 0, kCpu, 1), Job(4, 0, kCpu, 1)},
      w);
  EXPECT_EQ(d.waiting[2], "queued behind job 1 for cpu workers in region FR");
  // Jobs 3 and 4 (any region) take DE's workers, not fr0, which job 1 waits beside.
  ASSERT_EQ(d.placements.size(), 2u);
  EXPECT_EQ(d.placements[0].workers, (std::vector<std::string>{"de0"}));
  EXPECT_EQ(d.placements[1].workers, (std::vector<std::string>{"de1"}));
}

TEST(SchedulerTest, APreferredRegionIsTakenFirstWhenItHoldsTheGang) {
  std::vector<WorkerSlot> w = Idle(2, kCpu, "de", "DE");
  for (WorkerSlot& s : Idle(2, kCpu, "fr", "FR")) w.push_back(s);
  PendingJob job = Job(1, 0, kCpu, 2);
  job.preferred_region = "FR";
  ScheduleDecision d = Schedule({job}, w);
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].workers, (std::vector<std::string>{"fr0", "fr1"}));
  // FR cannot hold it: anywhere.
  w[3].idle = false;
  d = Schedule({job}, w);
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].workers, (std::vector<std::string>{"de0", "de1"}));
}

TEST(SchedulerTest, AJobWithNoRegionTakesItsGangFromOneRegionWhenItCan) {
  std::vector<WorkerSlot> w = Idle(1, kCpu, "de", "DE");
  for (WorkerSlot& s : Idle(2, kCpu, "fr", "FR")) w.push_back(s);
  ScheduleDecision d = Schedule({Job(1, 0, kCpu, 2)}, w);
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].workers, (std::vector<std::string>{"fr0", "fr1"}));
  // No region has three: from both.
  d = Schedule({Job(1, 0, kCpu, 3)}, w);
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].workers, (std::vector<std::string>{"de0", "fr0", "fr1"}));
}

}  // namespace
}  // namespace joule::server
