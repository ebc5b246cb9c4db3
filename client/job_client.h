#ifndef JOULE_CLIENT_JOB_CLIENT_H_
#define JOULE_CLIENT_JOB_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
//
// Several coordinators (a leader and its standbys, comma-separated addresses): a call that
// finds one UNAVAILABLE or past its deadline (a standby, which names the leader in its
// "joule-leader" trailing metadata, one that is down or paused) is made again at the
// leader it named when that is one of the addresses, else at the next; each address at
// most once per call. The error returned is the most telling one: a coordinator's own
// before a standby's "the leader is at". A submit without a request id gets a random one
// first, so that a submit sent twice is stored once.
class JobClient {
 public:
  JobClient(std::shared_ptr<v1::JobService::StubInterface> stub, std::string address);
  // One stub per address (addresses[i] for stubs[i]); at least one.
  JobClient(std::vector<std::shared_ptr<v1::JobService::StubInterface>> stubs,
            std::vector<std::string> addresses);
  // The coordinator(s) `g` names (ResolveCoordinator), over JobStub's channels.
  static JobClient ForCoordinator(const GlobalOptions& g);
  // The address last answered (or tried).
  const std::string& address() const { return addresses_[current_.load()]; }
  size_t address_count() const { return addresses_.size(); }
  // For the streaming calls (watch, logs -f): the stub of address(), the leader the last
  // unary call found.
  v1::JobService::StubInterface& stub() { return *stubs_[current_.load()]; }

  absl::StatusOr<v1::SubmitJobResponse> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(int64_t id);
  absl::StatusOr<v1::CancelJobResponse> Cancel(int64_t id);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::UsageResponse> Usage(const v1::UsageRequest& request);
  absl::StatusOr<v1::GetJobLogResponse> GetJobLog(const v1::GetJobLogRequest& request);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();

  // Prints "error: WHAT: ..." for a failed call to stderr, in the words of ReportRpcError
  // (cli.h), and returns the matching exit code.
  int Report(const std::string& what, const absl::Status& status) const;

 private:
  // One unary call with the client's token and deadline, failing over as the class says.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(Call call);

  std::vector<std::shared_ptr<v1::JobService::StubInterface>> stubs_;
  std::vector<std::string> addresses_;
  std::atomic<size_t> current_{0};
};

}  // namespace joule::client

#endif  // JOULE_CLIENT_JOB_CLIENT_H_
