#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/names.h"
#include "common/text.h"
#include "server/admission.h"
#include "server/attempt.h"
#include "server/budget.h"
#include "server/job_progress.h"
#include "server/scheduler.h"

namespace joule::server {
namespace {

// 64 random bits, hex: a job's identity beyond its id, which a new database reuses.
// Thread-safe: each thread has its own engine, seeded from the OS.
std::string NewJobUid() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16));
}

std::string BootToken() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd() & 0xffff, absl::kZeroPad4));
}

// The job's budget share on /metrics: JobProgress's, the one figure (energy_report.h).
void PublishBudgetUse(CoordinatorMetrics& metrics, const v1::Job& job) {
  if (job.spec().energy_budget_joules() <= 0) return;
  metrics.SetBudgetUse(job.id(), job.spec().energy_budget_joules(),
                       job.progress().energy_budget_used());
}

double LastAttemptJoules(const v1::Job& job) {
  double joules = 0;
  const auto& attempts = job.result().attempts();
  if (attempts.empty()) return 0;
  for (const v1::EnergyRecord& e : attempts[attempts.size() - 1].energy()) joules += e.joules();
  return joules;
}

}  // namespace

absl::Status CoordinatorOptions::Validate() const {
  if (store.empty()) return absl::InvalidArgumentError("no job store given");
  if (heartbeat_interval.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat interval ", heartbeat_interval.count(), " ms is not positive"));
  }
  if (reattach_window.count() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reattach window ", reattach_window.count(), " ms is negative"));
  }
  if (max_heartbeats_per_second < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("maximum heartbeats per second ", max_heartbeats_per_second, " is negative"));
  }
  if (heartbeat_timeout < 2 * heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat timeout ", heartbeat_timeout.count(), " ms is shorter than two intervals (",
        2 * heartbeat_interval.count(), " ms)"));
  }
  return absl::OkStatus();
}

// --- Life cycle -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open(options.store, options.store_busy_timeout_ms);
  if (!store.ok()) return store.status();
  if (options.lease_epoch != 0) (*store)->Fence(options.lease_epoch);
  absl::StatusOr<std::vector<v1::Job>> unfinished = (*store)->ListUnfinished();
  if (!unfinished.ok()) return unfinished.status();
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options), *std::move(store)));
  std::lock_guard<std::mutex> lock(c->mu_);
  for (v1::Job& job : *unfinished) {
    ActiveJob& active = c->active_[job.id()];
    active.job = std::move(job);
    active.queued_at = c->clock_->Now();
    ++c->active_by_client_[active.job.submitted_by()];
    c->metrics_.SetJobInfo(active.job);
    if (active.job.state() != v1::JOB_STATE_RUNNING) continue;
    // Only an attempt past its rendezvous (it made a step) is adopted: the rendezvous
    // store was the previous coordinator's memory, so ranks still meeting cannot finish.
    if (c->options_.reattach_window.count() > 0 && active.job.progress().step() > 0) {
      // Its ranks train on (their collectives are peer to peer) and come back to this
      // coordinator asking to resume: adopted if all of them do within the window
      // (RegisterWorker), re-queued otherwise (CheckHeartbeats).
      active.adopt_until = c->clock_->Now() + c->options_.reattach_window;
      active.stepped = true;  // it made a step
      c->adopting_.insert(active.job.id());
      c->metrics_.AttemptAdopted(active.job.id());
      spdlog::info(
          "job {}: attempt {} ran under the previous coordinator; waiting up to {} ms "
          "for its {} ranks to come back",
          active.job.id(), active.job.attempt(), c->options_.reattach_window.count(),
          active.job.worker_ids_size());
      continue;
    }
    c->RequeueInterruptedLocked(
        active, "interrupted by a coordinator restart",
        absl::StrCat("re-queued: the coordinator restarted during attempt ", active.job.attempt()));
  }
  // Why each pending job waits, as of now (no worker has joined yet): a reason set just
  // before a crash may not have been stored.
  c->ScheduleLocked();
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      store_(std::move(store)),
      metrics_(JOULE_VERSION, options_.metrics_finished_jobs, options_.lease_epoch),
      workers_(BootToken(), options_.region) {
  writer_ = std::make_unique<JobWriter>(
      store_.get(), options_.grid_gco2_per_kwh,
      JobWriter::Hooks{
          .snapshot = [this](const std::vector<int64_t>& ids) { return SnapshotForWriter(ids); },
          .on_stored = [this](int64_t id, uint64_t version,
                              const absl::Status& st) { OnStored(id, version, st); },
          .on_late_result_stored =
              [this](const v1::Job& job, double added_joules) {
                metrics_.AddJobEnergy(job, added_joules);
                PublishBudgetUse(metrics_, job);
              }});
  heartbeat_thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      // Every 500 ms, not at every change: changed_ is notified by each submit and report.
      if (changed_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stopping_; })) {
        break;
      }
      lock.unlock();
      liveness_passes_.fetch_add(1, std::memory_order_relaxed);
      CheckHeartbeats(clock_->Now());
      CheckCarbonPlans();
      lock.lock();
    }
  });
}

Coordinator::~Coordinator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, w] : workers_.all()) {
      if (w.sink) w.sink->Close(kShuttingDown);
    }
  }
  changed_.notify_all();
  heartbeat_thread_.join();
  // What is not stored yet gets a last chance (bounded), then the writer stops.
  if (!writer_->Stop(std::chrono::steady_clock::now() + std::chrono::seconds(5))) {
    spdlog::error("stopping with job changes not stored: the store keeps failing");
  }
}

