// The contract of ProcessGroup (worker/comm/process_group.h), checked on every transport:
// Gloo over loopback, shared memory, and NCCL (ctest worker_process_group_nccl_test, label
// gpu: each case skips unless the host has a CUDA device per rank). Ranks are threads of
// this process (testing::RunRanks). What only one transport does is tested in its own
// file: shared memory's registered buffers and segments, Gloo's rendezvous, NCCL's device
// buffers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/mismatched_calls.h"
#include "tests/testing/run_ranks.h"
#include "worker/comm/gloo_process_group.h"
#include "worker/comm/shm_process_group.h"
#ifdef JOULE_WITH_NCCL
#include <cuda_runtime_api.h>

#include "worker/comm/nccl_process_group.h"
#endif

namespace joule::worker {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

enum class Kind { kGloo, kShm, kNccl };

std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kGloo:
      return "Gloo";
    case Kind::kShm:
      return "Shm";
    case Kind::kNccl:
      return "Nccl";
  }
  return "Unknown";
}

// Why `kind` cannot run `world` ranks on this host ("" when it can).
std::string CannotRun(Kind kind, int world) {
  if (kind != Kind::kNccl) return "";
#ifdef JOULE_WITH_NCCL
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices == 0) return "no CUDA device";
  if (devices < world) {
    return absl::StrCat("needs ", world, " CUDA devices (NCCL allows one rank per GPU), has ",
                        devices);
  }
  return "";
#else
  (void)world;
  return "built without NCCL";
#endif
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateGroup(Kind kind, int rank, int world,
                                                          KvClient& kv, milliseconds timeout) {
  switch (kind) {
    case Kind::kGloo: {
      GlooOptions o;
      o.timeout = timeout;
      return GlooProcessGroup::Create(rank, world, kv, o);
    }
    case Kind::kShm: {
      ShmOptions o;
      o.timeout = timeout;
      o.slot_floats = 1024;  // buffers of more than 1024 floats take several rounds
      return ShmProcessGroup::Create(rank, world, kv, o);
    }
    case Kind::kNccl: {
#ifdef JOULE_WITH_NCCL
      NcclOptions o;
      o.device = rank;  // rank r on device r
      o.timeout = timeout;
      return NcclProcessGroup::Create(rank, world, kv, o);
#else
      break;
#endif
    }
  }
  return absl::UnimplementedError("transport not built");
}

// Segments in /dev/shm created by this process.
std::vector<std::string> JouleSegments() {
  std::vector<std::string> out;
  const std::string prefix = absl::StrCat("joule-", getpid(), "-");
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  }
  return out;
}

class ProcessGroupTest : public ::testing::TestWithParam<Kind> {
 protected:
  Kind kind() const { return GetParam(); }
  // `world` ranks of this test's transport as threads; each runs `body` on its group.
  void Run(int world, milliseconds timeout,
           const std::function<void(int, ProcessGroup&)>& body) {
    testing::RunRanks<ProcessGroup>(
        world,
        [&](int r, KvClient& kv) { return CreateGroup(kind(), r, world, kv, timeout); }, body);
  }
};

// Skips the test unless its transport can run `world` ranks here.
#define REQUIRE_RANKS(world)                                                      \
  if (const std::string why = CannotRun(GetParam(), world); !why.empty()) {       \
    GTEST_SKIP() << why;                                                          \
  }

TEST_P(ProcessGroupTest, AllreduceSumsAcrossRanks) {
  // Two ranks take Gloo's one-exchange path, three its ring: both give every rank the same
  // bits, and for two ranks the bits of a + b (rounded once).
  for (int world : {2, 3}) {
    REQUIRE_RANKS(world);
    constexpr size_t kN = 300001;  // several Gloo segments, many shared-memory rounds, odd
    std::mutex mu;
    std::vector<std::vector<float>> results(world);
    Run(world, seconds(30), [&](int rank, ProcessGroup& pg) {
      std::vector<float> data(kN), inexact(kN);
      for (size_t i = 0; i < kN; ++i) {
        data[i] = static_cast<float>(rank + 1) * (i % 7);
        inexact[i] = 0.1f * static_cast<float>(rank + 1) + 1e-3f * static_cast<float>(i);
      }
      ASSERT_TRUE(pg.AllreduceSum(data).ok());
      const float want = static_cast<float>(world * (world + 1) / 2);
      for (size_t i = 0; i < kN; ++i) {
        ASSERT_EQ(data[i], want * (i % 7)) << "world " << world << " rank " << rank << " index " << i;
      }
      ASSERT_TRUE(pg.AllreduceSum(inexact).ok());
      std::lock_guard<std::mutex> lock(mu);
      results[rank] = std::move(inexact);
    });
    for (int r = 1; r < world; ++r) EXPECT_EQ(results[r], results[0]) << "world " << world;
    if (world == 2) {
      for (size_t i = 0; i < kN; i += 997) {
        const float a = 0.1f + 1e-3f * static_cast<float>(i), b = 0.2f + 1e-3f * static_cast<float>(i);
        ASSERT_EQ(results[0][i], a + b) << i;
      }
    }
  }
}

