#include "common/http_server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "tests/testing/process.h"

namespace joule {
namespace {

// Destroyed right after Start (a standby coordinator that wins the lease at once): httplib
// ignored a stop that came before its listening loop began, and the loop then never ended.
// Each time here, the server stops. (A watchdog ends the test, failed, rather than hang.)
TEST(HttpServerTest, StopsWhenDestroyedRightAfterStart) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread cycles([&] {
    for (int i = 0; i < 300; ++i) {
      auto server = std::make_unique<HttpServer>();
      server->Serve("/metrics", [] { return HttpServer::Response{"text/plain", "up 1\n"}; });
      if (!server->Start("127.0.0.1:0").ok()) ADD_FAILURE() << "start " << i;
    }
    done.set_value();
  });
  if (finished.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "a server destroyed right after Start never stopped";
    std::fflush(stdout);
    std::_Exit(1);
  }
  cycles.join();
}

// A client that keeps its connection open between requests (Prometheus does, between
// scrapes) must not hold the server's stop up for the whole keep-alive time: a standby
// coordinator hands its port to the leader's server by stopping its own, and httplib's
// default 5 s there cost a new leader its first lease.
TEST(HttpServerTest, StopsPromptlyWhileAClientKeepsAnIdleConnectionOpen) {
  auto server = std::make_unique<HttpServer>();
  server->Serve("/metrics", [] { return HttpServer::Response{"text/plain", "up 1\n"}; });
  ASSERT_TRUE(server->Start("127.0.0.1:0").ok());
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(server->address().substr(server->address().rfind(':') + 1), &port));
  testing::KeptAliveConnection scrape(port, "/metrics");
  ASSERT_TRUE(scrape.ok());
  EXPECT_NE(scrape.response().find("up 1"), std::string::npos) << scrape.response();
  EXPECT_EQ(scrape.response().find("Connection: close"), std::string::npos) << scrape.response();

  const auto before = std::chrono::steady_clock::now();
  server.reset();
  const auto took = std::chrono::steady_clock::now() - before;
  // The bound is the server's keep-alive (1 s) and a margin, well under httplib's 5 s.
  EXPECT_LT(took, std::chrono::milliseconds(2500))
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_TRUE(scrape.ClosedByServer());
}

}  // namespace
}  // namespace joule
