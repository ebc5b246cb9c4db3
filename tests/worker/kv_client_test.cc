// KvAllgather over the coordinator's real rendezvous store, ranks as threads.
#include "worker/comm/kv_client.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "server/rendezvous_kv.h"
#include "tests/testing/in_process_kv.h"

namespace joule::worker {
namespace {

using std::chrono::milliseconds;

TEST(KvAllgatherTest, EveryRankGetsEveryValueInRankOrder) {
  for (const int size : {1, 2, 5}) {
    server::RendezvousKv store;
    store.OpenScope("job-1/attempt-1");
    std::vector<absl::StatusOr<std::vector<std::string>>> got(size, absl::UnknownError(""));
    std::vector<std::thread> ranks;
    for (int r = 0; r < size; ++r) {
      ranks.emplace_back([&, r] {
        testing::InProcessKv kv(store, "job-1/attempt-1");
        got[r] = KvAllgather(kv, "fingerprint", r, size, "value of " + std::to_string(r),
                             milliseconds(10000));
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(got[r].ok()) << got[r].status();
      ASSERT_EQ(got[r]->size(), static_cast<size_t>(size));
      for (int q = 0; q < size; ++q) EXPECT_EQ((*got[r])[q], "value of " + std::to_string(q));
    }
  }
}

// A rank that never arrives: the others end at their timeout with the key they missed.
TEST(KvAllgatherTest, AMissingRankIsADeadlineNamingItsKey) {
  server::RendezvousKv store;
  store.OpenScope("job-1/attempt-1");
  testing::InProcessKv kv(store, "job-1/attempt-1");
  absl::StatusOr<std::vector<std::string>> got =
      KvAllgather(kv, "domain", 0, 2, "mine", milliseconds(50));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_NE(got.status().message().find("domain/1"), std::string::npos) << got.status();
  // Names are their own keys: another allgather in the same scope is not confused by it.
  testing::InProcessKv other(store, "job-1/attempt-1");
  EXPECT_FALSE(KvAllgather(other, "allgather", 1, 2, "x", milliseconds(50)).ok());
}

}  // namespace
}  // namespace joule::worker
