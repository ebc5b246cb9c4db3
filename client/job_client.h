#ifndef JOULE_CLIENT_JOB_CLIENT_H_
#define JOULE_CLIENT_JOB_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "joule/v1/job.grpc.pb.h"

namespace joule::client {

struct GlobalOptions;

// The CLI's unary calls to the coordinator's JobService: each carries the client's bearer
// token (PrepareContext, cli.h) and a 10 s deadline, and returns the answer or the RPC's
// status as an absl::Status (canonical code and message kept, so Report can tell an
// unreachable coordinator from a refused request). Over JobService::StubInterface: the
// production stub (JobStub), or in tests a channel to a real coordinator in the process.
// Thread-safe as the stub is.
class JobClient {
 public:
  JobClient(std::shared_ptr<v1::JobService::StubInterface> stub, std::string address);
  // The coordinator `g` names (ResolveCoordinator), over JobStub's channel.
  static JobClient ForCoordinator(const GlobalOptions& g);

  const std::string& address() const { return address_; }
  // For the streaming calls (watch, logs -f).
  v1::JobService::StubInterface& stub() { return *stub_; }

  absl::StatusOr<v1::SubmitJobResponse> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(int64_t id);
  absl::StatusOr<v1::CancelJobResponse> Cancel(int64_t id);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::GetJobLogResponse> GetJobLog(const v1::GetJobLogRequest& request);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();

  // Prints "error: WHAT: ..." for a failed call to stderr, in the words of ReportRpcError
  // (cli.h), and returns the matching exit code.
  int Report(const std::string& what, const absl::Status& status) const;

 private:
  std::shared_ptr<v1::JobService::StubInterface> stub_;
  std::string address_;
};

}  // namespace joule::client

#endif  // JOULE_CLIENT_JOB_CLIENT_H_