void Coordinator::BeginShutdown() {
  std::vector<std::shared_ptr<SessionSink>> sessions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    int running = 0;
    for (const auto& [id, a] : active_) running += a.job.state() == v1::JOB_STATE_RUNNING;
    spdlog::info(
        "shutting down: {} running attempt(s) left as they are, to be re-queued at "
        "the next start",
        running);
    for (auto& [id, w] : workers_.all()) {
      if (w.sink) sessions.push_back(w.sink);
    }
  }
  // Watches end now, and every worker's session: the server's shutdown waits for its
  // streams, which would otherwise end only at its deadline (a SIGTERM answered in
  // seconds, not milliseconds). The workers keep training and connect again.
  changed_.notify_all();
  for (const auto& sink : sessions) sink->Close(kShuttingDown);
}

// --- Durability ---------------------------------------------------------------------

bool Coordinator::WaitStored(std::chrono::steady_clock::time_point deadline) {
  return writer_->WaitStored(deadline);
}

void Coordinator::ChangedLocked(ActiveJob& active) {
  ++active.version;
  writer_->MarkDirty(active.job.id());
  changed_.notify_all();
}

std::vector<std::pair<v1::Job, uint64_t>> Coordinator::SnapshotForWriter(
    const std::vector<int64_t>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<v1::Job, uint64_t>> jobs;
  for (int64_t id : ids) {
    auto it = active_.find(id);
    if (it != active_.end()) jobs.emplace_back(it->second.job, it->second.version);
  }
  return jobs;
}

void Coordinator::OnStored(int64_t id, uint64_t version, const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_.find(id);
  if (it == active_.end()) return;
  ActiveJob& a = it->second;
  if (!status.ok()) {
    if (a.store_error.empty()) {
      spdlog::error("job {}: could not store state {} (kept in memory, retrying): {}", id,
                    JobStateName(a.job.state()), status.ToString());
    }
    a.store_error = std::string(status.message());
  } else {
    if (!a.store_error.empty()) spdlog::info("job {}: stored after retrying", id);
    a.store_error.clear();
    a.stored_version = std::max(a.stored_version, version);
    if (IsTerminal(a.job.state()) && a.stored_version == a.version) active_.erase(it);
  }
  changed_.notify_all();
}

// --- JobService ---------------------------------------------------------------------

namespace {

// A carbon-aware job's deadline must lie ahead of its submit.
absl::Status CheckCarbonDeadline(const v1::Job& job) {
  if (!job.spec().carbon_aware()) return absl::OkStatus();
  const int64_t deadline = job.spec().start_before_unix_ms() > 0 ? job.spec().start_before_unix_ms()
                                                                 : job.spec().finish_by_unix_ms();
  if (deadline > job.created_unix_ms()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      job.spec().start_before_unix_ms() > 0 ? "start_before" : "finish_by", " (",
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(deadline), absl::UTCTimeZone()),
      ") has passed: a carbon-aware job's deadline must lie ahead"));
}

}  // namespace

absl::StatusOr<int64_t> Coordinator::Submit(v1::JobSpec spec, const std::string& request_id,
                                            bool* existing, const std::string& client) {
  absl::StatusOr<ResourceEstimate> need =
      AdmitSpec(spec, options_.limits, options_.data_roots, request_id);
  if (!need.ok()) return need.status();
  v1::Job job;
  if (absl::Status s = CheckResumeFrom(spec, &job); !s.ok()) return s;
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_created_unix_ms(clock_->UnixMs());
  // Request ids are the client's own: the same id from another client is another job.
  const std::string scoped_request_id =
      request_id.empty() ? "" : absl::StrCat(client, "/", request_id);
  job.set_request_id(scoped_request_id);
  job.mutable_progress()->set_test_accuracy(-1);
  job.set_submitted_by(client);
  job.set_uid(NewJobUid());
  if (!request_id.empty()) {
    // A retried submit returns the job it made, whatever the limits say now.
    absl::StatusOr<v1::Job> stored = store_->GetByRequestId(scoped_request_id);
    if (stored.ok()) {
      *existing = true;
      return stored->id();
    }
    if (stored.status().code() != absl::StatusCode::kNotFound) return stored.status();
  }
  if (absl::Status s = CheckCarbonDeadline(job); !s.ok()) return s;
  job.set_queued_unix_ms(job.created_unix_ms());
  uint64_t provisional = 0;  // its entry in carbon_provisional_, if any
  {
    // Reserve the client's slot before the (slow) insert, so concurrent submits cannot
    // pass the limit together.
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError(kShuttingDown);
    const int active_for_client = active_by_client_[client];
    if (active_for_client >= options_.max_active_jobs_per_client) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "client ", client, " already has ", active_for_client,
          " jobs pending or running (limit ", options_.max_active_jobs_per_client, ")"));
    }
    const auto [host, device] = workers_.LargestMemory(job.spec().device_kind());
    if (absl::Status s = CheckFits(job.spec(), *need, host, device); !s.ok()) return s;
    if (job.spec().carbon_aware()) provisional = PlanCarbonLocked(job, client);
    ++active_by_client_[client];
  }
  // The row as inserted says something: a list that reads it before this submit reaches
  // active_ shows no bare PENDING (a carbon-aware job's plan is its reason already).
  if (job.reason().empty()) job.set_reason("queued: submitted, not scheduled yet");
  absl::Status inserted = store_->Insert(&job, existing);
  std::lock_guard<std::mutex> lock(mu_);
  if (provisional != 0) carbon_provisional_.erase(provisional);
  if (!inserted.ok() || *existing) {
    --active_by_client_[client];
    if (!inserted.ok()) {
      spdlog::error("submit from client {} refused: the job could not be stored: {}", client,
                    inserted.ToString());
      if (absl::IsFailedPrecondition(inserted)) {
        // Fenced: another coordinator leads now. The client retries there.
        return absl::UnavailableError(absl::StrCat(
            "this coordinator no longer leads; submit again (", inserted.message(), ")"));
      }
      return inserted;
    }
    return job.id();
  }
  return AdmitLocked(std::move(job));
}