TEST_P(ProcessGroupTest, AllreduceSumsAndAveragesOverSeveralRounds) {
  REQUIRE_RANKS(3);
  constexpr size_t kN = 5000 + 7;  // shared memory: 5 rounds of 1024, the last one short
  Run(3, seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<float> data(kN);
    for (size_t i = 0; i < kN; ++i) data[i] = static_cast<float>(rank + 1) * (i % 7);
    ASSERT_TRUE(pg.Allreduce(data, ReduceOp::kSum).ok());
    for (size_t i = 0; i < kN; ++i) ASSERT_FLOAT_EQ(data[i], 6.0f * (i % 7)) << i;
    ASSERT_TRUE(pg.Allreduce(data, ReduceOp::kAverage).ok());
    for (size_t i = 0; i < kN; ++i) ASSERT_FLOAT_EQ(data[i], 6.0f * (i % 7)) << i;
    auto buf = std::make_shared<Buffer>(3000, static_cast<float>(rank));
    ASSERT_TRUE(pg.AllreduceAsync(buf, ReduceOp::kAverage)->Wait().ok());
    EXPECT_FLOAT_EQ(buf->back(), 1.0f);
  });
  EXPECT_TRUE(JouleSegments().empty()) << "a shared-memory segment is unlinked once mapped";
}

TEST_P(ProcessGroupTest, AsyncAllreducesInFlightCompleteInIssueOrder) {
  REQUIRE_RANKS(2);
  Run(2, seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<SharedBuffer> buffers;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 8; ++i) {
      // Different lengths: a mismatch between ranks' order would fail or mix them up.
      buffers.push_back(std::make_shared<Buffer>(1000 + 37 * i, static_cast<float>(rank + i)));
      works.push_back(pg.AllreduceAsync(buffers.back(), ReduceOp::kAverage));
    }
    for (int i = 7; i >= 0; --i) ASSERT_TRUE(works[i]->Wait().ok());
    for (int i = 0; i < 8; ++i) {
      EXPECT_FLOAT_EQ((*buffers[i])[0], i + 0.5f) << i;  // mean of i and i + 1
      EXPECT_FLOAT_EQ(buffers[i]->back(), i + 0.5f) << i;
    }
  });
}

TEST_P(ProcessGroupTest, HalfPrecisionBuffersAndFp16OnTheWire) {
  // Small integers are exact in binary16: 1.0 = 0x3C00, 2.0 = 0x4000, 3.0 = 0x4200,
  // 5.0 = 0x4500. 1/3 is not representable: the average of the half-rounded values,
  // rounded to half, is 0.333251953125 on every rank.
  struct Case {
    int world;
    size_t halves;  // shared memory: 2500 take three rounds of 1024
    Half sum;       // rank 0 contributes 1, the others 2
    size_t floats;
  };
  for (const Case& c : {Case{2, 1001, Half{0x4200}, 100}, Case{3, 2500, Half{0x4500}, 3000}}) {
    REQUIRE_RANKS(c.world);
    Run(c.world, seconds(30), [&](int rank, ProcessGroup& pg) {
      std::vector<Half> h(c.halves, rank == 0 ? Half{0x3C00} : Half{0x4000});
      ASSERT_TRUE(pg.AllreduceHalf(h, ReduceOp::kSum).ok());
      EXPECT_EQ(h[0], c.sum);
      EXPECT_EQ(h.back(), c.sum);
      auto buf = std::make_shared<Buffer>(c.floats, 1.0f / 3.0f);
      ASSERT_TRUE(pg.AllreduceAsync(buf, ReduceOp::kAverage, Precision::kFloat16)->Wait().ok());
      EXPECT_EQ((*buf)[0], 0.333251953125f);
      EXPECT_EQ(buf->back(), 0.333251953125f);
    });
  }
}

