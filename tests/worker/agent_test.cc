// The worker's agent against a real coordinator in this process, through the stub seam
// (an in-process channel): it registers, takes the coordinator's data roots, trains what
// it is assigned and reports the result with its job's uid.
#include "worker/agent/agent.h"

#include <gtest/gtest.h>

#include <thread>

#include "server/coordinator_server.h"

namespace joule::worker {
namespace {

using namespace std::chrono_literals;

TEST(AgentTest, RegistersTrainsAndReportsOverTheStubItIsGiven) {
  server::CoordinatorServerOptions options;
  options.address = "127.0.0.1:0";
  options.coordinator.join_token = "join";
  options.tls.insecure = true;
  auto server = server::CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  server::Coordinator& c = (*server)->coordinator();

  AgentOptions agent_options;
  agent_options.join_token = "join";
  agent_options.host = "agent-under-test";
  agent_options.metrics_address = "";
  agent_options.energy_period = 0ms;  // no meter: the report says so
  agent_options.transport = Transport::kGloo;
  auto agent = Agent::Create(agent_options,
                             v1::WorkerService::NewStub((*server)->InProcessChannel()));
  ASSERT_TRUE(agent.ok()) << agent.status();
  std::thread run([&] { (*agent)->Run(); });

  v1::JobSpec spec;
  spec.set_model("logreg");
  spec.set_dataset("synthetic:1x4x4:2:256");
  spec.set_workers(1);
  spec.set_global_batch_size(32);
  spec.set_epochs(1);
  spec.mutable_optimizer()->set_lr(0.1);
  bool existing;
  auto id = c.Submit(spec, "", &existing);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::Job job;
  bool final = false;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (!final && std::chrono::steady_clock::now() < deadline) {
    auto changed = c.WaitForJobChange(*id, &job, deadline, &final);
    ASSERT_TRUE(changed.ok()) << changed.status();
  }
  std::vector<v1::WorkerInfo> workers = c.ListWorkers();
  (*agent)->Stop();
  run.join();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].host(), "agent-under-test");
  EXPECT_GT(workers[0].memory_bytes(), 0);  // MemAvailable, reported at registration
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  ASSERT_EQ(job.result().ranks_size(), 1);
  EXPECT_EQ(job.result().steps(), 256 / 32);
  EXPECT_FALSE(job.result().ranks(0).parameter_hash().empty());
  bool warned = false;  // metering off is said, not silent
  for (const std::string& w : job.result().energy().warnings()) {
    warned |= w.find("reported no energy") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

}  // namespace
}  // namespace joule::worker

namespace joule::worker {
namespace {

// Several coordinators, comma-separated: every entry must name one; each is checked as a
// single address is (plain text only to loopback).
TEST(AgentOptionsTest, CoordinatorAddressesAreCheckedEachOne) {
  for (const char* bad : {"", ",", "127.0.0.1:7070,", ",127.0.0.1:7070", "a:1,,b:2", " , "}) {
    AgentOptions o;
    o.coordinator = bad;
    EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  AgentOptions good;
  good.coordinator = "127.0.0.1:7070, 127.0.0.1:7071";
  EXPECT_TRUE(good.Validate().ok()) << good.Validate();
  // The second address is off loopback: plain text to it is refused.
  AgentOptions remote;
  remote.coordinator = "127.0.0.1:7070,198.18.0.9:7070";
  remote.tls.insecure = true;
  remote.metrics_address = "";
  EXPECT_EQ(Agent::Create(remote).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace joule::worker