absl::Status Coordinator::CheckResumeFrom(const v1::JobSpec& spec, v1::Job* job) {
  if (spec.resume_from_job() <= 0) return absl::OkStatus();
  // The job it starts from: ended, and its checkpoint fits this one.
  absl::StatusOr<v1::Job> from = GetJob(spec.resume_from_job());
  if (!from.ok()) {
    return absl::Status(
        absl::IsNotFound(from.status()) ? absl::StatusCode::kInvalidArgument : from.status().code(),
        absl::StrCat("resume_from_job ", spec.resume_from_job(), ": ", from.status().message()));
  }
  if (!IsTerminal(from->state())) {
    return absl::InvalidArgumentError(absl::StrCat("resume_from_job ", spec.resume_from_job(),
                                                   " is ", JobStateName(from->state()),
                                                   ": a job starts from one that has ended"));
  }
  if (const std::string why = CheckpointMismatch(from->spec(), spec); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("resume_from_job ", spec.resume_from_job(),
                                                   ": its checkpoint does not fit this job (", why,
                                                   ")"));
  }
  job->set_resume_from_job_uid(from->uid());
  return absl::OkStatus();
}

uint64_t Coordinator::PlanCarbonLocked(v1::Job& job, const std::string& client) {
  // Planned before it is stored (a restart right after keeps the plan), beside what the
  // other jobs hold of its kind's workers.
  const RegionalForecast forecast = ForecastLocked();
  bool crowded = false;
  *job.mutable_carbon_plan() = PlanCarbonAwareStartInRegions(
      job.spec(), job.created_unix_ms(), forecast,
      GangsLocked(job.spec().device_kind(), forecast, job.created_unix_ms(), {}), &crowded);
  if (crowded) {
    spdlog::info(
        "a carbon-aware job from client {}: no start before its deadline leaves room for "
        "its {} workers beside the others' plans; planned where the fewest are overbooked",
        client, job.spec().workers());
  }
  // The row as inserted says why it waits: a list or a standby that reads the store
  // before this submit reaches active_ shows the plan, not a bare PENDING.
  if (HeldByCarbonPlan(job, job.created_unix_ms())) {
    job.set_reason(CarbonWaitingReason(job.carbon_plan()));
  }
  // Other submits plan beside it until it is in active_.
  std::optional<WorkerReservation> r = ReservationOf(job, job.created_unix_ms());
  if (!r) return 0;
  const uint64_t provisional = ++next_provisional_;
  carbon_provisional_[provisional] = {job.spec().device_kind(), job.carbon_plan().region(), *r};
  return provisional;
}

