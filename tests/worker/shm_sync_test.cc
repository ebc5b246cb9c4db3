#include "worker/comm/shm_sync.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/comm/shm_segment.h"

namespace joule::worker {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Waits (bounded) until some rank sleeps on the futex: the evidence that a waiter has
// left its spin.
bool SomeoneSleeps(const ShmSyncWords& w) {
  const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  while (w.sleepers.load() == 0) {
    if (SteadyClock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// A pid that no longer exists (a reaped child's).
pid_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

TEST(ShmSyncTest, NoRankPassesARoundBeforeEveryRankPublishedIt) {
  constexpr int kWorld = 4, kRounds = 2000;
  auto words = std::make_unique<ShmSyncWords>();
  std::vector<std::atomic<int>> reached(kWorld);
  std::atomic<int> early{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      ShmSync sync(words.get(), r, kWorld, std::chrono::seconds(30));
      sync.Join();
      for (int round = 1; round <= kRounds; ++round) {
        reached[r].store(round);
        ASSERT_TRUE(sync.Arrive(round % 2, round, "test").ok()) << round;
        for (int p = 0; p < kWorld; ++p) {
          if (reached[p].load() < round) early.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(early.load(), 0);
  ShmSync view(words.get(), 0, kWorld, milliseconds(1));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(view.published(0, r), static_cast<uint64_t>(kRounds));
    EXPECT_EQ(view.published(1, r), static_cast<uint64_t>(kRounds - 1));
    EXPECT_EQ(words->pid[r].load(), getpid());
  }
}

TEST(ShmSyncTest, APublishWakesAPeerAsleepOnTheFutex) {
  auto words = std::make_unique<ShmSyncWords>();
  absl::Status waited;
  std::thread waiter([&] {
    ShmSync sync(words.get(), 0, 2, std::chrono::seconds(30));
    waited = sync.Arrive(0, 1, "test");
  });
  ASSERT_TRUE(SomeoneSleeps(*words));
  ShmSync peer(words.get(), 1, 2, std::chrono::seconds(30));
  EXPECT_TRUE(peer.Arrive(0, 1, "test").ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(ShmSyncTest, APeerThatNeverArrivesIsADeadlineNamingIt) {
  auto words = std::make_unique<ShmSyncWords>();
  ShmSync sync(words.get(), 0, 3, milliseconds(200));
  ShmSync peer(words.get(), 1, 3, milliseconds(200));
  absl::Status peer_waited;
  std::thread peer_thread([&] { peer_waited = peer.Arrive(0, 1, "x"); });  // 2 never arrives
  const auto start = SteadyClock::now();
  absl::Status s = sync.Arrive(0, 1, "allreduce");
  const auto waited = SteadyClock::now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(s.message(), "shared-memory allreduce on rank 0: rank 2 did not arrive within 200 ms");
  EXPECT_GE(waited, milliseconds(200));
  EXPECT_LT(waited, std::chrono::seconds(5));
  peer_thread.join();  // rank 1 times out the same way
  EXPECT_EQ(peer_waited.code(), absl::StatusCode::kDeadlineExceeded) << peer_waited;
}

TEST(ShmSyncTest, AbortReleasesAWaitAndEveryLaterOneAndThePeers) {
  auto words = std::make_unique<ShmSyncWords>();
  ShmSync sync(words.get(), 0, 2, std::chrono::seconds(60));
  absl::Status waited;
  const auto start = SteadyClock::now();
  std::thread waiter([&] { waited = sync.Arrive(1, 1, "barrier"); });
  ASSERT_TRUE(SomeoneSleeps(*words));
  sync.Abort();
  waiter.join();
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_EQ(waited.message(), "shared-memory barrier on rank 0: aborted while waiting for rank 1");
  EXPECT_TRUE(sync.aborted());
  EXPECT_EQ(sync.Arrive(1, 2, "barrier").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(sync.broken_by(), 1);  // rank 0 left: its peers stop waiting for it
  ShmSync peer(words.get(), 1, 2, std::chrono::seconds(60));
  absl::Status p = peer.Arrive(1, 3, "barrier");
  EXPECT_EQ(p.code(), absl::StatusCode::kUnavailable) << p;
}

TEST(ShmSyncTest, APeerThatLeavesReleasesItsPeersUnlessItFinishedTheRound) {
  auto words = std::make_unique<ShmSyncWords>();
  ShmSync a(words.get(), 0, 2, std::chrono::seconds(60));
  ShmSync b(words.get(), 1, 2, std::chrono::seconds(60));
  // Rank 1 published round 1, then left: round 1 is complete.
  words->lines[0][1].value.store(1);
  b.Leave();
  EXPECT_TRUE(a.Arrive(0, 1, "allreduce").ok());
  // Round 2 it never publishes.
  const auto start = SteadyClock::now();
  absl::Status s = a.Arrive(0, 2, "allreduce");
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(s.message(),
            "shared-memory allreduce on rank 0: rank 1 left the group (an error, an abort, or "
            "it finished early)");
  // The first rank to leave is the one named.
  a.Leave();
  EXPECT_EQ(a.broken_by(), 2);
}

TEST(ShmSyncTest, ARanksOwnLeaveDoesNotFailItsWaits) {
  auto words = std::make_unique<ShmSyncWords>();
  ShmSync a(words.get(), 0, 2, std::chrono::seconds(30));
  a.Leave();
  absl::Status waited;
  std::thread waiter([&] { waited = a.Arrive(0, 1, "x"); });
  ASSERT_TRUE(SomeoneSleeps(*words));
  ShmSync b(words.get(), 1, 2, std::chrono::seconds(30));
  EXPECT_TRUE(b.Arrive(0, 1, "x").ok());  // rank 0 left, but published this round
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(ShmSyncTest, ADeadPeerProcessIsAnErrorWithinAFractionOfTheTimeout) {
  auto words = std::make_unique<ShmSyncWords>();
  const pid_t dead = DeadPid();
  words->pid[1].store(dead);
  ShmSync sync(words.get(), 0, 2, std::chrono::seconds(30));
  const auto start = SteadyClock::now();
  absl::Status s = sync.Arrive(0, 1, "broadcast");
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(s.message(), absl::StrCat("shared-memory broadcast on rank 0: rank 1 (pid ", dead,
                                      ") exited"));
}

TEST(ShmSyncTest, APeerThatPublishedThenExitedCompletesTheRound) {
  auto words = std::make_unique<ShmSyncWords>();
  words->pid[1].store(DeadPid());
  words->lines[0][1].value.store(1);  // its last publish
  ShmSync sync(words.get(), 0, 2, std::chrono::seconds(30));
  EXPECT_TRUE(sync.Arrive(0, 1, "x").ok());
}

TEST(ShmSyncTest, RanksInDifferentProcessesMeetThroughASharedSegment) {
  absl::StatusOr<ShmSegment> segment = ShmSegment::Create(sizeof(ShmSyncWords));
  ASSERT_TRUE(segment.ok()) << segment.status();
  segment->Unlink();
  auto* words = static_cast<ShmSyncWords*>(segment->data());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: three rounds, then exits before the fourth
    ShmSync sync(words, 1, 2, std::chrono::seconds(30));
    sync.Join();
    for (int round = 1; round <= 3; ++round) {
      if (!sync.Arrive(round % 2, round, "child").ok()) _exit(1);
    }
    _exit(0);
  }
  ShmSync sync(words, 0, 2, std::chrono::seconds(30));
  sync.Join();
  for (int round = 1; round <= 3; ++round) {
    ASSERT_TRUE(sync.Arrive(round % 2, round, "parent").ok()) << round;
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const auto start = SteadyClock::now();
  absl::Status s = sync.Arrive(0, 4, "parent");
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(s.message().find(absl::StrCat("rank 1 (pid ", child, ") exited")), std::string::npos)
      << s;
}

}  // namespace
}  // namespace joule::worker
