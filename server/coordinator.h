#ifndef JOULE_SERVER_COORDINATOR_H_
#define JOULE_SERVER_COORDINATOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/energy_report.h"
#include "common/job_spec.h"
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "server/carbon_source.h"
#include "server/coordinator_metrics.h"
#include "server/job_store.h"
#include "server/job_writer.h"
#include "server/live_attempt.h"
#include "server/liveness_listener.h"
#include "server/rendezvous_kv.h"
#include "server/session_sink.h"
#include "server/straggler.h"
#include "server/worker_registry.h"

namespace joule::server {

struct CoordinatorOptions {
  // Where jobs are stored (JobStore::Open): a SQLite file, "sqlite:PATH", or a
  // "postgresql://..." URI; ":memory:" for tests that need no durability.
  std::string store = ":memory:";
  // A coordinator that starts with attempts RUNNING in its store (it took over from a
  // leader, or restarted) waits this long for their ranks to come back and resume, and
  // adopts each attempt all of whose ranks did (same attempt, no step redone); the others
  // are re-queued. 0: re-queued at once.
  std::chrono::milliseconds reattach_window{0};
  // The leadership epoch this coordinator serves in (HaCoordinatorServer): its store's
  // writes are fenced at it, its rendezvous scopes and worker messages stamped with it
  // (v1::RegisterWorkerResponse.leader_epoch). 0: one coordinator, no lease.
  int64_t lease_epoch = 0;
  // Called (on a gRPC thread, without the coordinator's lock) when a worker says it has
  // been given a newer epoch than lease_epoch: this leadership may have been superseded
  // unknown to it. A claim, not proof (the store is): true when the store has renewed this
  // lease since the claim was first heard (the worker's epoch is not in this store: it was
  // restored, or is another one), and the worker is then accepted with epoch_reset; false
  // refuses it (UNAVAILABLE) while the lease is checked (HaCoordinatorServer renews within
  // a tenth of the lease). Unset: every such claim is refused.
  std::function<bool(int64_t seen_epoch)> newer_epoch_claimed;
  // Serve the web UI (server/web_ui.h) on the metrics HTTP port.
  bool web_ui = false;
  // How long a store call waits for another connection's lock (SQLite) or the server's
  // answer (PostgreSQL) before it fails (a write is retried later by the coordinator's
  // writer).
  int store_busy_timeout_ms = 5000;
  // How long CancelJob waits for its state change to be stored before it fails
  // UNAVAILABLE, or RESOURCE_EXHAUSTED on a full disk (the change stays in memory and is
  // retried); below the CLI's 10 s RPC deadline, so that the answer arrives.
  std::chrono::milliseconds store_wait{4000};
  // Durations (wall time, device-hours, heartbeats) and timestamps; not owned, outlives
  // the coordinator.
  const Clock* clock = Clock::Real();
  // Job series of the coordinator's /metrics (energy, info) are kept for the jobs
  // pending or running and for this many of the jobs that ended last.
  int metrics_finished_jobs = 100;
  SpecLimits limits;
  // Workers send a heartbeat this often at least; one silent for `heartbeat_timeout` is lost.
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{10000};
  // The liveness load the coordinator aims at: with more workers registered than this, their
  // heartbeat interval grows (workers / rate seconds, told with each heartbeat's ack), up to a
  // quarter of the heartbeat timeout. A heartbeat and its ack cost the coordinator 70-180 us
  // of CPU (the less often they come, the more each wakeup costs; bench/README "Liveness of
  // many workers"): 500/s was 9% of one core. 0: always `heartbeat_interval`.
  int max_heartbeats_per_second = 500;
  // How long a worker told to stop an attempt may take to report before it is declared
  // lost (longer than the workers' collective timeout, default 60 s).
  std::chrono::milliseconds stop_timeout{90000};
  // Grid carbon intensity for the CO2 figure of energy reports, gCO2/kWh.
  double grid_gco2_per_kwh = kDefaultGridGco2PerKwh;
  // The coordinator's grid region (--region): a worker that names none is in it.
  std::string region = "default";
  // The grid's intensity over time by region (--carbon-intensity [REGION=]SOURCE; a source
  // named without a region is `region`'s): carbon-aware jobs wait for the greenest start
  // (and region, RegionalForecast) before their deadline, and ended jobs get their CO2
  // over their run at their workers' regions' intensity (Job.carbon). Empty: none
  // (carbon-aware jobs start as others do).
  std::map<std::string, std::shared_ptr<CarbonIntensitySource>> carbon;
  // Bearer tokens: clients' (token -> client name) for JobService, and the workers' join
  // token for WorkerService. Empty: that service asks for none.
  std::map<std::string, std::string> client_tokens;
  std::string join_token;
  // Jobs one client may have pending or running at once.
  int max_active_jobs_per_client = 1000;
  // `idx:DIR` datasets must resolve (after symlinks and "..") under one of these.
  std::vector<std::string> data_roots = {"/usr/share/datasets"};

