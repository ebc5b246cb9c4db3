#ifndef JOULE_SERVER_WORKER_REGISTRY_H_
#define JOULE_SERVER_WORKER_REGISTRY_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "server/scheduler.h"
#include "server/session_sink.h"

namespace joule::server {

// The workers the coordinator knows: who registered (with names checked), whose session
// is open, who is alive (last heartbeat against a timeout, a stop deadline once told to
// stop), and what each one runs. All times are passed in (steady for liveness, Unix ms
// for what users read), so expiry is tested on made-up times.
//
// Not thread-safe: owned by the Coordinator and used under its mutex.
class WorkerRegistry {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Worker {
    v1::WorkerInfo info;
    std::shared_ptr<SessionSink> sink;  // null until the session opens
    TimePoint last_seen;
    int32_t attempt = 0;  // of info.job_id() when busy
    // Set when the worker is told to stop its attempt: past it, a worker still busy (hung
    // outside any collective) is declared lost so that it cannot hold a gang forever.
    std::optional<TimePoint> stop_deadline;
    // Heartbeats over UDP (common/liveness_datagram.h): this registration's key (empty:
    // none given) and the highest LivenessBeat.seq taken, so a replayed beat is refused.
    std::string liveness_key;
    uint64_t liveness_seq = 0;
  };

  // `boot` tells this coordinator's ids from an earlier run's ("w3.1a2b"); a worker that
  // names no region is in `default_region` (the coordinator's --region).
  explicit WorkerRegistry(std::string boot, std::string default_region = "default")
      : boot_(std::move(boot)), default_region_(std::move(default_region)) {}

  // Adds a worker (REGISTERED, no session yet) and returns its id.
  // Errors: INVALID_ARGUMENT for a host (253 bytes), metrics address (261) or energy
  // source name (32; at most 8) that is not valid UTF-8, holds control characters or is
  // too long: they end up in `joule workers`, logs, /http_sd JSON and metric labels; for
  // a region that is not a region name (CheckRegionName).
  absl::StatusOr<std::string> Register(const v1::RegisterWorkerRequest& request, TimePoint now,
                                       int64_t now_unix_ms);
  // A worker that an earlier leader registered (request.resume_worker_id, kept as its id),
  // asking to resume an attempt this coordinator adopted: registered as Register does
  // (the same checks and errors), REGISTERED and not yet assigned (the caller Assigns and
  // Detaches it, so that OpenSession resumes it busy). ALREADY_EXISTS when the id is taken.
  absl::StatusOr<Worker*> Adopt(const v1::RegisterWorkerRequest& request, TimePoint now,
                                int64_t now_unix_ms);
  // A worker that resumed (busy, detached) stays busy with its attempt; a newly
  // registered one becomes idle.
  // Errors: NOT_FOUND for an unknown id (it should register again), ALREADY_EXISTS when
  // the worker already has a session.
  absl::Status OpenSession(const std::string& id, std::shared_ptr<SessionSink> sink,
                           TimePoint now);
  // The session of `w`, busy with an attempt, ended: the worker keeps its id and attempt
  // without a session (not schedulable) until it resumes (Resumable, OpenSession) or its
  // heartbeat timeout passes (Expired).
  static void Detach(Worker& w, int64_t now_unix_ms);
  // The worker a RegisterWorkerRequest asks to be again (resume_worker_id), when the
  // request comes from the same host and pid and that worker runs exactly the attempt it
  // names; null otherwise. Whether the attempt itself still runs is the caller's to check.
  Worker* Resumable(const v1::RegisterWorkerRequest& request);

  // Null when unknown.
  Worker* Find(const std::string& id);
  // A message arrived from the worker: it is alive.
  static void Touch(Worker& w, TimePoint now, int64_t now_unix_ms);
  // Removes the worker and returns it (nullopt when unknown).
  std::optional<Worker> Remove(const std::string& id);

  // The worker runs `rank` of `attempt` of job `job_id`.
  static void Assign(Worker& w, int64_t job_id, int32_t rank, int32_t attempt);
  // The worker reported: it is idle again.
  static void Release(Worker& w);
  // True when `w` is busy with exactly this job and attempt.
  static bool RunsAttempt(const Worker& w, int64_t job_id, int32_t attempt);

  // Workers to declare lost at `now`, with why: silent for longer than
  // `heartbeat_timeout`, or still busy past the stop deadline.
  std::vector<std::pair<std::string, std::string>> Expired(
      TimePoint now, std::chrono::milliseconds heartbeat_timeout,
      std::chrono::milliseconds stop_timeout) const;

  // Workers with an open session, as the scheduler sees them.
  std::vector<WorkerSlot> Slots() const;
  // Registered and idle workers with a session, of `kind`.
  std::pair<int, int> CountOfKind(v1::DeviceKind kind) const;
  // The largest memory_bytes and device_memory_bytes workers of `kind` reported (0:
  // unknown).
  std::pair<int64_t, int64_t> LargestMemory(v1::DeviceKind kind) const;
  std::vector<v1::WorkerInfo> List() const;
  // Workers with an open session that serve /metrics.
  std::vector<v1::WorkerInfo> ScrapeTargets() const;

  // Every region a worker has registered in since this registry began (workers that left
  // included: a region does not come and go with its workers' sessions).
  const std::set<std::string>& regions_seen() const { return regions_seen_; }

  std::map<std::string, Worker>& all() { return workers_; }
  const std::map<std::string, Worker>& all() const { return workers_; }

 private:
  const std::string boot_;
  const std::string default_region_;
  std::set<std::string> regions_seen_;
  int64_t next_seq_ = 1;
  std::map<std::string, Worker> workers_;  // by id
};

}  // namespace joule::server

#endif  // JOULE_SERVER_WORKER_REGISTRY_H_
