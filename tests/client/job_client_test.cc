// The CLI's JobService calls against a real coordinator in the process (its gRPC services
// over an in-process channel), and against an address where nothing listens.
#include "client/job_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/match.h"
#include "client/cli.h"
#include "server/coordinator_server.h"
#include "server/ha_coordinator.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/specs.h"

namespace joule::client {
namespace {

class JobClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::CoordinatorServerOptions o;
    o.address = "127.0.0.1:0";
    o.tls.insecure = true;
    auto s = server::CoordinatorServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    client_ = std::make_unique<JobClient>(v1::JobService::NewStub(server_->InProcessChannel()),
                                          server_->address());
  }
  static v1::SubmitJobRequest Request(const std::string& name) {
    v1::SubmitJobRequest r;
    *r.mutable_spec() = joule::testing::SmallMlpSpec(1);
    r.mutable_spec()->set_name(name);
    return r;
  }
  std::unique_ptr<server::CoordinatorServer> server_;
  std::unique_ptr<JobClient> client_;
};

TEST_F(JobClientTest, EveryCallReachesTheCoordinatorAndBringsItsAnswer) {
  absl::StatusOr<v1::SubmitJobResponse> submitted = client_->Submit(Request("a"));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_GT(submitted->job_id(), 0);
  EXPECT_FALSE(submitted->warning().empty());  // no worker registered: said, not refused
  absl::StatusOr<v1::Job> job = client_->GetJob(submitted->job_id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().name(), "a");
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING);
  v1::ListJobsRequest list;
  list.set_page_size(10);
  absl::StatusOr<v1::ListJobsResponse> listed = client_->ListJobs(list);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->jobs_size(), 1);
  EXPECT_EQ(listed->jobs(0).id(), submitted->job_id());
  absl::StatusOr<v1::ListWorkersResponse> workers = client_->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_EQ(workers->workers_size(), 0);
  v1::GetJobLogRequest log;
  log.set_job_id(submitted->job_id());
  absl::StatusOr<v1::GetJobLogResponse> lines = client_->GetJobLog(log);
  ASSERT_TRUE(lines.ok()) << lines.status();
  EXPECT_EQ(lines->lines_size(), 0);
  absl::StatusOr<v1::CancelJobResponse> cancelled = client_->Cancel(submitted->job_id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->job().state(), v1::JOB_STATE_CANCELLED);
}

// The coordinator's refusals keep their code and words, and each maps to the exit code
// the README gives: usage 2 for a bad request, 1 for a refused one, 3 for no coordinator.
TEST_F(JobClientTest, RefusalsKeepTheirCodeAndBecomeTheirExitCode) {
  absl::StatusOr<v1::Job> missing = client_->GetJob(424242);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("424242"), std::string::npos) << missing.status();
  EXPECT_EQ(client_->Report("status", missing.status()), kExitFailed);
  v1::SubmitJobRequest bad = Request("bad");
  bad.mutable_spec()->set_workers(0);
  absl::StatusOr<v1::SubmitJobResponse> refused = client_->Submit(bad);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(client_->Report("submit", refused.status()), kExitUsage);
  absl::StatusOr<v1::CancelJobResponse> again = client_->Cancel(424242);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();

  // Nothing listens on port 1: unavailable, within the call's deadline.
  JobClient nowhere(v1::JobService::NewStub(
                        grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials())),
                    "127.0.0.1:1");
  absl::StatusOr<v1::Job> unreachable = nowhere.GetJob(1);
  ASSERT_EQ(unreachable.status().code(), absl::StatusCode::kUnavailable) << unreachable.status();
  EXPECT_EQ(nowhere.Report("status", unreachable.status()), kExitUnavailable);
}

}  // namespace
}  // namespace joule::client

namespace joule::client {
namespace {

// Two coordinators standing by for one store (a SQLite file both open): the client, given
// both addresses, finds the leader whichever it asks first, and follows the standby when the
// leader resigns.
TEST(JobClientFailoverTest, CallsFindTheLeaderAmongStandbysAndFollowItWhenItResigns) {
  joule::testing::ScratchDir dir("joule_failover_");
  server::CoordinatorServerOptions o;
  o.address = "127.0.0.1:0";
  o.tls.insecure = true;
  o.coordinator.store = "sqlite:" + (dir / "jobs.db").string();
  server::HaOptions ha;
  ha.lease = std::chrono::milliseconds(600);
  auto wait_leading = [](server::HaCoordinatorServer& s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!s.leading() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return s.leading();
  };
  auto a = server::HaCoordinatorServer::Start(o, ha);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(wait_leading(**a));
  auto b = server::HaCoordinatorServer::Start(o, ha);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE((*b)->leading());
  auto stub = [](const std::string& address) -> std::shared_ptr<v1::JobService::StubInterface> {
    return v1::JobService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  };
  // The standby first: it names the leader, and the call goes there.
  JobClient client({stub((*b)->address()), stub((*a)->address())},
                   {(*b)->address(), (*a)->address()});
  v1::SubmitJobRequest request;
  *request.mutable_spec() = joule::testing::SmallMlpSpec(1);
  request.mutable_spec()->set_name("one");
  absl::StatusOr<v1::SubmitJobResponse> submitted = client.Submit(request);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(client.address(), (*a)->address());
  (*a)->Shutdown();  // resigns: the standby need not wait for the lease
  (*a)->Wait();
  ASSERT_TRUE(wait_leading(**b));
  absl::StatusOr<v1::Job> job = client.GetJob(submitted->job_id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(client.address(), (*b)->address());
  EXPECT_EQ(job->spec().name(), "one");
  // The submit carried a request id the client made, so a retry would find this job.
  EXPECT_TRUE(absl::StartsWith(job->request_id(), "anonymous/auto-")) << job->request_id();
  // Nobody answers: the call ends UNAVAILABLE after one try per address.
  (*b)->Shutdown();
  (*b)->Wait();
  absl::StatusOr<v1::Job> none = client.GetJob(submitted->job_id());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable) << none.status();
}

}  // namespace
}  // namespace joule::client