  // INVALID_ARGUMENT when the timeout is not longer than two intervals or a value is <= 0.
  absl::Status Validate() const;
};

// The control plane: the job table, the workers, gang scheduling, the rendezvous KV.
// Knows no gRPC; the services in grpc_services.h translate to and from it.
//
// Job lifecycle: Submit stores PENDING (durable before it returns); the scheduler places
// a gang and the job is RUNNING with attempt k; each rank reports a result; the job is
// SUCCEEDED when all ranks succeed. When a rank fails or a worker of the gang is lost, the
// attempt ends: a failure another attempt could get past (a lost worker, a dead peer) puts
// the job back in the queue, up to spec.max_restarts times, to resume from its newest
// checkpoint; otherwise (bad data, ranks that disagree) or after the last restart the job
// is FAILED. CANCELLED on request. Workers of an ended attempt are told to stop and become
// idle when they report.
//
// Durability: Submit returns once the job is stored. Every later state change is made in
// memory first, then written by the coordinator's writer thread (never under the state
// mutex); a job stays in memory, and is served from there, until its newest state is
// stored, and a write that fails (the file locked past its busy timeout, a full disk) is
// retried with backoff. CancelJob waits for its change to be stored and fails
// UNAVAILABLE when it cannot be.
//
// Thread-safe: one mutex guards all state; nothing blocks or does I/O while holding it
// (sinks queue, the store is used outside it).
class Coordinator {
 public:
  // Opens the job store and re-queues the attempts a previous run left RUNNING.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options);
  ~Coordinator();

  // --- JobService ---
  // Validates, normalises and stores `spec`. Returns the job id; `*existing` is set when
  // `request_id` names a job submitted before (that job's id is returned).
  // Errors: INVALID_ARGUMENT (see NormalizeAndValidateSpec), UNAVAILABLE (store).
  // `client` names the submitter (for per-client limits). Errors also: INVALID_ARGUMENT
  // for a dataset outside the data roots or a job no machine can hold
  // (kMaxJobBytesPerWorker), RESOURCE_EXHAUSTED past the client's limit or when the job's
  // estimated memory (EstimateResources) exceeds what the largest worker of its kind
  // reported.
  // Why a job of `spec` cannot start with the workers registered now (fewer of its device
  // kind than it needs), or "" when it can. Advisory: the job waits for them.
  std::string CapacityWarning(const v1::JobSpec& spec);
  absl::StatusOr<int64_t> Submit(v1::JobSpec spec, const std::string& request_id,
                                 bool* existing, const std::string& client = "anonymous");
  absl::StatusOr<v1::Job> GetJob(int64_t id);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  // `joule usage`: reads the jobs newest first in pages (ListJobs: the store's index on
  // state and id, the newest states from memory), stops at the first older than `since`
  // (ids grow with creation time), and tallies them (server/usage.h). Errors:
  // UsageTally::Validate's, and the store's.
  absl::StatusOr<v1::UsageResponse> Usage(const v1::UsageRequest& request);
  // Errors: NOT_FOUND, FAILED_PRECONDITION for a job already finished.
  // Only the submitting client may cancel (any, when authentication is off: "anonymous").
  // Errors also: PERMISSION_DENIED naming the owner.
  absl::StatusOr<v1::Job> CancelJob(int64_t id, const std::string& client = "anonymous");
  // Waits until job `id` differs from `*last` (or `last` is empty), its end is stored,
  // or `deadline` passes; returns the current job and stores it in `*last`. `*final`
  // (when given) tells whether the job has ended and that end is stored: nothing about it
  // changes any more, and no crash can undo it.
  absl::StatusOr<v1::Job> WaitForJobChange(int64_t id, v1::Job* last,
                                           std::chrono::steady_clock::time_point deadline,
                                           bool* final = nullptr);
  std::vector<v1::WorkerInfo> ListWorkers();
  // A job's log (GetJobLog): lines after `after_seq` of `rank` (-1: all), from the store.
  // NOT_FOUND for an unknown job; INVALID_ARGUMENT for limit outside [0, 10000].
  absl::StatusOr<v1::GetJobLogResponse> GetJobLog(const v1::GetJobLogRequest& request);
  // A job's power by rank: while an attempt runs, from its ranks' progress reports (live,
  // the newest kMaxLivePowerPoints a rank); once it ended, the last attempt's RankPower of
  // its report. NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<v1::RankPower>> JobPower(int64_t id);
  static constexpr size_t kMaxLivePowerPoints = LiveAttempt::kMaxPowerPoints;

