// What only the shared-memory transport does: rank-order sums, registered buffers, its
// segments in /dev/shm, peers that are processes, the choice of transport. The
// ProcessGroup contract is checked on every transport in process_group_test.cc.
#include "worker/comm/shm_process_group.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/file_kv.h"
#include "tests/testing/in_process_kv.h"
#include "tests/testing/run_ranks.h"
#include "worker/comm/connect.h"

namespace joule::worker {
namespace {

ShmOptions SmallSlots(std::chrono::milliseconds timeout) {
  ShmOptions o;
  o.timeout = timeout;
  o.slot_floats = 1024;  // buffers of more than 1024 floats take several rounds
  return o;
}

// `world` shared-memory ranks as threads (testing::RunRanks).
void RunRanks(int world, const ShmOptions& options,
              const std::function<void(int, ProcessGroup&)>& body) {
  testing::RunRanks<ShmProcessGroup>(
      world, [&](int r, KvClient& kv) { return ShmProcessGroup::Create(r, world, kv, options); },
      [&](int r, ShmProcessGroup& pg) { body(r, pg); });
}

std::vector<std::string> JouleSegments() {
  std::vector<std::string> out;
  const std::string prefix = "joule-" + std::to_string(getpid()) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  }
  return out;
}

TEST(ShmProcessGroupTest, SumsAreTheRankOrderFloatSumsOnEveryRank) {
  // Floating-point sums depend on order: every rank must get the same bits (or replicas
  // drift apart), and those of adding the ranks' values in rank order, then scaling.
  auto value = [](int rank, size_t i) { return 1.0f / (1 + i + 1000 * rank); };
  RunRanks(3, SmallSlots(std::chrono::seconds(30)), [&](int rank, ProcessGroup& pg) {
    std::vector<float> data(4096);
    for (size_t i = 0; i < data.size(); ++i) data[i] = value(rank, i);
    ASSERT_TRUE(pg.Allreduce(data, ReduceOp::kAverage).ok());
    for (size_t i = 0; i < data.size(); ++i) {
      const float expected = ((value(0, i) + value(1, i)) + value(2, i)) * (1.0f / 3.0f);
      ASSERT_EQ(data[i], expected) << "rank " << rank << " index " << i;
    }
  });
}

TEST(ShmProcessGroupTest, ARankThatLeavesReleasesItsPeersAtOnce) {
  // Rank 1 fails before the collective and destroys its group, its process alive: its peer
  // must not wait out the 60 s timeout.
  RunRanks(2, SmallSlots(std::chrono::seconds(60)), [](int rank, ProcessGroup& pg) {
    if (rank == 1) return;
    std::vector<float> data(100, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = pg.Allreduce(data, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(std::string(s.message()).find("rank 1 left the group"), std::string::npos) << s;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    // Later calls name the first error.
    absl::Status later = pg.Barrier();
    EXPECT_EQ(later.code(), absl::StatusCode::kAborted);
    EXPECT_NE(std::string(later.message()).find("rank 1 left the group"), std::string::npos)
        << later;
  });
}

TEST(ShmProcessGroupTest, AFailedRegistrationLeavesNothingInDevShm) {
  RunRanks(2, SmallSlots(std::chrono::seconds(60)), [](int rank, ProcessGroup& pg) {
    if (rank == 1) return;  // never registers: rank 0's segment must not be left behind
    SharedBuffer b = pg.NewBuffer(100000);
    EXPECT_EQ(b->registration(), 0u);
    EXPECT_EQ(b->size(), 100000u);
    EXPECT_TRUE(JouleSegments().empty());
  });
}

TEST(ShmProcessGroupTest, RegisteredBuffersReduceInPlaceLikeTheCopyPath) {
  std::vector<std::vector<float>> copied(3), registered(3);
  RunRanks(3, SmallSlots(std::chrono::seconds(30)), [&](int rank, ProcessGroup& pg) {
    SharedBuffer a = pg.NewBuffer(5000);  // not a multiple of the ranks or of a page
    SharedBuffer b = pg.NewBuffer(7);
    EXPECT_NE(a->registration(), 0u);
    EXPECT_NE(b->registration(), a->registration());
    for (int step = 0; step < 3; ++step) {  // reused, as gradient buckets are
      for (size_t i = 0; i < a->size(); ++i) (*a)[i] = 1.0f / (1 + i + 100 * rank + step);
      for (size_t i = 0; i < b->size(); ++i) (*b)[i] = static_cast<float>(rank * step);
      auto copy = std::make_shared<Buffer>(a->begin(), a->end());  // the same values, heap
      ASSERT_TRUE(pg.AllreduceAsync(a, ReduceOp::kAverage)->Wait().ok());
      ASSERT_TRUE(pg.AllreduceAsync(b, ReduceOp::kSum)->Wait().ok());
      ASSERT_TRUE(pg.AllreduceAsync(copy, ReduceOp::kAverage)->Wait().ok());
      EXPECT_EQ(std::vector<float>(a->begin(), a->end()),
                std::vector<float>(copy->begin(), copy->end())) << "step " << step;
      EXPECT_EQ((*b)[6], 3.0f * step);  // (0 + 1 + 2) x step
    }
    registered[rank].assign(a->begin(), a->end());
  });
  EXPECT_EQ(registered[0], registered[1]);
  EXPECT_EQ(registered[1], registered[2]);
  EXPECT_TRUE(JouleSegments().empty());
}

TEST(ShmProcessGroupTest, BuffersBeyondTheRegistrationLimitLiveOnTheHeap) {
  ShmOptions options = SmallSlots(std::chrono::seconds(30));
  options.registered_bytes_limit = 64 << 10;  // 1000 floats take 2 x 4 KiB; 10000, 2 x 40 KiB
  RunRanks(2, options, [](int rank, ProcessGroup& pg) {
    SharedBuffer small = pg.NewBuffer(1000);
    SharedBuffer big = pg.NewBuffer(10000);
    EXPECT_NE(small->registration(), 0u);
    EXPECT_EQ(big->registration(), 0u);  // on every rank alike
    for (float& x : *big) x = static_cast<float>(rank + 1);
    absl::Status st = pg.AllreduceAsync(big, ReduceOp::kSum)->Wait();
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(big->back(), 3.0f);
  });
}

TEST(ShmProcessGroupTest, BufferRegistrationsOfDifferentLengthsBreakTheGroup) {
  RunRanks(2, SmallSlots(std::chrono::seconds(20)), [](int rank, ProcessGroup& pg) {
    SharedBuffer b = pg.NewBuffer(rank == 0 ? 100 : 200);
    EXPECT_EQ(b->registration(), 0u);  // heap memory on both
    absl::Status s = pg.AllreduceAsync(b, ReduceOp::kSum)->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("rank 1 buffer registration of 200 floats"), std::string::npos)
        << s;
  });
}

TEST(ShmProcessGroupTest, APeerThatNeverArrivesTimesOutNamingIt) {
  std::atomic<bool> released{false};
  RunRanks(2, SmallSlots(std::chrono::milliseconds(300)), [&](int rank, ProcessGroup& pg) {
    if (rank == 1) {
      while (!released) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::vector<float> data(100, 1.0f);
    absl::Status s = pg.Allreduce(data, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(std::string(s.message()).find("rank 1 did not arrive"), std::string::npos) << s;
    released = true;
  });
}

TEST(ShmProcessGroupTest, ADeadPeerProcessIsAnErrorWithinAFractionOfTheTimeout) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("joule-shm-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: joins, takes part in one allreduce, dies
    testing::FileKv kv(dir);
    auto pg = ShmProcessGroup::Create(1, 2, kv, SmallSlots(std::chrono::seconds(30)));
    if (!pg.ok()) _exit(2);
    std::vector<float> data(10, 1.0f);
    _exit((*pg)->Allreduce(data, ReduceOp::kSum).ok() ? 0 : 3);
  }
  testing::FileKv kv(dir);
  auto pg = ShmProcessGroup::Create(0, 2, kv, SmallSlots(std::chrono::seconds(30)));
  ASSERT_TRUE(pg.ok()) << pg.status();
  std::vector<float> data(10, 1.0f);
  ASSERT_TRUE((*pg)->Allreduce(data, ReduceOp::kSum).ok());
  EXPECT_EQ(data[0], 2.0f);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = (*pg)->Allreduce(data, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(std::string(s.message()).find("rank 1 (pid " + std::to_string(child) + ") exited"),
            std::string::npos) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  std::filesystem::remove_all(dir);
}

TEST(ShmProcessGroupTest, SweepRemovesSegmentsOfDeadProcessesOnly) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);  // a pid that no longer exists
  const std::string dead = "/joule-" + std::to_string(child) + "-sweeptest";
  const std::string alive = "/joule-" + std::to_string(getpid()) + "-sweeptest";
  for (const std::string& name : {dead, alive}) {
    int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  EXPECT_GE(ShmProcessGroup::SweepStaleSegments(), 1);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + dead));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + alive));
  shm_unlink(alive.c_str());
}

