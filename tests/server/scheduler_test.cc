#include "server/scheduler.h"

#include <gtest/gtest.h>

namespace joule::server {
namespace {

constexpr auto kCpu = v1::DEVICE_KIND_CPU;
constexpr auto kGpu = v1::DEVICE_KIND_GPU;

std::vector<WorkerSlot> Idle(int n, v1::DeviceKind kind, const std::string& prefix = "w") {
  std::vector<WorkerSlot> out;
  for (int i = 0; i < n; ++i) out.push_back({prefix + std::to_string(i), kind, true});
  return out;
}

TEST(SchedulerTest, PlacesWholeGangInWorkerOrder) {
  ScheduleDecision d = Schedule({{1, 0, kCpu, 2}}, Idle(3, kCpu));
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].job_id, 1);
  EXPECT_EQ(d.placements[0].workers, (std::vector<std::string>{"w0", "w1"}));
  EXPECT_TRUE(d.waiting.empty());
}

TEST(SchedulerTest, NeverStartsAPartialGang) {
  ScheduleDecision d = Schedule({{1, 0, kCpu, 3}}, Idle(2, kCpu));
  EXPECT_TRUE(d.placements.empty());
  ASSERT_TRUE(d.waiting.contains(1));
  EXPECT_EQ(d.waiting[1], "waiting for 3 idle cpu workers: 2 registered, 2 idle");
}

TEST(SchedulerTest, BusyWorkersCountAsRegisteredNotIdle) {
  std::vector<WorkerSlot> w = Idle(2, kCpu);
  w[0].idle = false;
  ScheduleDecision d = Schedule({{1, 0, kCpu, 2}}, w);
  EXPECT_TRUE(d.placements.empty());
  EXPECT_EQ(d.waiting[1], "waiting for 2 idle cpu workers: 2 registered, 1 idle");
}

TEST(SchedulerTest, MatchesDeviceKind) {
  ScheduleDecision d = Schedule({{1, 0, kGpu, 1}, {2, 0, kCpu, 1}}, Idle(2, kCpu));
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].job_id, 2);
  EXPECT_EQ(d.waiting[1], "waiting for 1 idle gpu workers: 0 registered, 0 idle");
}

TEST(SchedulerTest, PriorityThenFifo) {
  ScheduleDecision d =
      Schedule({{5, 0, kCpu, 1}, {3, 0, kCpu, 1}, {9, 10, kCpu, 1}}, Idle(2, kCpu));
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
  ScheduleDecision d = Schedule({{1, 0, kCpu, 3}, {2, 0, kCpu, 1}}, w);
  EXPECT_TRUE(d.placements.empty());
  EXPECT_EQ(d.waiting[2], "queued behind job 1 for cpu workers");
}

TEST(SchedulerTest, AGangLargerThanTheClusterDoesNotBlockTheQueue) {
  // Job 1 needs 4 but only 2 are registered: it waits for workers to join, and job 2
  // runs meanwhile.
  ScheduleDecision d = Schedule({{1, 0, kCpu, 4}, {2, 0, kCpu, 1}}, Idle(2, kCpu));
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_EQ(d.placements[0].job_id, 2);
  EXPECT_EQ(d.waiting[1], "waiting for 4 idle cpu workers: 2 registered, 2 idle");
}

TEST(SchedulerTest, SeveralGangsShareThePool) {
  ScheduleDecision d = Schedule({{1, 0, kCpu, 2}, {2, 0, kCpu, 2}}, Idle(4, kCpu));
  ASSERT_EQ(d.placements.size(), 2u);
  EXPECT_EQ(d.placements[1].workers, (std::vector<std::string>{"w2", "w3"}));
}

}  // namespace
}  // namespace joule::server