  // --- WorkerService ---
  // A request to resume (resume_worker_id) is granted, keeping the worker's id and
  // attempt, when that worker (same host and pid) still runs that attempt of a running job;
  // otherwise what the same process held ends and it registers anew (resumed = false).
  // Errors: INVALID_ARGUMENT for a host, metrics address or energy source name that is
  // not valid UTF-8, holds control characters or is too long (host 253 bytes, address
  // 261, source 32, at most 8 sources).
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  // Errors: NOT_FOUND for an unknown worker id (it should register again),
  // ALREADY_EXISTS when the worker already has a session.
  absl::Status OpenSession(const std::string& worker_id, std::shared_ptr<SessionSink> sink);
  // Handles heartbeats, progress and results from a worker's session.
  void OnWorkerMessage(const std::string& worker_id, const v1::WorkerMessage& message);
  // The session ended. A worker busy with a running attempt keeps it, without a session,
  // until it registers again asking to resume (RegisterWorkerRequest.resume_worker_id) or
  // its heartbeat timeout passes (then it is lost and the attempt fails); any other worker
  // is gone at once.
  void CloseSession(const std::string& worker_id, const SessionSink* sink,
                    const std::string& reason);
  // Heartbeats over UDP (LivenessListener's handler): each datagram a LivenessBeat sealed
  // with its worker's registration key, from a worker whose session is open, with a seq
  // above the last one taken; such a beat counts as that worker's heartbeat on its stream
  // would, and its reply is the LivenessAck. Anything else is counted as refused and
  // answered with nothing. Safe to call from any thread.
  void OnLivenessDatagrams(const std::vector<LivenessListener::Datagram>& in,
                           std::vector<std::string>* replies);
  // The UDP port registrations offer for heartbeats (0: none; the default). Set once the
  // listener is bound: before the gRPC port opens when its number is known, else just
  // after (a worker registering in between heartbeats on its stream).
  void SetLivenessPort(int port) { liveness_port_ = port; }
  RendezvousKv& kv() { return kv_; }

  // --- Observability ---
  // The coordinator's metrics (jobs by state, workers by state and device kind, queue
  // wait, per-job energy); gauges are refreshed by RefreshMetrics().
  std::shared_ptr<prometheus::Registry> registry() { return metrics_.registry(); }
  void RefreshMetrics();
  // Prometheus HTTP service discovery (https://prometheus.io/docs/prometheus/latest/
  // http_sd/): one target group per worker serving /metrics, labelled joule_worker and
  // joule_host, with the job and rank it runs now (empty when idle) as __meta_joule_job
  // and __meta_joule_rank. The series themselves carry joule_job and joule_rank.
  std::string HttpSdJson();