int64_t Coordinator::AdmitLocked(v1::Job job) {
  spdlog::info("job {}: submitted ({} on {}, {} {} workers, global batch {})", job.id(),
               job.spec().model(), job.spec().dataset(), job.spec().workers(),
               DeviceKindName(job.spec().device_kind()), job.spec().global_batch_size());
  ActiveJob& active = active_[job.id()];
  active.job = std::move(job);
  active.queued_at = clock_->Now();
  const int64_t id = active.job.id();
  metrics_.SetJobInfo(active.job);
  // With no idle worker of its kind the new job cannot start, and no other job's place
  // changes: say why it waits without a pass over the whole queue (which would make a
  // burst of submissions quadratic in the queue's length).
  const auto [registered, idle] = workers_.CountOfKind(active.job.spec().device_kind());
  if (!active.job.carbon_plan().note().empty()) {
    spdlog::warn("job {}: carbon-aware, but starts without waiting: {}", id,
                 active.job.carbon_plan().note());
  }
  if (!active.job.carbon_plan().region().empty()) {
    next_carbon_event_ms_ =
        std::min(next_carbon_event_ms_, active.job.carbon_plan().latest_start_unix_ms());
  }
  if (HeldByCarbonPlan(active.job, active.job.created_unix_ms())) {
    // Its reason, the plan, was set before the insert (PlanCarbonLocked).
    carbon_held_ = std::max(carbon_held_, 0) + 1;  // the heartbeat thread's pass watches it
    next_carbon_event_ms_ =
        std::min(next_carbon_event_ms_, active.job.carbon_plan().planned_start_unix_ms());
  } else if (idle == 0) {
    active.job.set_reason(absl::StrCat("waiting for ", active.job.spec().workers(), " idle ",
                                       DeviceKindName(active.job.spec().device_kind()),
                                       " workers: ", registered, " registered, 0 idle"));
  }
  // The row as inserted is stored; the reason set above is a change to store.
  active.stored_version = active.version;
  ChangedLocked(active);
  if (idle > 0) ScheduleLocked();
  return id;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(int64_t id, const std::string& client) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = active_.find(id);
  if (it == active_.end() || IsTerminal(it->second.job.state())) {
    v1::JobState state;
    if (it != active_.end()) {
      state = it->second.job.state();
    } else {
      lock.unlock();
      absl::StatusOr<v1::Job> job = store_->Get(id);
      if (!job.ok()) return job.status();
      state = job->state();
      if (!IsTerminal(state)) {
        // Stored by a Submit that has not returned yet (or by another coordinator).
        return absl::UnavailableError(
            absl::StrCat("job ", id, " is being submitted; try again"));
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is already ", JobStateName(state)));
  }
  if (client != "anonymous" && it->second.job.submitted_by() != client) {
    return absl::PermissionDeniedError(absl::StrCat("job ", id, " belongs to client ",
                                                    it->second.job.submitted_by(), ", not ",
                                                    client));
  }
  v1::Job result;
  if (it->second.job.state() == v1::JOB_STATE_PENDING) {
    EndJobLocked(it->second, v1::JOB_STATE_CANCELLED, "cancelled by user while pending");
    result = it->second.job;
  } else {
    result = EndAttemptLocked(it->second, v1::JOB_STATE_CANCELLED, "cancelled by user");
  }
  spdlog::info("job {}: cancelled", id);
  ScheduleLocked();
  // The user is told it is cancelled only once that is stored.
  const uint64_t version = active_.at(id).version;
  const auto stored = [&] {
    auto a = active_.find(id);
    return a == active_.end() || a->second.stored_version >= version;
  };
  if (!changed_.wait_for(lock, options_.store_wait, stored)) {
    std::string why = active_.at(id).store_error;
    if (absl::StartsWith(why, "job store: ")) why = why.substr(11);
    const absl::StatusCode code = absl::StrContains(why, "disk is full")
                                      ? absl::StatusCode::kResourceExhausted
                                      : absl::StatusCode::kUnavailable;
    return absl::Status(
        code, absl::StrCat("job store: the cancel of job ", id, " is not stored yet",
                           why.empty() ? "" : ": ", why,
                           " (the job is stopped and shown cancelled, not yet stored; the "
                           "coordinator keeps retrying, and a restart before it succeeds "
                           "brings the job back as it was stored)"));
  }
  return result;
}

// --- What the ranks report ----------------------------------------------------------

void Coordinator::OnProgressLocked(ActiveJob& active, int32_t rank,
                                   const v1::RankProgress& progress, bool energy_only) {
  active.live.Record(rank, HostOfRankLocked(active.job, rank), progress);
  if (!energy_only && progress.step() > 0) active.stepped = true;
  // The attempts that ended (RecomputeTotals at its start) and this one's ranks so far.
  const double job_joules = JobJoulesSoFar(active.job.result().energy()) + active.live.RanksJoules();
  v1::JobProgress* shown = active.job.mutable_progress();
  const v1::Straggler before = shown->straggler();
  // Rank 0's view of the training (an energy-only report has none).
  if (rank == 0 && !energy_only) ApplyRankProgress(progress, shown);
  if (std::optional<v1::Straggler> s = active.live.Straggler()) {
    if (before.cause().empty() || before.rank() != s->rank() || before.cause() != s->cause()) {
      spdlog::info("job {} attempt {}: straggler {}", active.job.id(), active.job.attempt(),
                   s->text());
    }
    *shown->mutable_straggler() = *std::move(s);
  } else {
    shown->clear_straggler();
  }
  shown->set_job_energy_joules(job_joules);
  shown->set_job_power_watts(active.live.Watts());
  const std::vector<double> rank_watts = active.live.RankWatts();
  shown->mutable_rank_power_watts()->Assign(rank_watts.begin(), rank_watts.end());
  if (EnforceBudgetLocked(active, job_joules)) return;
  // Other ranks' reports only refresh the energy: not worth a store write each.
  if (rank == 0) ChangedLocked(active);
}

bool Coordinator::EnforceBudgetLocked(ActiveJob& active, double job_joules) {
  v1::Job& job = active.job;
  if (job.spec().energy_budget_joules() <= 0) return false;
  BudgetInput in;
  in.budget_joules = job.spec().energy_budget_joules();
  in.joules_so_far = job_joules;
  in.warned = active.budget_warned;
  in.watts = active.live.Watts();
  in.samples_per_second = job.progress().samples_per_second();
  in.global_batch = job.spec().global_batch_size();
  in.world_size = job.worker_ids_size();
  in.ranks_heard = static_cast<int32_t>(active.live.rank_joules().size());
  in.ranks_heard_joules = active.live.RanksJoules();
  const BudgetDecision d = DecideBudget(in);
  v1::JobProgress* progress = job.mutable_progress();
  progress->set_energy_budget_used(d.used);
  progress->set_budget_warning(d.warning);
  metrics_.SetBudgetUse(job.id(), in.budget_joules, d.used);
  if (d.warn_now) {
    active.budget_warned = true;
    spdlog::warn("job {}: {:.0f}% of its energy budget ({:.0f} J) is spent", job.id(),
                 100 * d.used, in.budget_joules);
    ChangedLocked(active);
  }
  if (!d.stop) return false;
  EndAttemptLocked(active, v1::JOB_STATE_BUDGET_EXCEEDED, d.reason,
                   absl::StatusCode::kResourceExhausted, /*graceful=*/active.stepped);
  ScheduleLocked();
  return true;
}

void Coordinator::HandleResultLocked(Worker& worker, const v1::ResultReport& reported) {
  const std::string worker_id = worker.info.worker_id();
  // The rank's BLAS is the one its worker registered (checked there), not the report's.
  v1::ResultReport report = reported;
  *report.mutable_result()->mutable_blas() = worker.info.blas();
  auto it = active_.find(report.job_id());
  if (it != active_.end() && !report.job_uid().empty() &&
      report.job_uid() != it->second.job.uid()) {
    // A result kept across sessions for a job of an earlier database that reused the id.
    spdlog::warn("worker {}: ignoring a result for job {} attempt {} of another job (uid {})",
                 worker_id, report.job_id(), report.attempt(), SanitizeUtf8(report.job_uid(), 32));
    return;
  }
  const bool current = WorkerRegistry::RunsAttempt(worker, report.job_id(), report.attempt());
  // The rank: the one this worker runs, or for a result delivered late (after the
  // attempt ended, or by a worker that reconnected) the one the result names.
  const int32_t rank = current ? worker.info.rank() : report.result().rank();
  if (current) WorkerRegistry::Release(worker);
  if (it == active_.end()) {
    // Ended and stored: the writer merges it into the stored job, outside the lock.
    writer_->AddLateResult({rank, worker_id, report});
  } else if (!current || it->second.job.state() != v1::JOB_STATE_RUNNING ||
             it->second.job.attempt() != report.attempt()) {
    HandleLateResultLocked(it->second, rank, worker_id, report);
  } else {
    ActiveJob& active = it->second;
    v1::Job& job = active.job;
    for (const v1::RankResult& counted : job.result().ranks()) {
      if (counted.rank() == rank) {
        // Sent again by a worker that resumed under a new leader after the old one stored
        // it (a worker keeps its result until a session takes it): counted once.
        spdlog::warn("worker {}: rank {} of job {} attempt {} reported again; counted once",
                     worker_id, rank, job.id(), job.attempt());
        return;
      }
    }
    v1::RankResult* r = job.mutable_result()->add_ranks();
    *r = report.result();
    r->set_rank(rank);
    r->set_worker_id(worker_id);
    SanitizeRankResult(*r, job.spec());
    if (!r->ok()) {
      // Copied out first: re-queueing clears the rank results `r` points into.
      const auto code = static_cast<absl::StatusCode>(r->error_code());
      FailAttemptLocked(active,
                        absl::StrCat("rank ", rank, " (worker ", worker_id, "): ", r->error()),
                        code);
    } else if (job.result().ranks_size() == job.spec().workers()) {
      if (std::optional<std::string> diverged = CompleteRanks(job)) {
        EndAttemptLocked(active, v1::JOB_STATE_FAILED, *diverged);
      } else {
        EndAttemptLocked(active, v1::JOB_STATE_SUCCEEDED, "");
      }
    } else {
      ChangedLocked(active);
    }
  }
  ScheduleLocked();
}

void Coordinator::HandleLateResultLocked(ActiveJob& active, int32_t rank,
                                         const std::string& worker_id,
                                         const v1::ResultReport& report) {
  v1::Job& job = active.job;
  const double before = job.result().energy().total_joules();
  if (!MergeLateResult(job, rank, worker_id, report, options_.grid_gco2_per_kwh)) return;
  metrics_.AddJobEnergy(job, job.result().energy().total_joules() - before);
  PublishBudgetUse(metrics_, job);
  const v1::RankResult& rr = report.result();
  // Re-queued on a peer's error, but this rank's own error is one no retry gets past.
  if (job.state() == v1::JOB_STATE_PENDING && job.attempt() == report.attempt() && !rr.ok() &&
      !rr.cancelled() && !IsRetryable(static_cast<absl::StatusCode>(rr.error_code()))) {
    for (v1::AttemptSummary& a : *job.mutable_result()->mutable_attempts()) {
      if (a.attempt() == report.attempt()) a.set_outcome(v1::ATTEMPT_OUTCOME_FAILED);
    }
    EndJobLocked(active, v1::JOB_STATE_FAILED,
                 absl::StrCat("rank ", rank, " (worker ", worker_id, ") in attempt ",
                              report.attempt(), ": ", rr.error()));
    spdlog::info("job {}: ended FAILED: {}", job.id(), job.reason());
    return;
  }
  ChangedLocked(active);
}

// --- Attempts -----------------------------------------------------------------------

void Coordinator::StopRanksLocked(const v1::Job& job, const std::string& reason,
                                  bool checkpoint) {
  v1::CoordinatorMessage cancel = Stamped();
  cancel.mutable_cancel()->set_job_id(job.id());
  cancel.mutable_cancel()->set_attempt(job.attempt());
  cancel.mutable_cancel()->set_reason(reason);
  cancel.mutable_cancel()->set_checkpoint(checkpoint);
  for (const std::string& id : job.worker_ids()) {
    Worker* w = workers_.Find(id);
    if (w != nullptr && w->sink && WorkerRegistry::RunsAttempt(*w, job.id(), job.attempt())) {
      w->sink->Send(cancel);
      // A graceful stop runs up to kStopCheckInterval more steps (or an epoch's
      // evaluation) and writes a checkpoint first.
      w->stop_deadline = clock_->Now() + options_.stop_timeout * (checkpoint ? 3 : 1);
    }
  }
  kv_.CloseScope(Scope(job.id(), job.attempt()));
}

void Coordinator::RequeueInterruptedLocked(ActiveJob& active, const std::string& closed,
                                           const std::string& queued) {
  // The attempt was cut short: what it did and spent so far is kept (the ranks that
  // reported, and those that report when their workers reconnect); its wall time ran from
  // its start to the last sign of it, rank 0's last progress report.
  v1::Job& j = active.job;
  active.adopt_until.reset();
  active.reattached.clear();
  CloseAttemptLocked(active, v1::ATTEMPT_OUTCOME_INTERRUPTED, closed, absl::StatusCode::kOk);
  j.mutable_result()->clear_ranks();
  j.set_state(v1::JOB_STATE_PENDING);
  j.set_reason(queued);
  j.set_queued_unix_ms(clock_->UnixMs());
  j.clear_worker_ids();
  j.clear_worker_hosts();
  j.clear_worker_regions();
  j.clear_worker_pids();
  ChangedLocked(active);
  spdlog::info("job {}: {}", j.id(), queued);
}

void Coordinator::CloseAttemptLocked(ActiveJob& active, v1::AttemptOutcome outcome,
                                     const std::string& reason, absl::StatusCode reason_code) {
  // However it ends (success, cancel, failure, budget), an attempt still being adopted is
  // no longer waited for.
  active.adopt_until.reset();
  active.reattached.clear();
  // Started before a coordinator restart: rank 0's own (steady) account of it, which late
  // ranks may lengthen (AddRankToAttempt).
  const double wall = active.attempt_started
                          ? Seconds(clock_->Now() - *active.attempt_started)
                          : active.job.progress().elapsed_seconds();
  const bool unknown = !active.attempt_started && wall <= 0;
  active.attempt_started.reset();
  CloseAttempt(active.job, outcome, reason, reason_code, wall, options_.grid_gco2_per_kwh);
  v1::JobResult* r = active.job.mutable_result();
  // Who the others waited on: the ranks' whole-attempt timing where they reported it,
  // their last progress otherwise.
  if (std::optional<v1::Straggler> s = active.live.Straggler(
          r->ranks(), [&](int32_t rank) { return HostOfRankLocked(active.job, rank); })) {
    *r->mutable_straggler() = *std::move(s);
  } else {
    r->clear_straggler();  // none of this attempt's, and an earlier one's is not its
  }
  v1::AttemptSummary* closed = r->mutable_attempts(r->attempts_size() - 1);
  // What the ranks still to report said so far: counted until their results replace it.
  for (const auto& [rank, joules] : active.live.UnreportedJoules(closed->ranks_reported())) {
    (*closed->mutable_unreported_progress_joules())[rank] = joules;
  }
  if (unknown) {
    closed->add_energy_warnings("wall time unknown (the attempt was cut short before any "
                                "progress report): its device-hours count only what late ranks "
                                "report");
  }
  RecomputeTotals(active.job, options_.grid_gco2_per_kwh);
  metrics_.AddJobEnergy(active.job, LastAttemptJoules(active.job));
}

void Coordinator::FailAttemptLocked(ActiveJob& active, const std::string& reason,
                                    absl::StatusCode code) {
  v1::Job& job = active.job;
  const int failed = job.result().failed_attempts_size();
  const bool retryable = IsRetryable(code);
  if (!retryable || failed >= job.spec().max_restarts()) {
    EndAttemptLocked(active, v1::JOB_STATE_FAILED,
                     retryable && failed > 0
                         ? absl::StrCat(reason, " (after ", failed, " restarts)")
                         : reason,
                     code);
    return;
  }
  // Stop the other ranks, keep what the attempt did and spent, and queue the next one.
  StopRanksLocked(job, reason);
  CloseAttemptLocked(active, v1::ATTEMPT_OUTCOME_REQUEUED, reason, code);
  // Unless the budget is spent: what the ranks that reported said, and the others' last
  // progress.
  if (const double budget = job.spec().energy_budget_joules(); budget > 0) {
    v1::AttemptSummary& closed =
        *job.mutable_result()->mutable_attempts(job.result().attempts_size() - 1);
    const double spent = JobJoulesSoFar(job.result().energy());
    if (spent >= budget) {
      closed.set_outcome(v1::ATTEMPT_OUTCOME_FAILED);
      EndJobLocked(active, v1::JOB_STATE_BUDGET_EXCEEDED,
                   absl::StrFormat("%s; no restart: its energy budget is spent (%.0f J of %.0f J)",
                                   reason, spent, budget));
      return;
    }
  }
  Requeue(job, reason, clock_->UnixMs());
  active.queued_at = clock_->Now();
  metrics_.AttemptEnded(job.id(), "restarted");
  spdlog::warn("job {}: {}", job.id(), job.reason());
  ChangedLocked(active);
}

v1::Job Coordinator::EndAttemptLocked(ActiveJob& active, v1::JobState state,
                                      const std::string& reason, absl::StatusCode code,
                                      bool graceful) {
  v1::Job& job = active.job;
  CloseAttemptLocked(active, AttemptOutcomeOf(state), reason, code);
  // None is busy with it any more after a success; a spent budget stops them gracefully.
  StopRanksLocked(job, reason, graceful);
  spdlog::info("job {}: attempt {} ended {}{}{}", job.id(), job.attempt(), JobStateName(state),
               reason.empty() ? "" : ": ", reason);
  EndJobLocked(active, state, reason);
  return job;
}

void Coordinator::EndJobLocked(ActiveJob& active, v1::JobState state, const std::string& reason) {
  v1::Job& job = active.job;
  job.set_state(state);
  job.set_reason(reason);
  job.set_finished_unix_ms(clock_->UnixMs());
  RecomputeTotals(job, options_.grid_gco2_per_kwh);  // what every attempt spent
  if (std::optional<v1::CarbonAccount> account =
          AccountCarbonInRegions(job, ForecastLocked(), options_.region)) {
    *job.mutable_carbon() = *std::move(account);
  }
  PublishBudgetUse(metrics_, job);
  metrics_.AttemptEnded(job.id(), JobStateName(state));
  metrics_.JobEnded(job);
  --active_by_client_[job.submitted_by()];
  ChangedLocked(active);
}

std::string Coordinator::Scope(int64_t job_id, int32_t attempt) const {
  // A leadership's keys are its own: ranks of an attempt the previous leader started
  // cannot meet here by accident, nor fill the scope of the same attempt run again.
  if (options_.lease_epoch != 0) {
    return absl::StrCat("epoch/", options_.lease_epoch, "/job/", job_id, "/attempt/", attempt);
  }
  return absl::StrCat("job/", job_id, "/attempt/", attempt);
}

void Coordinator::ScheduleLocked() {
  if (stopping_ || shutting_down_) return;
  std::vector<PendingJob> pending;
  const int64_t now_ms = clock_->UnixMs();
  carbon_held_ = 0;
  next_carbon_event_ms_ = std::numeric_limits<int64_t>::max();
  // Counted once a pass, where a job is planned in a region.
  std::optional<std::map<std::pair<v1::DeviceKind, std::string>, int>> registered;
  for (auto& [id, a] : active_) {
    if (a.job.state() != v1::JOB_STATE_PENDING) continue;
    const v1::CarbonPlan& plan = a.job.carbon_plan();
    // Waited for a greener start (a plan made at submit to start then did not).
    const bool waited =
        a.job.spec().carbon_aware() && plan.planned_start_unix_ms() > a.job.created_unix_ms();
    // At its latest start a job that waited goes ahead, and one planned in a region may
    // take any region's workers: a pass then.
    if ((waited || (a.job.spec().carbon_aware() && !plan.region().empty())) &&
        now_ms < plan.latest_start_unix_ms()) {
      next_carbon_event_ms_ = std::min(next_carbon_event_ms_, plan.latest_start_unix_ms());
    }
    if (HeldByCarbonPlan(a.job, now_ms)) {
      ++carbon_held_;
      next_carbon_event_ms_ = std::min(next_carbon_event_ms_, plan.planned_start_unix_ms());
      // Waits for its greener start, and blocks no other job meanwhile.
      if (const std::string why = CarbonWaitingReason(a.job.carbon_plan()); a.job.reason() != why) {
        a.job.set_reason(why);
        ChangedLocked(a);
      }
      continue;
    }
    // A carbon-aware job that waited and whose latest start has come goes ahead of every
    // other: its deadline is a promise (it blocks later jobs of its kind until its gang is
    // free). One planned to start at once queues as any other.
    const bool deadline = waited && now_ms >= plan.latest_start_unix_ms();
    if (!plan.region().empty() && !registered) registered = RegisteredByRegionLocked();
    pending.push_back({id, deadline ? std::numeric_limits<int32_t>::max() : a.job.spec().priority(),
                       a.job.spec().device_kind(), a.job.spec().workers(),
                       registered ? PinnedRegionLocked(a.job, now_ms, *registered) : "",
                       a.job.spec().carbon_aware() ? plan.region() : ""});
  }
  if (pending.empty()) return;
  ScheduleDecision decision = Schedule(std::move(pending), workers_.Slots());
  const auto now = clock_->Now();
  for (const Placement& p : decision.placements) {
    ActiveJob& active = active_.at(p.job_id);
    v1::Job& job = active.job;
    metrics_.AttemptStarted(job.id(), Seconds(now - active.queued_at));
    StartAttempt(job, p.workers, clock_->UnixMs(), options_.grid_gco2_per_kwh);
    active.attempt_started = now;
    active.live = LiveAttempt();
    active.stepped = false;
    job.mutable_progress()->set_job_energy_joules(JobJoulesSoFar(job.result().energy()));
    const std::string scope = Scope(job.id(), job.attempt());
    kv_.OpenScope(scope);
    const auto world_size = static_cast<int32_t>(p.workers.size());
    for (int32_t rank = 0; rank < world_size; ++rank) {
      Worker& w = *workers_.Find(p.workers[rank]);
      job.add_worker_hosts(w.info.host());
      job.add_worker_regions(w.info.region());
      job.add_worker_pids(w.info.pid());
      WorkerRegistry::Assign(w, job.id(), rank, job.attempt());
      v1::CoordinatorMessage m = Stamped();
      *m.mutable_assignment() = AssignmentFor(job, rank, world_size, scope);
      w.sink->Send(m);
    }
    spdlog::info("job {}: attempt {} started on {} workers", job.id(), job.attempt(),
                 p.workers.size());
    ChangedLocked(active);
  }
  for (const auto& [id, waiting] : decision.waiting) {
    ActiveJob& active = active_.at(id);
    const std::string why = WaitingReason(active.job, waiting);
    if (active.job.reason() != why) {
      active.job.set_reason(why);
      ChangedLocked(active);
    }
  }
}

GangCapacity Coordinator::GangCapacityLocked(v1::DeviceKind kind, const std::string& region,
                                             int64_t now_ms, const std::set<int64_t>& skip) {
  // A reservation of no known region counts against every region's workers.
  const auto in_region = [&](const std::string& r) {
    return region.empty() || r.empty() || r == region;
  };
  GangCapacity gang;
  for (const WorkerSlot& w : workers_.Slots()) {
    gang.workers += w.kind == kind && (region.empty() || w.region == region) ? 1 : 0;
  }
  for (const auto& [n, provisional] : carbon_provisional_) {
    if (provisional.kind == kind && in_region(provisional.region)) {
      gang.reserved.push_back(provisional.reservation);
    }
  }
  for (const auto& [id, a] : active_) {
    if (a.job.spec().device_kind() != kind || skip.count(id)) continue;
    if (!in_region(ReservationRegion(a.job, now_ms))) continue;
    if (std::optional<WorkerReservation> r = ReservationOf(a.job, now_ms)) {
      // A running gang across regions holds in this one the workers it has here.
      if (!region.empty() && a.job.worker_regions_size() > 0) {
        r->workers = static_cast<int>(
            std::count(a.job.worker_regions().begin(), a.job.worker_regions().end(), region));
        if (r->workers == 0) continue;
      }
      gang.reserved.push_back(*r);
    }
  }
  return gang;
}

std::map<std::string, GangCapacity> Coordinator::GangsLocked(v1::DeviceKind kind,
                                                             const RegionalForecast& forecast,
                                                             int64_t now_ms,
                                                             const std::set<int64_t>& skip) {
  std::map<std::string, GangCapacity> gangs;
  if (!forecast.several_regions) {
    gangs[""] = GangCapacityLocked(kind, "", now_ms, skip);
    return gangs;
  }
  for (const auto& [region, snapshot] : forecast.by_region) {
    gangs[region] = GangCapacityLocked(kind, region, now_ms, skip);
  }
  return gangs;
}

RegionalForecast Coordinator::ForecastLocked() const {
  // The regions ever seen, not those with a session now: a worker's reconnect does not
  // turn the cluster single-region and back (re-planning every held job each time).
  std::set<std::string> regions = workers_.regions_seen();
  for (const auto& [region, source] : options_.carbon) regions.insert(region);
  return SnapshotRegions(options_.carbon, regions.size() > 1);
}

std::map<std::pair<v1::DeviceKind, std::string>, int> Coordinator::RegisteredByRegionLocked()
    const {
  std::map<std::pair<v1::DeviceKind, std::string>, int> registered;
  for (const WorkerSlot& w : workers_.Slots()) ++registered[{w.kind, w.region}];
  return registered;
}

std::string Coordinator::PinnedRegionLocked(
    const v1::Job& job, int64_t now_ms,
    const std::map<std::pair<v1::DeviceKind, std::string>, int>& registered) const {
  const std::string& region = job.carbon_plan().region();
  if (!job.spec().carbon_aware() || region.empty()) return "";
  if (now_ms >= job.carbon_plan().latest_start_unix_ms()) return "";
  auto it = registered.find({job.spec().device_kind(), region});
  return it != registered.end() && it->second >= job.spec().workers() ? region : "";
}

std::vector<Coordinator::StaleCarbonPlan> Coordinator::StaleCarbonPlansLocked(
    const RegionalForecast& forecast, int64_t now_ms) {
  std::vector<StaleCarbonPlan> stale;
  const auto registered = RegisteredByRegionLocked();
  const auto fits = [&](const v1::JobSpec& spec, const std::string& region) {
    auto it = registered.find({spec.device_kind(), region});
    return it != registered.end() && it->second >= spec.workers();
  };
  for (auto& [id, a] : active_) {
    if (!HeldByCarbonPlan(a.job, now_ms)) continue;
    const v1::CarbonPlan& plan = a.job.carbon_plan();
    // Planned in a region that has lost the workers for its gang, while another with a
    // forecast has them: planned again there. Only once it has lacked them for the
    // heartbeat timeout (a reconnect, or a restart while workers register again one by
    // one, moves nothing).
    bool moved = false, within_grace = false;
    if (forecast.several_regions && !plan.region().empty() && !fits(a.job.spec(), plan.region())) {
      if (a.region_short_since_ms == 0) a.region_short_since_ms = now_ms;
      const bool long_enough =
          now_ms - a.region_short_since_ms >= options_.heartbeat_timeout.count();
      within_grace = !long_enough;
      for (const auto& [region, snapshot] : forecast.by_region) {
        moved = moved || (long_enough && snapshot.series != nullptr && fits(a.job.spec(), region));
      }
    } else {
      a.region_short_since_ms = 0;
    }
    if (plan.forecast_digest() != forecast.digest || moved) {
      // A new forecast while its region is short for less than the timeout: planned again
      // in that region, as if its workers were back (they may be, in a moment).
      stale.push_back({id, a.job.spec(), within_grace ? plan.region() : ""});
    }
  }
  return stale;
}

void Coordinator::CheckCarbonPlans() {
  const int64_t now_ms = clock_->UnixMs();
  // A change shows in the digests: the held jobs planned on another are re-planned.
  for (const auto& [region, source] : options_.carbon) source->Refresh(now_ms);
  // The held jobs planned on another forecast (a new one, or none: the source failed or
  // is gone after a restart), re-planned outside the lock.
  std::vector<StaleCarbonPlan> stale;  // by id: in submit order
  std::map<v1::DeviceKind, std::map<std::string, GangCapacity>> gangs;
  RegionalForecast forecast;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || shutting_down_) return;
    forecast = ForecastLocked();
    for (const auto& [region, snapshot] : forecast.by_region) {
      metrics_.SetGridIntensity(
          region, snapshot.series != nullptr ? snapshot.series->At(now_ms) : std::nullopt);
    }
    // A held job's start, or a waiting job's latest start (it goes ahead), has come.
    const bool due = now_ms >= next_carbon_event_ms_;
    if (carbon_held_ != 0) stale = StaleCarbonPlansLocked(forecast, now_ms);
    if (stale.empty()) {
      if (due) ScheduleLocked();
      return;
    }
    std::set<int64_t> skip;
    for (const StaleCarbonPlan& s : stale) skip.insert(s.id);
    for (const StaleCarbonPlan& s : stale) {
      if (!gangs.count(s.spec.device_kind())) {
        gangs[s.spec.device_kind()] = GangsLocked(s.spec.device_kind(), forecast, now_ms, skip);
      }
    }
  }
  // One by one in submit order, each beside the plans made before it.
  std::vector<std::pair<int64_t, v1::CarbonPlan>> plans;
  plans.reserve(stale.size());
  for (const auto& [id, spec, keep_region] : stale) {
    std::map<std::string, GangCapacity>& kind_gangs = gangs[spec.device_kind()];
    if (!keep_region.empty() && forecast.by_region.count(keep_region)) {
      RegionalForecast only = forecast;
      only.by_region = {{keep_region, forecast.by_region.at(keep_region)}};
      std::map<std::string, GangCapacity> own = {{keep_region, kind_gangs[keep_region]}};
      own[keep_region].workers = std::max(own[keep_region].workers, spec.workers());
      plans.emplace_back(id, PlanCarbonAwareStartInRegions(spec, now_ms, only, own));
    } else {
      plans.emplace_back(id, PlanCarbonAwareStartInRegions(spec, now_ms, forecast, kind_gangs));
    }
    const v1::CarbonPlan& plan = plans.back().second;
    if (plan.planned_start_unix_ms() > now_ms) {
      const WorkerReservation r{plan.planned_start_unix_ms(),
                                plan.planned_start_unix_ms() + CarbonRunMs(spec), spec.workers()};
      // In its region's gang; one planned anywhere holds workers in each.
      for (auto& [region, gang] : kind_gangs) {
        if (plan.region().empty() || region == plan.region()) gang.reserved.push_back(r);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || shutting_down_) return;
  for (auto& [id, plan] : plans) {
    auto it = active_.find(id);
    if (it == active_.end()) continue;
    ActiveJob& a = it->second;
    v1::Job& job = a.job;
    // Started or cancelled meanwhile: as it is.
    if (!HeldByCarbonPlan(job, now_ms)) continue;
    const int64_t before = job.carbon_plan().planned_start_unix_ms();
    *job.mutable_carbon_plan() = std::move(plan);
    spdlog::info(
        "job {}: carbon-aware start re-planned on {}: {} (was {})", id,
        std::any_of(forecast.by_region.begin(), forecast.by_region.end(),
                    [](const auto& r) { return r.second.series != nullptr; })
            ? "a new forecast"
            : "no forecast",
        HeldByCarbonPlan(job, now_ms) ? CarbonWaitingReason(job.carbon_plan())
                                      : absl::StrCat("now: ", job.carbon_plan().note()),
        absl::FormatTime("%Y-%m-%d %H:%M UTC", absl::FromUnixMillis(before), absl::UTCTimeZone()));
    ChangedLocked(a);
  }
  ScheduleLocked();
}

}  // namespace joule::server
