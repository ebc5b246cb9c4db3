#include "worker/comm/gloo_process_group.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/in_process_kv.h"
#include "tests/testing/mismatched_calls.h"
#include "tests/testing/run_ranks.h"

namespace joule::worker {
namespace {

// `world` Gloo ranks as threads (testing::RunRanks).
void RunRanks(int world, std::chrono::milliseconds timeout,
              const std::function<void(int, ProcessGroup&)>& body) {
  testing::RunRanks<GlooProcessGroup>(
      world,
      [&](int r, KvClient& kv) {
        GlooOptions options;
        options.timeout = timeout;
        return GlooProcessGroup::Create(r, world, kv, options);
      },
      [&](int r, GlooProcessGroup& pg) { body(r, pg); });
}

TEST(GlooProcessGroupTest, AllreduceSumsAcrossRanks) {
  constexpr int kWorld = 3;
  constexpr size_t kN = 300001;  // several Gloo segments, odd length
  RunRanks(kWorld, std::chrono::seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<float> data(kN);
    for (size_t i = 0; i < kN; ++i) data[i] = static_cast<float>(rank + 1) * (i % 7);
    ASSERT_TRUE(pg.AllreduceSum(data).ok());
    for (size_t i = 0; i < kN; i += 9973) {
      ASSERT_FLOAT_EQ(data[i], 6.0f * (i % 7)) << "rank " << rank << " index " << i;
    }
  });
}

TEST(GlooProcessGroupTest, BroadcastCopiesTheRootsBuffer) {
  RunRanks(2, std::chrono::seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<float> data(1000, static_cast<float>(rank));
    if (rank == 1) data[17] = 42;
    ASSERT_TRUE(pg.Broadcast(data, 1).ok());
    EXPECT_EQ(data[0], 1.0f);
    EXPECT_EQ(data[17], 42.0f);
    EXPECT_TRUE(pg.Barrier().ok());
  });
}

