// What only the Gloo transport does. The ProcessGroup contract (collectives, fp16, dead
// peers, Abort, mismatched calls, timeouts) is checked on every transport in
// process_group_test.cc.
#include "worker/comm/gloo_process_group.h"

#include <gtest/gtest.h>

#include "server/rendezvous_kv.h"
#include "tests/testing/in_process_kv.h"

namespace joule::worker {
namespace {

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
