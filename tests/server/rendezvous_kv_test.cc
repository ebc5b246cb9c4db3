#include "server/rendezvous_kv.h"

#include <gtest/gtest.h>

#include <thread>

namespace joule::server {
namespace {

using std::chrono::milliseconds;

TEST(RendezvousKvTest, SetThenGet) {
  RendezvousKv kv;
  kv.OpenScope("job/1/attempt/1");
  ASSERT_TRUE(kv.Set("job/1/attempt/1", "rank0", "addr0").ok());
  auto v = kv.Get("job/1/attempt/1", "rank0", milliseconds(0));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "addr0");
}

TEST(RendezvousKvTest, ScopesAreIsolated) {
  RendezvousKv kv;
  kv.OpenScope("a");
  kv.OpenScope("b");
  ASSERT_TRUE(kv.Set("a", "k", "1").ok());
  EXPECT_EQ(kv.Get("b", "k", milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(RendezvousKvTest, GetWaitsForALaterSet) {
  RendezvousKv kv;
  kv.OpenScope("s");
  std::thread setter([&] { ASSERT_TRUE(kv.Set("s", "late", "v").ok()); });
  auto v = kv.Get("s", "late", milliseconds(10000));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
}

TEST(RendezvousKvTest, WaitTimesOutNamingMissingKeys) {
  RendezvousKv kv;
  kv.OpenScope("s");
  ASSERT_TRUE(kv.Set("s", "a", "1").ok());
  absl::Status st = kv.Wait("s", {"a", "b"}, milliseconds(20));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(std::string(st.message()).find("b"), std::string::npos);
}

TEST(RendezvousKvTest, ClosingAScopeReleasesWaitersAndForgetsKeys) {
  RendezvousKv kv;
  kv.OpenScope("s");
  absl::Status waited;
  std::thread waiter([&] { waited = kv.Wait("s", {"never"}, milliseconds(60000)); });
  // Wait until the waiter is parked: the scope can only be closed once.
  while (kv.ScopeCount() != 1) std::this_thread::yield();
  kv.CloseScope("s");
  waiter.join();
  EXPECT_TRUE(waited.code() == absl::StatusCode::kAborted ||
              waited.code() == absl::StatusCode::kNotFound)
      << waited;
  EXPECT_EQ(kv.ScopeCount(), 0u);
  EXPECT_EQ(kv.Set("s", "k", "v").code(), absl::StatusCode::kNotFound);
}

TEST(RendezvousKvTest, RejectsHostileSizes) {
  RendezvousKv kv;
  kv.OpenScope("s");
  EXPECT_EQ(kv.Set("s", "", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("s", std::string(RendezvousKv::kMaxKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("s", "k", std::string(RendezvousKv::kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("unopened", "k", "v").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace joule::server
