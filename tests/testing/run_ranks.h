#ifndef JOULE_TESTS_TESTING_RUN_RANKS_H_
#define JOULE_TESTS_TESTING_RUN_RANKS_H_

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/rendezvous_kv.h"
#include "tests/testing/in_process_kv.h"
#include "worker/comm/gloo_process_group.h"

namespace joule::testing {

// Runs `world` ranks as threads of this process, joined through one rendezvous scope of
// an in-process copy of the coordinator's KV: rank r builds its group with
// `create(r, kv)` (asserting it succeeds) and then runs `body(r, group)`.
template <typename Group>
void RunRanks(
    int world,
    const std::function<absl::StatusOr<std::unique_ptr<Group>>(int, worker::KvClient&)>& create,
    const std::function<void(int, Group&)>& body) {
  server::RendezvousKv kv;
  kv.OpenScope("job/1/attempt/1");
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      InProcessKv client(kv, "job/1/attempt/1");
      absl::StatusOr<std::unique_ptr<Group>> group = create(r, client);
      ASSERT_TRUE(group.ok()) << "rank " << r << ": " << group.status();
      body(r, **group);
    });
  }
  for (auto& t : threads) t.join();
}

// RunRanks over Gloo on loopback with a 30 s collective timeout, each rank's body seeing
// its group as a ProcessGroup.
inline void RunGlooRanks(int world, const std::function<void(int, worker::ProcessGroup&)>& body) {
  RunRanks<worker::GlooProcessGroup>(
      world,
      [&](int r, worker::KvClient& kv) {
        worker::GlooOptions o;
        o.timeout = std::chrono::seconds(30);
        return worker::GlooProcessGroup::Create(r, world, kv, o);
      },
      [&](int r, worker::GlooProcessGroup& pg) { body(r, pg); });
}

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_RUN_RANKS_H_