  // Declares lost every worker silent for longer than the heartbeat timeout at `now`, and
  // every worker still busy with an attempt it was told to stop stop_timeout ago, and
  // re-queues the attempts found at start whose ranks did not come back in time.
  // Called every 500 ms (real time) by the coordinator's own thread, however often jobs
  // change; its cost grows with the workers and the attempts being adopted, not with the
  // queue. Public for tests.
  void CheckHeartbeats(std::chrono::steady_clock::time_point now);
  // How many times the coordinator's thread has run CheckHeartbeats (tests, benches).
  uint64_t liveness_passes() const { return liveness_passes_.load(std::memory_order_relaxed); }
  // The interval workers are told to heartbeat at now (CoordinatorOptions::
  // max_heartbeats_per_second). Caller holds mu_.
  std::chrono::milliseconds HeartbeatIntervalLocked() const;
  // A heartbeat from `w` (on its stream or over UDP): it is alive, and rank 0's phase is
  // its job's. Caller holds mu_.
  void HeartbeatLocked(WorkerRegistry::Worker& w, const v1::Heartbeat& h);
  // Gives `w` a new key for heartbeats over UDP and puts it, with the port, in `response`
  // (nothing when no port is set). Caller holds mu_.
  void GrantLivenessLocked(WorkerRegistry::Worker& w, v1::RegisterWorkerResponse* response);

  // The coordinator is stopping (SIGTERM): from now on, sessions that end are the
  // shutdown, not lost workers, so running attempts are left RUNNING in the store, to be
  // re-queued at the next start as after a crash. Nothing is scheduled any more. Every
  // worker's session and every WaitForJobChange ends at once, UNAVAILABLE with
  // kShuttingDown, and so do submits from here on.
  void BeginShutdown();
  static constexpr char kShuttingDown[] = "the coordinator is shutting down";

  // Blocks until every state change made so far is stored or `deadline` passes; false
  // on timeout. For tests and the shutdown path.
  bool WaitStored(std::chrono::steady_clock::time_point deadline);