TEST(ConnectProcessGroupTest, AutoPicksSharedMemoryOnOneHostAndFallsBackToGloo) {
  for (const bool too_big : {false, true}) {
    server::RendezvousKv kv;
    kv.OpenScope("s");
    std::vector<Transport> chosen(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        testing::InProcessKv client(kv, "s");
        ConnectOptions o;
        o.gloo.timeout = std::chrono::seconds(30);
        // A segment /dev/shm cannot hold: every rank must fall back together.
        if (too_big) o.shm.slot_floats = size_t{1} << 42;
        auto pg = ConnectProcessGroup(r, 2, client, o, &chosen[r]);
        ASSERT_TRUE(pg.ok()) << pg.status();
        std::vector<float> data(10, static_cast<float>(r));
        ASSERT_TRUE((*pg)->Allreduce(data, ReduceOp::kSum).ok());
        EXPECT_EQ(data[9], 1.0f);
      });
    }
    for (auto& t : threads) t.join();
    const Transport want = too_big ? Transport::kGloo : Transport::kShm;
    EXPECT_EQ(chosen[0], want);
    EXPECT_EQ(chosen[1], want);
  }
  EXPECT_EQ(ParseTransport("tcp").status().code(), absl::StatusCode::kInvalidArgument);
}

// ShmDomain() as seen by a forked child that first enters a new network namespace (when
// `new_net`); empty if the child could not (no CAP_SYS_ADMIN).
std::string ChildShmDomain(bool new_net) {
  int fds[2];
  if (pipe(fds) != 0) return "";
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    if (!new_net || unshare(CLONE_NEWNET) == 0) {
      const std::string d = ShmDomain();
      (void)!write(fds[1], d.data(), d.size());
    }
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fds[0]);
  waitpid(child, nullptr, 0);
  return out;
}

// A network namespace stands for a host (scripts/netns-hosts.sh): two processes that share
// the host name, boot, IPC, mount and PID namespaces but not the network namespace are not
// one shared-memory domain, so `auto` connects them over Gloo.
TEST(ConnectProcessGroupTest, ADifferentNetworkNamespaceIsADifferentHost) {
  const std::string here = ShmDomain();
  EXPECT_EQ(ChildShmDomain(false), here);  // a plain child is on this host
  const std::string there = ChildShmDomain(true);
  if (there.empty()) GTEST_SKIP() << "cannot create a network namespace here (needs root)";
  EXPECT_NE(there, here);
  // Only the network namespace differs.
  EXPECT_EQ(there.substr(0, there.rfind('|')), here.substr(0, here.rfind('|')));
}

}  // namespace
}  // namespace joule::worker