TEST_P(ProcessGroupTest, Fp16AveragesDivideBeforeTheHalfSum) {
  REQUIRE_RANKS(4);
  // 4 x 20000 overflows binary16 (max 65504); dividing first, as DDP's
  // fp16_compress_hook does, keeps the average finite.
  Run(4, seconds(30), [](int rank, ProcessGroup& pg) {
    auto buf = std::make_shared<Buffer>(10, 20000.0f);
    ASSERT_TRUE(pg.AllreduceAsync(buf, ReduceOp::kAverage, Precision::kFloat16)->Wait().ok());
    EXPECT_EQ((*buf)[0], 20000.0f);
  });
}

TEST_P(ProcessGroupTest, BroadcastCopiesTheRootsBuffer) {
  REQUIRE_RANKS(2);
  Run(2, seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<float> data(1000, static_cast<float>(rank));
    if (rank == 1) data[17] = 42;
    ASSERT_TRUE(pg.Broadcast(data, 1).ok());
    EXPECT_EQ(data[0], 1.0f);
    EXPECT_EQ(data[17], 42.0f);
    EXPECT_TRUE(pg.Barrier().ok());
  });
}

TEST_P(ProcessGroupTest, AllgatherConcatenatesInRankOrder) {
  REQUIRE_RANKS(3);
  Run(3, seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<float> in = {static_cast<float>(rank), static_cast<float>(10 * rank)};
    std::vector<float> out(6, -1.0f);
    ASSERT_TRUE(pg.Allgather(in, out).ok());
    EXPECT_EQ(out, (std::vector<float>{0, 0, 1, 10, 2, 20}));
    std::vector<float> wrong(5);
    EXPECT_EQ(pg.Allgather(in, wrong).code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST_P(ProcessGroupTest, BroadcastAllgatherBarrierOverSeveralRounds) {
  REQUIRE_RANKS(3);
  Run(3, seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<float> data(2500, static_cast<float>(rank));
    if (rank == 2) data[2400] = 42;
    ASSERT_TRUE(pg.Broadcast(data, 2).ok());
    EXPECT_EQ(data[0], 2.0f);
    EXPECT_EQ(data[2400], 42.0f);
    std::vector<float> in(1500, static_cast<float>(rank));
    std::vector<float> all(4500);
    ASSERT_TRUE(pg.Allgather(in, all).ok());
    EXPECT_EQ(all[0], 0.0f);
    EXPECT_EQ(all[1499], 0.0f);
    EXPECT_EQ(all[1500], 1.0f);
    EXPECT_EQ(all[4499], 2.0f);
    EXPECT_TRUE(pg.Barrier().ok());
    EXPECT_EQ(pg.Broadcast(data, 3).code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST_P(ProcessGroupTest, EmptyCollectivesTakePart) {
  REQUIRE_RANKS(2);
  Run(2, seconds(20), [](int rank, ProcessGroup& pg) {
    std::vector<float> none;
    EXPECT_TRUE(pg.AllreduceSum(none).ok());
    EXPECT_TRUE(pg.Broadcast(none, 1).ok());
    std::vector<float> out;
    EXPECT_TRUE(pg.Allgather(none, out).ok());
    EXPECT_EQ(pg.NewBuffer(0)->registration(), 0u);
    EXPECT_TRUE(pg.Barrier().ok());
    std::vector<float> data(3, 1.0f);
    EXPECT_TRUE(pg.AllreduceSum(data).ok());
    EXPECT_EQ(data[2], 2.0f);
  });
}

TEST_P(ProcessGroupTest, ADeadPeerIsAnErrorNotAHang) {
  REQUIRE_RANKS(2);
  // Rank 1 leaves only once rank 0's group is up: leaving while rank 0 is still in Gloo's
  // rendezvous would fail rank 0's creation instead of its collective (seen under load).
  std::atomic<bool> rank0_connected{false};
  Run(2, seconds(5), [&rank0_connected](int rank, ProcessGroup& pg) {
    if (rank == 1) {
      // Bounded: if rank 0's creation failed (its own assertion says so), rank 1 goes.
      const auto deadline = std::chrono::steady_clock::now() + seconds(30);
      while (!rank0_connected.load() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      return;  // leaves: its group is destroyed (sockets closed, segment marked)
    }
    rank0_connected = true;
    std::vector<float> data(1 << 16, 1.0f);
    absl::Status s = pg.AllreduceSum(data);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find("rank 0"), std::string::npos) << s;
  });
}

TEST_P(ProcessGroupTest, APeerThatNeverJoinsIsADeadline) {
  REQUIRE_RANKS(2);
  std::atomic<bool> released{false};
  Run(2, milliseconds(300), [&](int rank, ProcessGroup& pg) {
    if (rank == 1) {  // alive, never joins
      while (!released) std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    std::vector<float> data(100, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = pg.Allreduce(data, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
    released = true;
  });
}

TEST_P(ProcessGroupTest, AbortReleasesACollectiveThatAFrozenPeerNeverJoins) {
  REQUIRE_RANKS(2);
  // Rank 1 is alive (its sockets and mappings stay) but never enters the allreduce, like a
  // SIGSTOPped process: only Abort() can release rank 0 before the 60 s timeout.
  std::atomic<bool> released{false};
  Run(2, seconds(60), [&](int rank, ProcessGroup& pg) {
    if (rank == 1) {
      while (!released) std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    // Gives the allreduce time to start waiting (were it not yet, it would fail the same
    // way, at once); what is asserted waits for the collective's own result.
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(200));
      pg.Abort();
    });
    std::vector<float> data(1 << 16, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = pg.AllreduceSum(data);
    const auto waited = std::chrono::steady_clock::now() - start;
    aborter.join();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_LT(waited, seconds(5));
    EXPECT_EQ(pg.AllreduceSum(data).code(), absl::StatusCode::kAborted);  // and stays so
    EXPECT_EQ(data[0], 1.0f);  // the caller's buffer is untouched
    released = true;
  });
}

TEST_P(ProcessGroupTest, RanksThatDisagreeOnACollectiveAllFailNamingTheOddRank) {
  // Every kind of disagreement, the odd rank in the middle and first: a clear error on
  // every rank instead of misaligned sums, an abort from a transport thread or a timeout.
  // Gloo and NCCL skip the collective on every rank, so the group stays usable; shared
  // memory breaks the group, which says why ever after. (NCCL, on two GPUs, is checked
  // with the odd rank last and for its name only: its fp16 wire is a half allreduce.)
  const bool nccl = kind() == Kind::kNccl;
  const int world = nccl ? 2 : 3;
  REQUIRE_RANKS(world);
  for (const testing::MismatchedCall& c : testing::MismatchedCalls()) {
    for (int odd : nccl ? std::vector<int>{1} : std::vector<int>{1, 0}) {
      Run(world, seconds(20), [&](int rank, ProcessGroup& pg) {
        const auto start = std::chrono::steady_clock::now();
        absl::Status s = c.run(pg, rank == odd);
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.name << ": " << s;
        const std::string m(s.message());
        if (nccl) {
          EXPECT_NE(m.find("rank 1 "), std::string::npos) << c.name << ": " << m;
        } else {
          EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10)) << c.name;
          EXPECT_NE(m.find("different collectives"), std::string::npos) << c.name << ": " << m;
          const std::string named = odd == 0 ? "rank 0 " + c.odd_text
                                             : absl::StrCat("rank ", odd, " ", c.odd_text);
          EXPECT_NE(m.find(named), std::string::npos) << c.name << ": " << m;
        }
        std::vector<float> data(10, 1.0f);
        if (kind() == Kind::kShm) {
          absl::Status later = pg.AllreduceSum(data);
          EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << c.name;
          EXPECT_NE(later.message().find("different collectives"), std::string::npos) << later;
        } else {
          ASSERT_TRUE(pg.AllreduceSum(data).ok()) << c.name;
          EXPECT_EQ(data[9], static_cast<float>(world)) << c.name;
        }
      });
    }
  }
}

TEST_P(ProcessGroupTest, AgreedAllreducesInterleaveWithCheckedCollectives) {
  // A cycle of two bucket sizes, unchecked after the first round, between checked
  // broadcasts and allreduces of the same sizes (which Gloo must not confuse with them:
  // the agreed calls have tags of their own).
  REQUIRE_RANKS(2);
  Run(2, seconds(30), [](int rank, ProcessGroup& pg) {
    auto small = std::make_shared<Buffer>(1000);
    auto large = std::make_shared<Buffer>(70001);
    for (int round = 0; round < 4; ++round) {
      std::fill(small->begin(), small->end(), static_cast<float>(rank + round));
      std::fill(large->begin(), large->end(), static_cast<float>(2 * rank + round));
      std::shared_ptr<Work> a = round == 0 ? pg.AllreduceAsync(small, ReduceOp::kSum)
                                           : pg.AllreduceAgreedAsync(small, ReduceOp::kSum,
                                                                     Precision::kFloat32);
      std::shared_ptr<Work> b = round == 0 ? pg.AllreduceAsync(large, ReduceOp::kAverage)
                                           : pg.AllreduceAgreedAsync(large, ReduceOp::kAverage,
                                                                     Precision::kFloat32);
      std::vector<float> root(1000, static_cast<float>(rank == 0 ? 7 + round : -1));
      ASSERT_TRUE(pg.Broadcast(root, 0).ok());
      std::vector<float> sum(1000, 1.0f);
      ASSERT_TRUE(pg.AllreduceSum(sum).ok());
      ASSERT_TRUE(a->Wait().ok());
      ASSERT_TRUE(b->Wait().ok());
      EXPECT_EQ((*small)[999], 1.0f + 2 * round) << "round " << round;
      EXPECT_EQ((*large)[70000], 1.0f + round) << "round " << round;
      EXPECT_EQ(root[999], 7.0f + round) << "round " << round;
      EXPECT_EQ(sum[999], 2.0f) << "round " << round;
    }
  });
}

TEST_P(ProcessGroupTest, ARankThatLeavesTheAgreedCycleFailsWithoutMixingBuffers) {
  // Rank 1 issues a checked allreduce where rank 0 issues an agreed one of the same size:
  // on Gloo they cannot pair up (different tags), so both fail at the timeout and neither
  // buffer takes the other's values. The other transports check every call anyway.
  if (kind() != Kind::kGloo) GTEST_SKIP() << "only Gloo skips the check";
  REQUIRE_RANKS(2);
  Run(2, seconds(2), [](int rank, ProcessGroup& pg) {
    auto data = std::make_shared<Buffer>(4096, static_cast<float>(rank + 1));
    absl::Status s = rank == 0
                         ? pg.AllreduceAgreedAsync(data, ReduceOp::kSum, Precision::kFloat32)->Wait()
                         : pg.AllreduceAsync(data, ReduceOp::kSum)->Wait();
    EXPECT_FALSE(s.ok()) << "rank " << rank;
    EXPECT_EQ((*data)[4095], static_cast<float>(rank + 1)) << "rank " << rank;
  });
}

// Every rank probes each peer once; a transport with links (Gloo) times each one, the
// others (shared memory, NCCL) return none. Then collectives go on as before: the probe's
// slots and tags do not meet theirs.
TEST_P(ProcessGroupTest, ALinkProbeTimesEachPeerOnceOrNoneWithoutLinks) {
  for (int world : {2, 3, 4}) {
    REQUIRE_RANKS(world);
    Run(world, seconds(30), [world, this](int rank, ProcessGroup& pg) {
      absl::StatusOr<std::vector<LinkProbe>> probes = pg.ProbeLinks(64 << 10);
      ASSERT_TRUE(probes.ok()) << probes.status();
      if (kind() != Kind::kGloo) {
        EXPECT_TRUE(probes->empty());
      } else {
        std::set<int> peers;
        for (const LinkProbe& p : *probes) {
          peers.insert(p.peer);
          EXPECT_EQ(p.bytes, 64 << 10);
          EXPECT_GT(p.megabytes_per_second(), 0) << "rank " << rank << " from " << p.peer;
        }
        std::set<int> others;
        for (int r = 0; r < world; ++r) {
          if (r != rank) others.insert(r);
        }
        EXPECT_EQ(peers, others) << "rank " << rank;
        EXPECT_EQ(probes->size(), others.size());
      }
      std::vector<float> one(5, 1.0f);
      ASSERT_TRUE(pg.AllreduceSum(one).ok());
      EXPECT_EQ(one[4], static_cast<float>(world));
    });
  }
}

// The probe schedule: in each round every rank meets at most one other, partners agree,
// and over the rounds every pair meets exactly once.
TEST(RoundRobinTest, EveryPairMeetsExactlyOnceAndNoRankTwiceInARound) {
  for (int size = 1; size <= 9; ++size) {
    std::map<std::pair<int, int>, int> met;
    for (int round = 0; round < RoundRobinRounds(size); ++round) {
      for (int r = 0; r < size; ++r) {
        const int p = RoundRobinPartner(r, size, round);
        if (p < 0) continue;
        ASSERT_NE(p, r) << size << "/" << round;
        ASSERT_LT(p, size);
        ASSERT_EQ(RoundRobinPartner(p, size, round), r) << size << "/" << round;
        if (r < p) ++met[{r, p}];
      }
    }
    EXPECT_EQ(met.size(), static_cast<size_t>(size * (size - 1) / 2)) << size;
    for (const auto& [pair, n] : met) EXPECT_EQ(n, 1) << size;
  }
  EXPECT_EQ(RoundRobinRounds(1), 0);
  EXPECT_EQ(RoundRobinRounds(4), 3);
  EXPECT_EQ(RoundRobinRounds(5), 5);
}

INSTANTIATE_TEST_SUITE_P(Transports, ProcessGroupTest,
                         ::testing::Values(Kind::kGloo, Kind::kShm, Kind::kNccl), KindName);

}  // namespace
}  // namespace joule::worker