 private:
  using Worker = WorkerRegistry::Worker;
  struct ActiveJob {
    v1::Job job;
    uint64_t version = 0;         // bumped by every change
    uint64_t stored_version = 0;  // the newest version the store holds
    std::string store_error;      // why the last write failed; empty after a success
    // Steady-clock times: when the job last entered the queue, when its attempt started
    // (unset after a coordinator restart).
    std::chrono::steady_clock::time_point queued_at;
    std::optional<std::chrono::steady_clock::time_point> attempt_started;
    bool budget_warned = false;  // 90% of the energy budget was reached (kept across reports)
    // A rank reported a training step of the running attempt (an adopted one: its stored
    // progress had steps). A graceful stop before then stops at once: there is nothing new
    // to checkpoint, and every rank gets the same word (a rank's own view could differ).
    bool stepped = false;
    // A held carbon-aware job: since when (Unix ms, this coordinator's) its plan's region
    // has lacked the registered workers for its gang; 0 while it has them.
    int64_t region_short_since_ms = 0;
    // What the running attempt's ranks reported: energy, power, timing.
    LiveAttempt live;
    // A running attempt found in the store at start (CoordinatorOptions::reattach_window):
    // until when its ranks may come back, and which did.
    std::optional<std::chrono::steady_clock::time_point> adopt_until;
    std::set<int32_t> reattached;
  };
  explicit Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store);
  // The host of the worker that runs `rank` of the job's gang ("" when unknown).
  std::string HostOfRankLocked(const v1::Job& job, int32_t rank);
  void ScheduleLocked();
  // Carbon-aware jobs (issue 31): re-reads the intensity source (outside the lock) and
  // re-plans the pending jobs whose plan rests on another forecast; schedules when a
  // held job's planned start has come. The heartbeat thread's, every pass.
  void CheckCarbonPlans();
  // The held jobs to plan again, by id: planned on another forecast than `forecast`, or in
  // a region that has lacked their gang's workers for the heartbeat timeout while another
  // region has them.
  struct StaleCarbonPlan {
    int64_t id = 0;
    v1::JobSpec spec;
    // Its region, short of its gang's workers for less than the heartbeat timeout: planned
    // again there only. Empty: in every region.
    std::string keep_region;
  };
  std::vector<StaleCarbonPlan> StaleCarbonPlansLocked(const RegionalForecast& forecast,
                                                      int64_t now_ms);
  // Submit's parts: the job `spec` resumes from (ended, its checkpoint fitting: sets
  // job->resume_from_job_uid); a carbon-aware job's plan (its provisional reservation's
  // id, 0 if none); the stored job taken into active_ (and scheduled).
  absl::Status CheckResumeFrom(const v1::JobSpec& spec, v1::Job* job);
  uint64_t PlanCarbonLocked(v1::Job& job, const std::string& client);
  int64_t AdmitLocked(v1::Job job);
  // The workers of `kind` in `region` (empty: every region) and what the active jobs but
  // `skip` and the submits being planned hold of them (ReservationOf), for a carbon-aware
  // plan.
  GangCapacity GangCapacityLocked(v1::DeviceKind kind, const std::string& region, int64_t now_ms,
                                  const std::set<int64_t>& skip);
  // The same for each region `forecast` plans in (one, "", where it has a single region).
  std::map<std::string, GangCapacity> GangsLocked(v1::DeviceKind kind,
                                                  const RegionalForecast& forecast, int64_t now_ms,
                                                  const std::set<int64_t>& skip);
  // Every region's forecast now (options_.carbon), and whether the cluster spans several
  // regions (its registered workers' and its sources' together).
  RegionalForecast ForecastLocked() const;
  // The region a pending carbon-aware job must run in at `now_ms` (its plan's, while that
  // region has registered workers of its kind for its gang and its latest start has not
  // come: then the deadline comes first), else empty: any.
  std::string PinnedRegionLocked(
      const v1::Job& job, int64_t now_ms,
      const std::map<std::pair<v1::DeviceKind, std::string>, int>& registered) const;
  // The workers with a session by device kind and region.
  std::map<std::pair<v1::DeviceKind, std::string>, int> RegisteredByRegionLocked() const;
  // mu_: carbon-aware jobs held by their plan at the last ScheduleLocked (0: the heartbeat
  // thread's pass has nothing to check; -1: not counted yet).
  int carbon_held_ = -1;
  // mu_: the next time a carbon-aware job's plan changes its place (a held job's planned
  // start, a job that waited reaching its latest start: it goes ahead), Unix ms; the
  // heartbeat thread's pass schedules then. 0: not computed yet.
  int64_t next_carbon_event_ms_ = 0;
  // mu_: the reservations of carbon-aware jobs planned but not yet in active_ (between a
  // submit's plan and its insert), so that concurrent submits plan beside each other.
  struct ProvisionalReservation {
    v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
    std::string region;  // the plan's (CarbonPlan.region)
    WorkerReservation reservation;
  };
  std::map<uint64_t, ProvisionalReservation> carbon_provisional_;
  uint64_t next_provisional_ = 0;
  // Records a change of `active` a user can see: bumps its version, wakes watchers, and
  // marks it for the writer.
  void ChangedLocked(ActiveJob& active);
  // The writer's hooks (JobWriter::Hooks): the dirty jobs' newest state, and a write's
  // outcome (an ended job leaves memory once its newest version is stored).
  std::vector<std::pair<v1::Job, uint64_t>> SnapshotForWriter(const std::vector<int64_t>& ids);
  void OnStored(int64_t id, uint64_t version, const absl::Status& status);
  // Closes the running attempt INTERRUPTED (no restart spent) with `closed` as its reason,
  // and queues the job again with `queued` as the job's.
  void RequeueInterruptedLocked(ActiveJob& active, const std::string& closed,
                                const std::string& queued);
  // RegisterWorker of a worker an earlier coordinator registered, resuming a rank of an
  // attempt this one adopts: its response, or nullopt when the request is not that.
  std::optional<v1::RegisterWorkerResponse> AdoptLocked(const v1::RegisterWorkerRequest& request,
                                                        v1::RegisterWorkerResponse response);
  // CloseAttempt (attempt.h) of the running attempt, timed by the steady clock.
  void CloseAttemptLocked(ActiveJob& active, v1::AttemptOutcome outcome, const std::string& reason,
                          absl::StatusCode reason_code);
  // Ends the running attempt of `active` in `state`, telling the ranks still busy to stop.
  // A failed attempt: re-queued (PENDING, resumes from its newest checkpoint) while the
  // failure (of `code`, the failing rank's) is retryable and restarts remain; else the job
  // ends FAILED.
  void FailAttemptLocked(ActiveJob& active, const std::string& reason, absl::StatusCode code);
  // Tells the ranks still busy with the job's current attempt to stop, and closes the
  // attempt's rendezvous scope.
  // `checkpoint`: a graceful stop (CancelAttempt.checkpoint), for a spent energy budget.
  void StopRanksLocked(const v1::Job& job, const std::string& reason, bool checkpoint = false);
  // A progress report of `rank` of the running attempt: its energy joins the job's
  // (JobProgress.job_energy_joules), whose budget is checked (EnforceBudgetLocked).
  // `energy_only` (ProgressReport.energy_only): only its energy counts.
  void OnProgressLocked(ActiveJob& active, int32_t rank, const v1::RankProgress& progress,
                        bool energy_only = false);
  // At 90% of spec.energy_budget_joules: flagged (progress.budget_warning, metrics, a log
  // line); at 100%: the attempt ends BUDGET_EXCEEDED and its ranks stop after a
  // checkpoint. True when it ended the job.
  bool EnforceBudgetLocked(ActiveJob& active, double job_joules);
  // Ends the job in `state` (its running attempt too, if any); returns it. It stays in
  // active_ until the writer has stored it. `graceful`: the ranks stop after a checkpoint
  // (a spent budget); otherwise at once.
  v1::Job EndAttemptLocked(ActiveJob& active, v1::JobState state, const std::string& reason,
                           absl::StatusCode code = absl::StatusCode::kOk,
                           bool graceful = false);
  // The job ends without a running attempt (cancelled while pending, failed after its
  // attempt was re-queued).
  void EndJobLocked(ActiveJob& active, v1::JobState state, const std::string& reason);
  void LoseWorkerLocked(const std::string& worker_id, const std::string& reason);
  void HandleResultLocked(Worker& worker, const v1::ResultReport& report);
  // A result of an attempt that has ended (in memory): merged, and a rank's own error
  // no retry gets past ends a re-queued job FAILED.
  void HandleLateResultLocked(ActiveJob& active, int32_t rank, const std::string& worker_id,
                              const v1::ResultReport& report);
  std::string Scope(int64_t job_id, int32_t attempt) const;
  // An empty message to a worker, stamped with this leadership's epoch.
  v1::CoordinatorMessage Stamped() const {
    v1::CoordinatorMessage m;
    m.set_leader_epoch(options_.lease_epoch);
    return m;
  }

