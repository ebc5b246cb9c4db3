#include "common/shutdown_signal.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <thread>

namespace joule {
namespace {

// Puts SIGINT and SIGTERM back to their default actions when the test ends.
class ShutdownSignalTest : public ::testing::Test {
 protected:
  void TearDown() override {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
  }
};

// A thread that blocks nothing and idles until told to stop: what a library starts
// before main (OpenBLAS's pool at load) looks like to the kernel.
class IdleThread {
 public:
  IdleThread()
      : thread_([this] {
          while (!stop_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }) {}
  ~IdleThread() {
    stop_ = true;
    thread_.join();
  }
  pthread_t handle() { return thread_.native_handle(); }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(ShutdownSignalTest, ASignalDeliveredToAnyThreadIsAStopRequestNotADeath) {
  // Started before the handlers, with SIGTERM unblocked: under the old sigwait scheme
  // SIGTERM delivered here killed the process by its default action.
  IdleThread before;
  ASSERT_TRUE(InstallShutdownSignals().ok());
  IdleThread after;
  for (pthread_t target : {before.handle(), after.handle(), pthread_self()}) {
    ASSERT_EQ(pthread_kill(target, SIGTERM), 0);
    EXPECT_EQ(WaitForShutdownSignal(), SIGTERM);
  }
  ASSERT_EQ(kill(getpid(), SIGINT), 0);  // process-directed: whichever thread takes it
  EXPECT_EQ(WaitForShutdownSignal(), SIGINT);
}

TEST_F(ShutdownSignalTest, AnInheritedMaskDoesNotHideTheSignals) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &signals, nullptr), 0);  // as a parent may leave it
  ASSERT_TRUE(InstallShutdownSignals().ok());
  ASSERT_EQ(pthread_kill(pthread_self(), SIGTERM), 0);
  EXPECT_EQ(WaitForShutdownSignal(), SIGTERM);
}

}  // namespace
}  // namespace joule
