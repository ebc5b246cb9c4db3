#include "worker/devices/gpu_claim.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

namespace joule::worker {
namespace {

class GpuClaimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("joule_gpu_claim_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  const std::vector<std::string> two_ = {"0000:3B:00.0", "0000:AF:00.0"};
};

TEST_F(GpuClaimTest, TwoWorkersOnOneHostTakeTwoGpus) {
  // Two one-GPU jobs on a two-GPU host: before, both took cuda:0.
  auto first = GpuClaim::Claim(-1, two_, dir_.string());
  auto second = GpuClaim::Claim(-1, two_, dir_.string());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->device(), 0);
  EXPECT_EQ(second->device(), 1);
  EXPECT_EQ(second->bus_id(), "0000:AF:00.0");
  auto third = GpuClaim::Claim(-1, two_, dir_.string());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("0000:AF:00.0"), std::string::npos) << third.status();
}

TEST_F(GpuClaimTest, AGpuIsFreedWhenItsWorkerEndsHoweverItEnds) {
  {
    auto held = GpuClaim::Claim(1, two_, dir_.string());
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(GpuClaim::Claim(1, two_, dir_.string()).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  EXPECT_TRUE(GpuClaim::Claim(1, two_, dir_.string()).ok());  // released with its owner
  // A worker killed with SIGKILL: the kernel drops its lock.
  const pid_t child = fork();
  if (child == 0) {
    // The parent's probes below hold the lock for an instant: retry until it is ours.
    for (int i = 0; i < 10000; ++i) {
      auto held = GpuClaim::Claim(0, two_, dir_.string());
      if (held.ok()) pause();
      usleep(100);
    }
    _exit(1);
  }
  // Wait for the evidence: the child holds device 0.
  bool held_by_child = false;
  for (int i = 0; i < 5000 && !held_by_child; ++i) {
    held_by_child = !GpuClaim::Claim(0, two_, dir_.string()).ok();  // released at once
    if (!held_by_child) usleep(1000);
  }
  ASSERT_TRUE(held_by_child);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(GpuClaim::Claim(0, two_, dir_.string()).ok());
}

TEST_F(GpuClaimTest, ARequestedDeviceIsThatOneOrAnError) {
  EXPECT_EQ(GpuClaim::Claim(2, two_, dir_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GpuClaim::Claim(-1, {}, dir_.string()).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(GpuClaim::Claim(0, two_, "/nonexistent/dir").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace joule::worker