  const CoordinatorOptions options_;
  const Clock* const clock_;
  std::unique_ptr<JobStore> store_;
  CoordinatorMetrics metrics_;
  RendezvousKv kv_;

  std::mutex mu_;
  std::condition_variable changed_;
  // PENDING and RUNNING jobs, and ended ones until their end is stored.
  std::map<int64_t, ActiveJob> active_;
  // The ids of jobs found running at start whose ranks may still come back (adopt_until
  // set); CheckHeartbeats drops the adopted and ended ones.
  std::set<int64_t> adopting_;
  std::map<std::string, int> active_by_client_;  // PENDING/RUNNING jobs by submitted_by
  WorkerRegistry workers_;
  bool shutting_down_ = false;               // BeginShutdown was called
  bool stopping_ = false;                    // the destructor runs
  std::thread heartbeat_thread_;
  std::atomic<uint64_t> liveness_passes_{0};  // CheckHeartbeats runs by heartbeat_thread_
  std::atomic<int> liveness_port_{0};         // SetLivenessPort
  // Each registered worker's key for heartbeats over UDP (a copy of Worker::liveness_key),
  // under a lock of its own: datagrams from anyone are checked without mu_. Taken after
  // mu_ where both are held, never the other way.
  std::mutex liveness_keys_mu_;
  std::unordered_map<std::string, std::string> liveness_keys_;  // liveness_keys_mu_
  // Last: its hooks use the members above, so it stops (the destructor) before they go.
  std::unique_ptr<JobWriter> writer_;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_COORDINATOR_H_