TEST(GlooProcessGroupTest, AllgatherConcatenatesInRankOrder) {
  RunRanks(3, std::chrono::seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<float> in = {static_cast<float>(rank), static_cast<float>(10 * rank)};
    std::vector<float> out(6, -1.0f);
    ASSERT_TRUE(pg.Allgather(in, out).ok());
    EXPECT_EQ(out, (std::vector<float>{0, 0, 1, 10, 2, 20}));
    std::vector<float> wrong(5);
    EXPECT_EQ(pg.Allgather(in, wrong).code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST(GlooProcessGroupTest, AsyncAllreducesInFlightCompleteInIssueOrder) {
  RunRanks(2, std::chrono::seconds(30), [](int rank, ProcessGroup& pg) {
    std::vector<SharedBuffer> buffers;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 8; ++i) {
      // Different lengths: a mismatch between ranks' order would fail or mix them up.
      buffers.push_back(std::make_shared<Buffer>(1000 + 37 * i,
                                                             static_cast<float>(rank + i)));
      works.push_back(pg.AllreduceAsync(buffers.back(), ReduceOp::kAverage));
    }
    for (int i = 7; i >= 0; --i) ASSERT_TRUE(works[i]->Wait().ok());
    for (int i = 0; i < 8; ++i) {
      EXPECT_FLOAT_EQ((*buffers[i])[0], i + 0.5f) << i;  // mean of i and i + 1
      EXPECT_FLOAT_EQ(buffers[i]->back(), i + 0.5f) << i;
    }
  });
}

TEST(GlooProcessGroupTest, HalfPrecisionBuffersAndFp16OnTheWire) {
  RunRanks(2, std::chrono::seconds(30), [](int rank, ProcessGroup& pg) {
    // Small integers are exact in binary16: 1.0 = 0x3C00, 2.0 = 0x4000, 3.0 = 0x4200.
    std::vector<Half> h(1001, rank == 0 ? Half{0x3C00} : Half{0x4000});
    ASSERT_TRUE(pg.AllreduceHalf(h, ReduceOp::kSum).ok());
    EXPECT_EQ(h[0], Half{0x4200});
    EXPECT_EQ(h[1000], Half{0x4200});
    // fp16 on the wire: 1/3 is not representable; the average of the half-rounded
    // values, rounded to half, is 0.333251953125 on both ranks.
    auto buf = std::make_shared<Buffer>(100, 1.0f / 3.0f);
    ASSERT_TRUE(pg.AllreduceAsync(buf, ReduceOp::kAverage, Precision::kFloat16)->Wait().ok());
    EXPECT_EQ((*buf)[0], 0.333251953125f);
    EXPECT_EQ((*buf)[99], 0.333251953125f);
  });
}

TEST(GlooProcessGroupTest, Fp16AveragesDivideBeforeTheHalfSum) {
  // 4 x 20000 overflows binary16 (max 65504); dividing first, as DDP's
  // fp16_compress_hook does, keeps the average finite.
  RunRanks(4, std::chrono::seconds(30), [](int rank, ProcessGroup& pg) {
    auto buf = std::make_shared<Buffer>(10, 20000.0f);
    ASSERT_TRUE(pg.AllreduceAsync(buf, ReduceOp::kAverage, Precision::kFloat16)->Wait().ok());
    EXPECT_EQ((*buf)[0], 20000.0f);
  });
}

TEST(GlooProcessGroupTest, ADeadPeerIsAnErrorNotAHang) {
  RunRanks(2, std::chrono::seconds(5), [](int rank, ProcessGroup& pg) {
    if (rank == 1) return;  // leaves: its group is destroyed, its sockets close
    std::vector<float> data(1 << 16, 1.0f);
    absl::Status s = pg.AllreduceSum(data);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find("rank 0"), std::string::npos) << s;
  });
}

TEST(GlooProcessGroupTest, AbortReleasesACollectiveThatAFrozenPeerNeverJoins) {
  // Rank 1 is alive (its sockets stay open) but never enters the allreduce, like a
  // SIGSTOPped process: only Abort() can release rank 0 before the 60 s timeout.
  std::atomic<bool> released{false};
  RunRanks(2, std::chrono::seconds(60), [&](int rank, ProcessGroup& pg) {
    if (rank == 1) {
      while (!released) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      pg.Abort();
    });
    std::vector<float> data(1 << 16, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = pg.AllreduceSum(data);
    const auto waited = std::chrono::steady_clock::now() - start;
    aborter.join();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_LT(waited, std::chrono::seconds(5));
    EXPECT_EQ(pg.AllreduceSum(data).code(), absl::StatusCode::kAborted);  // and stays so
    EXPECT_EQ(data[0], 1.0f);  // the caller's buffer is untouched
    released = true;
  });
}

TEST(GlooProcessGroupTest, RanksThatDisagreeOnACollectiveAllFailNamingTheOddRank) {
  // Every kind of disagreement, the odd rank in the middle and first: a clear error on
  // every rank, no abort from Gloo's transport thread, no timeout; the group stays usable.
  for (const testing::MismatchedCall& c : testing::MismatchedCalls()) {
    for (int odd : {1, 0}) {
      RunRanks(3, std::chrono::seconds(20), [&](int rank, ProcessGroup& pg) {
        const auto start = std::chrono::steady_clock::now();
        absl::Status s = c.run(pg, rank == odd);
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << c.name;
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.name << ": " << s;
        const std::string m(s.message());
        EXPECT_NE(m.find("different collectives"), std::string::npos) << c.name << ": " << m;
        const std::string named = odd == 0 ? "rank 0 " + c.odd_text
                                           : absl::StrCat("rank ", odd, " ", c.odd_text);
        EXPECT_NE(m.find(named), std::string::npos) << c.name << ": " << m;
        std::vector<float> data(10, 1.0f);
        ASSERT_TRUE(pg.AllreduceSum(data).ok()) << c.name;
        EXPECT_EQ(data[9], 3.0f) << c.name;
      });
    }
  }
}

TEST(GlooProcessGroupTest, EmptyCollectivesTakePart) {
  RunRanks(2, std::chrono::seconds(20), [](int rank, ProcessGroup& pg) {
    std::vector<float> none;
    EXPECT_TRUE(pg.AllreduceSum(none).ok());
    EXPECT_TRUE(pg.Broadcast(none, 1).ok());
    std::vector<float> out;
    EXPECT_TRUE(pg.Allgather(none, out).ok());
    EXPECT_TRUE(pg.Barrier().ok());
  });
}

TEST(GlooProcessGroupTest, RendezvousTimesOutWhenARankNeverComes) {
  server::RendezvousKv kv;
  kv.OpenScope("s");
  testing::InProcessKv client(kv, "s");
  GlooOptions options;
  options.timeout = std::chrono::milliseconds(300);
  auto pg = GlooProcessGroup::Create(0, 2, client, options);
  EXPECT_FALSE(pg.ok());
}

}  // namespace
}  // namespace joule::worker
