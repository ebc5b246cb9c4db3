#ifndef JOULE_WORKER_AGENT_ATTEMPT_CONTROL_H_
#define JOULE_WORKER_AGENT_ATTEMPT_CONTROL_H_
// The seams between the worker's session with the coordinator (session.h) and the attempt
// it runs (attempt_runner.h): what the attempt sends through the session, and what the
// session asks of the attempt. Neither side knows the other's implementation; the session
// knows nothing of training (cmake_layering_test checks it).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "joule/v1/worker.pb.h"

namespace joule::worker {

// Where a running attempt's messages go: the session with the coordinator in the worker
// (CoordinatorSession), a recorder in tests. Called from the attempt's thread.
class AttemptOutbox {
 public:
  virtual ~AttemptOutbox() = default;
  // A progress report: sent if a session is open, dropped otherwise (the next one
  // supersedes it).
  virtual void SendProgress(const v1::WorkerMessage& message) = 0;
  // The attempt's result: kept until a session has taken it, since the coordinator counts
  // each rank once (CoordinatorSession::SendResult).
  virtual void SendResult(v1::WorkerMessage message) = 0;
  // The attempt's log lines still waiting, sent before its result: the coordinator takes
  // lines only from a worker still running the attempt.
  virtual void FlushLog() = 0;
};

// The attempt a session drives: AttemptRunner in the worker, a fake in tests. Thread-safe.
class AttemptControl {
 public:
  virtual ~AttemptControl() = default;
  // Starts an assignment (the session answers FAILED_PRECONDITION with a failed result).
  virtual absl::Status Start(const v1::Assignment& assignment,
                             std::vector<std::string> data_roots) = 0;
  // A CancelAttempt from the coordinator; true when it named the attempt in flight.
  virtual bool Apply(const v1::CancelAttempt& cancel) = 0;
  virtual void Cancel() = 0;
  virtual void Join() = 0;
  virtual bool active() const = 0;
  virtual int64_t job_id() const = 0;
  virtual int32_t attempt() const = 0;
  virtual v1::RankPhase phase() const = 0;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_AGENT_ATTEMPT_CONTROL_H_
