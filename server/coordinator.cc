#include "server/coordinator.h"

#include <google/protobuf/util/message_differencer.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/names.h"
#include "common/text.h"
#include "server/scheduler.h"

namespace joule::server {
namespace {

// 64 random bits, hex: a job's identity beyond its id, which a new database reuses.
// Thread-safe: each thread has its own engine, seeded from the OS.
std::string NewJobUid() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16));
}

// Bytes as "12.3 GiB", for messages.
std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}

std::string BootToken() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd() & 0xffff, absl::kZeroPad4));
}

}  // namespace

absl::Status CoordinatorOptions::Validate() const {
  if (db_path.empty()) return absl::InvalidArgumentError("db_path is empty");
  if (heartbeat_interval.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat interval ", heartbeat_interval.count(), " ms is not positive"));
  }
  if (heartbeat_timeout < 2 * heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat timeout ", heartbeat_timeout.count(), " ms is shorter than two intervals (",
        2 * heartbeat_interval.count(), " ms)"));
  }
  return absl::OkStatus();
}

struct Coordinator::Metrics {
  explicit Metrics(prometheus::Registry& r)
      : jobs(prometheus::BuildGauge()
                 .Name("joule_jobs")
                 .Help("Jobs pending or running now")
                 .Register(r)),
        jobs_finished(prometheus::BuildCounter()
                          .Name("joule_jobs_finished_total")
                          .Help("Job attempts that ended, by final state")
                          .Register(r)),
        workers(prometheus::BuildGauge()
                    .Name("joule_workers")
                    .Help("Registered workers by state and device kind")
                    .Register(r)),
        queue_wait(prometheus::BuildHistogram()
                       .Name("joule_job_queue_wait_seconds")
                       .Help("Time from submit (or re-queue) to the start of an attempt")
                       .Register(r)
                       .Add({}, prometheus::Histogram::BucketBoundaries{
                                    0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400})),
        job_energy(prometheus::BuildCounter()
                       .Name("joule_job_energy_joules_total")
                       .Help("Energy of job attempts, summed over ranks, added when they end")
                       .Register(r)),
        job_info(prometheus::BuildGauge()
                     .Name("joule_job_info")
                     .Help("Always 1: a job's identity, to name joule_job in dashboards")
                     .Register(r)) {}
  prometheus::Family<prometheus::Gauge>& jobs;
  prometheus::Family<prometheus::Counter>& jobs_finished;
  prometheus::Family<prometheus::Gauge>& workers;
  prometheus::Histogram& queue_wait;
  prometheus::Family<prometheus::Counter>& job_energy;
  prometheus::Family<prometheus::Gauge>& job_info;
};

namespace {

// Failures that another attempt would meet again: bad input, bad data, ranks that disagree.
bool IsRetryableCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kResourceExhausted:  // out of memory: the next attempt would be too
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kPermissionDenied:
      return false;
    default:
      return true;
  }
}

// How well an error explains why an attempt failed: a rank's own failure explains more
// than what its peers saw when it left (an aborted collective, a closed connection).
int RootCauseWeight(absl::StatusCode code) {
  if (!IsRetryableCode(code)) return 3;  // bad data, bad input, ranks that disagree
  switch (code) {
    case absl::StatusCode::kCancelled:
      return 0;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return 1;  // what a peer sees when a rank dies or leaves
    default:
      return 2;  // the rank's own failure: out of memory, an internal error
  }
}

}  // namespace

bool Coordinator::IsRetryable(absl::StatusCode code) { return IsRetryableCode(code); }

void Coordinator::StopRanksLocked(const v1::Job& job, const std::string& reason) {
  v1::CoordinatorMessage cancel;
  cancel.mutable_cancel()->set_job_id(job.id());
  cancel.mutable_cancel()->set_attempt(job.attempt());
  cancel.mutable_cancel()->set_reason(reason);
  for (const std::string& id : job.worker_ids()) {
    auto w = workers_.find(id);
    if (w != workers_.end() && w->second.info.state() == v1::WORKER_STATE_BUSY &&
        w->second.info.job_id() == job.id() && w->second.attempt == job.attempt() &&
        w->second.sink) {
      w->second.sink->Send(cancel);
      w->second.stop_deadline = std::chrono::steady_clock::now() + options_.stop_timeout;
    }
  }
  kv_.CloseScope(Scope(job.id(), job.attempt()));
}

void Coordinator::FailAttemptLocked(ActiveJob& active, const std::string& reason,
                                    bool retryable) {
  v1::Job& job = active.job;
  const int failed = job.result().failed_attempts_size();
  if (!retryable || failed >= job.spec().max_restarts()) {
    EndAttemptLocked(active, v1::JOB_STATE_FAILED,
                     retryable && failed > 0
                         ? absl::StrCat(reason, " (after ", failed, " restarts)")
                         : reason);
    return;
  }
  // Stop the other ranks, keep what the attempt did and spent, and queue the next one.
  StopRanksLocked(job, reason);
  CloseAttemptLocked(active, v1::JOB_STATE_PENDING, reason);
  v1::JobResult* result = job.mutable_result();
  result->clear_ranks();
  result->add_failed_attempts(absl::StrCat("attempt ", job.attempt(), ": ", reason));
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_finished_unix_ms(0);  // it has not finished: it runs again
  job.set_queued_unix_ms(clock_->UnixMs());
  active.queued_at = clock_->SteadyNow();
  job.set_reason(absl::StrCat("attempt ", job.attempt(), " failed (", reason, "); restart ",
                              failed + 1, " of ", job.spec().max_restarts(), " queued"));
  job.clear_worker_ids();
  metrics_->jobs_finished.Add({{"state", "restarted"}}).Increment();
  spdlog::warn("job {}: {}", job.id(), job.reason());
  ChangedLocked(active);
}

std::string Coordinator::Scope(int64_t job_id, int32_t attempt) {
  return absl::StrCat("job/", job_id, "/attempt/", attempt);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open(options.db_path, options.store_busy_timeout_ms);
  if (!store.ok()) return store.status();
  absl::StatusOr<std::vector<v1::Job>> unfinished = (*store)->ListUnfinished();
  if (!unfinished.ok()) return unfinished.status();
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options), *std::move(store)));
  std::lock_guard<std::mutex> lock(c->mu_);
  for (v1::Job& job : *unfinished) {
    ActiveJob& active = c->active_[job.id()];
    active.job = std::move(job);
    active.stored_version = active.version;
    active.queued_at = c->clock_->SteadyNow();
    ++c->active_by_client_[active.job.submitted_by()];
    c->SetJobInfoLocked(active.job);
    if (active.job.state() != v1::JOB_STATE_RUNNING) continue;
    // The attempt was cut short by the restart: what it did and spent so far is kept (the
    // ranks that reported, and those that report when their workers reconnect); its wall
    // time ran from its start to the last sign of it, rank 0's last progress report.
    const std::string why = "interrupted by a coordinator restart";
    v1::Job& j = active.job;
    const double elapsed = j.progress().elapsed_seconds();
    *j.mutable_result()->add_attempts() = SummariseAttempt(
        j.attempt(), v1::JOB_STATE_PENDING, why, elapsed, j.spec().workers(), j.result().ranks());
    j.mutable_result()->clear_ranks();
    c->RecomputeTotals(j);
    j.set_state(v1::JOB_STATE_PENDING);
    j.set_reason(absl::StrCat("re-queued: the coordinator restarted during attempt ",
                              j.attempt()));
    j.set_queued_unix_ms(c->clock_->UnixMs());
    j.clear_worker_ids();
    c->ChangedLocked(active);
    spdlog::info("job {}: re-queued after coordinator restart", j.id());
  }
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(std::make_unique<Metrics>(*registry_)),
      clock_(options_.clock ? options_.clock : Clock::Real()) {
  next_worker_seq_ = 1;
  prometheus::BuildGauge()
      .Name("joule_build_info")
      .Help("The coordinator's build: version and protocol")
      .Register(*registry_)
      .Add({{"version", JOULE_VERSION}, {"program", "joule-coordinator"}, {"api", "joule.v1"}})
      .Set(1);
  writer_thread_ = std::thread([this] { WriterLoop(); });
  heartbeat_thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      changed_.wait_for(lock, std::chrono::milliseconds(500));
      if (stopping_) break;
      lock.unlock();
      CheckHeartbeats(clock_->SteadyNow());
      lock.lock();
    }
  });
}

Coordinator::~Coordinator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, w] : workers_) {
      if (w.sink) w.sink->Close();
    }
  }
  changed_.notify_all();
  heartbeat_thread_.join();
  // What is not stored yet gets a last chance (bounded), then the writer stops.
  if (!WaitStored(std::chrono::steady_clock::now() + std::chrono::seconds(5))) {
    spdlog::error("stopping with job changes not stored: the store keeps failing");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    writer_stop_ = true;
  }
  writer_wake_.notify_all();
  writer_thread_.join();
}

void Coordinator::BeginShutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  shutting_down_ = true;
  int running = 0;
  for (const auto& [id, a] : active_) running += a.job.state() == v1::JOB_STATE_RUNNING;
  spdlog::info("shutting down: {} running attempt(s) left as they are, to be re-queued at the "
               "next start",
               running);
}

bool Coordinator::WaitStored(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_until(lock, deadline,
                             [&] { return dirty_.empty() && late_results_.empty() && !writing_; });
}

void Coordinator::ChangedLocked(ActiveJob& active) {
  ++active.version;
  dirty_.insert(active.job.id());
  writer_wake_.notify_one();
  changed_.notify_all();
}

void Coordinator::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::chrono::milliseconds backoff{0};
  constexpr std::chrono::milliseconds kMaxBackoff{2000};
  while (true) {
    if (backoff.count() > 0) {
      // After a failure: wait before retrying, unless told to stop.
      writer_wake_.wait_for(lock, backoff, [&] { return writer_stop_; });
    }
    writer_wake_.wait(lock, [&] {
      return writer_stop_ || !dirty_.empty() || !late_results_.empty();
    });
    if (writer_stop_) return;
    // Take what is to be written; write it without the lock.
    std::vector<std::pair<v1::Job, uint64_t>> jobs;
    for (int64_t id : dirty_) {
      auto it = active_.find(id);
      if (it != active_.end()) jobs.emplace_back(it->second.job, it->second.version);
    }
    dirty_.clear();
    std::deque<LateResult> late;
    late.swap(late_results_);
    writing_ = true;
    lock.unlock();

    std::vector<absl::Status> written;
    for (const auto& [job, version] : jobs) written.push_back(store_->Update(job));
    std::deque<LateResult> late_failed;
    for (LateResult& l : late) {
      absl::StatusOr<v1::Job> stored = store_->Get(l.report.job_id());
      if (!stored.ok()) {
        if (stored.status().code() != absl::StatusCode::kNotFound) late_failed.push_back(l);
        continue;
      }
      if (!IsTerminal(stored->state())) {
        // It ran again meanwhile (a restart): handled in memory by the next pass.
        late_failed.push_back(l);
        continue;
      }
      const double before = stored->result().energy().total_joules();
      if (!MergeLateResult(*stored, l.rank, l.worker_id, l.report)) continue;
      if (absl::Status st = store_->Update(*stored); !st.ok()) {
        late_failed.push_back(l);
        continue;
      }
      // Counted on the job's series while /metrics still keeps it (never re-created).
      const prometheus::Labels labels{{"joule_job", std::to_string(stored->id())}};
      if (metrics_->job_energy.Has(labels)) {
        metrics_->job_energy.Add(labels).Increment(
            std::max(0.0, stored->result().energy().total_joules() - before));
      }
    }

    lock.lock();
    writing_ = false;
    bool failed = !late_failed.empty();
    for (LateResult& l : late_failed) late_results_.push_back(std::move(l));
    for (size_t i = 0; i < jobs.size(); ++i) {
      const int64_t id = jobs[i].first.id();
      auto it = active_.find(id);
      if (it == active_.end()) continue;
      ActiveJob& a = it->second;
      if (!written[i].ok()) {
        failed = true;
        if (a.store_error.empty()) {
          spdlog::error("job {}: could not store state {} (kept in memory, retrying): {}", id,
                        JobStateName(jobs[i].first.state()), written[i].ToString());
        }
        a.store_error = std::string(written[i].message());
        dirty_.insert(id);
        continue;
      }
      if (!a.store_error.empty()) spdlog::info("job {}: stored after retrying", id);
      a.store_error.clear();
      a.stored_version = std::max(a.stored_version, jobs[i].second);
      if (IsTerminal(a.job.state()) && a.stored_version == a.version) active_.erase(it);
    }
    backoff = failed ? std::min(kMaxBackoff, std::max(std::chrono::milliseconds(50), 2 * backoff))
                     : std::chrono::milliseconds(0);
    changed_.notify_all();
  }
}

void Coordinator::RecomputeTotals(v1::Job& job) const {
  v1::JobResult* result = job.mutable_result();
  int64_t samples = 0;
  for (const v1::AttemptSummary& a : result->attempts()) samples += a.samples();
  result->set_samples(samples);
  *result->mutable_energy() =
      BuildEnergyReport(*result, options_.grid_gco2_per_kwh, job.spec().workers());
}

void Coordinator::CloseAttemptLocked(ActiveJob& active, v1::JobState outcome,
                                     const std::string& reason) {
  v1::Job& job = active.job;
  double wall = 0;
  if (active.attempt_started) {
    wall = std::chrono::duration<double>(clock_->SteadyNow() - *active.attempt_started).count();
  } else {
    // Started before a coordinator restart: rank 0's own (steady) account of it.
    wall = job.progress().elapsed_seconds();
  }
  active.attempt_started.reset();
  v1::JobResult* result = job.mutable_result();
  result->set_wall_seconds(wall);
  *result->add_attempts() =
      SummariseAttempt(job.attempt(), outcome, reason, wall, job.spec().workers(), result->ranks());
  RecomputeTotals(job);
  double joules = 0;
  for (const v1::EnergyRecord& e : result->attempts(result->attempts_size() - 1).energy()) {
    joules += e.joules();
  }
  metrics_->job_energy.Add({{"joule_job", std::to_string(job.id())}}).Increment(joules);
}

bool Coordinator::MergeLateResult(v1::Job& job, int32_t rank, const std::string& worker_id,
                                  const v1::ResultReport& report) const {
  v1::JobResult* result = job.mutable_result();
  v1::AttemptSummary* summary = nullptr;
  for (v1::AttemptSummary& a : *result->mutable_attempts()) {
    if (a.attempt() == report.attempt()) summary = &a;
  }
  if (summary == nullptr) return false;
  v1::RankResult r = report.result();
  r.set_rank(rank);
  r.set_worker_id(worker_id);
  if (!AddRankToAttempt(*summary, r)) return false;
  // The attempt ended on the first error to arrive, often a peer's "connection closed";
  // a rank's own error that explains more becomes the attempt's reason.
  if (!r.ok() && !r.cancelled() && summary->outcome() != v1::JOB_STATE_SUCCEEDED &&
      summary->outcome() != v1::JOB_STATE_CANCELLED) {
    const auto code = static_cast<absl::StatusCode>(r.error_code());
    const int weight = RootCauseWeight(code);
    const int recorded = RootCauseWeight(static_cast<absl::StatusCode>(summary->reason_code()));
    if (weight > recorded) {
      const std::string why = absl::StrCat("rank ", rank, " (worker ", worker_id, "): ", r.error());
      const std::string old_entry = absl::StrCat("attempt ", report.attempt(), ": ", summary->reason());
      for (std::string& f : *result->mutable_failed_attempts()) {
        if (f == old_entry) f = absl::StrCat("attempt ", report.attempt(), ": ", why);
      }
      if (job.attempt() == report.attempt() && job.state() == v1::JOB_STATE_FAILED) {
        job.set_reason(why);
      } else if (job.state() == v1::JOB_STATE_PENDING && job.attempt() == report.attempt()) {
        job.set_reason(absl::StrCat("attempt ", job.attempt(), " failed (", why, "); restart ",
                                    result->failed_attempts_size(), " of ",
                                    job.spec().max_restarts(), " queued"));
      }
      summary->set_reason(why);
      summary->set_reason_code(static_cast<int32_t>(code));
    }
  }
  RecomputeTotals(job);
  return true;
}

absl::StatusOr<int64_t> Coordinator::Submit(v1::JobSpec spec, const std::string& request_id,
                                            bool* existing, const std::string& client) {
  if (absl::Status s = NormalizeAndValidateSpec(spec, options_.limits); !s.ok()) return s;
  // idx:/csv: data, torchscript: models: under the roots, absolute and canonical.
  if (absl::Status s = ResolveUserPaths(spec, options_.data_roots); !s.ok()) return s;
  if (absl::Status s = CheckText("request_id", request_id, 256); !s.ok()) return s;
  absl::StatusOr<ResourceEstimate> need = EstimateResources(spec);
  if (!need.ok()) return need.status();
  if (need->total_bytes() > kMaxJobBytesPerWorker) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job needs about ", Gib(need->total_bytes()), " per worker (", need->parameters,
        " parameters: ", Gib(need->model_bytes), "; data: ", Gib(need->dataset_bytes),
        "), more than any worker can hold (limit ", Gib(kMaxJobBytesPerWorker), ")"));
  }
  v1::Job job;
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_created_unix_ms(clock_->UnixMs());
  job.set_queued_unix_ms(job.created_unix_ms());
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
  {
    // Reserve the client's slot before the (slow) insert, so concurrent submits cannot
    // pass the limit together.
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    const int active_for_client = active_by_client_[client];
    if (active_for_client >= options_.max_active_jobs_per_client) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "client ", client, " already has ", active_for_client,
          " jobs pending or running (limit ", options_.max_active_jobs_per_client, ")"));
    }
    if (absl::Status s = CheckFitsLocked(job.spec(), *need); !s.ok()) return s;
    ++active_by_client_[client];
  }
  absl::Status inserted = store_->Insert(&job, existing);
  std::lock_guard<std::mutex> lock(mu_);
  if (!inserted.ok() || *existing) {
    --active_by_client_[client];
    if (!inserted.ok()) return inserted;
    return job.id();
  }
  spdlog::info("job {}: submitted ({} on {}, {} {} workers, global batch {})", job.id(),
               job.spec().model(), job.spec().dataset(), job.spec().workers(),
               DeviceKindName(job.spec().device_kind()), job.spec().global_batch_size());
  ActiveJob& active = active_[job.id()];
  active.job = std::move(job);
  active.queued_at = clock_->SteadyNow();
  int64_t id = active.job.id();
  SetJobInfoLocked(active.job);
  // With no idle worker of its kind the new job cannot start, and no other job's place
  // changes: say why it waits without a pass over the whole queue (which would make a
  // burst of submissions quadratic in the queue's length).
  int registered = 0, idle = 0;
  for (const auto& [wid, w] : workers_) {
    if (!w.sink || w.info.device_kind() != active.job.spec().device_kind()) continue;
    ++registered;
    idle += w.info.state() == v1::WORKER_STATE_IDLE;
  }
  if (idle == 0) {
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

absl::Status Coordinator::CheckFitsLocked(const v1::JobSpec& spec,
                                          const ResourceEstimate& need) const {
  // The most memory any worker of the kind reported; unknown (no such worker yet, or
  // none reported) is not a reason to refuse.
  int64_t host = 0, device = 0;
  for (const auto& [id, w] : workers_) {
    if (w.info.device_kind() != spec.device_kind()) continue;
    host = std::max(host, w.info.memory_bytes());
    device = std::max(device, w.info.device_memory_bytes());
  }
  const std::string kind = DeviceKindName(spec.device_kind());
  if (spec.device_kind() == v1::DEVICE_KIND_GPU && device > 0 && need.model_bytes > device) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model needs about ", Gib(need.model_bytes), " of GPU memory (", need.parameters,
        " parameters), more than the largest gpu worker's ", Gib(device)));
  }
  const int64_t host_need =
      spec.device_kind() == v1::DEVICE_KIND_GPU ? need.dataset_bytes : need.total_bytes();
  if (host > 0 && host_need > host) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job needs about ", Gib(host_need), " of memory per worker (", need.parameters,
        " parameters: ", Gib(need.model_bytes), "; data: ", Gib(need.dataset_bytes),
        "), more than the ", Gib(host), " available on the largest ", kind, " worker"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Coordinator::GetJob(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find(id);
    if (it != active_.end()) return it->second.job;
  }
  return store_->Get(id);
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request) {
  int limit = request.page_size() <= 0 ? 100 : std::min(request.page_size(), 1000);
  absl::StatusOr<std::vector<v1::Job>> jobs =
      store_->List(request.state(), request.before_id(), limit);
  if (!jobs.ok()) return jobs.status();
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListJobsResponse response;
  for (v1::Job& job : *jobs) {
    auto it = active_.find(job.id());
    *response.add_jobs() = it != active_.end() ? it->second.job : std::move(job);
  }
  if (static_cast<int>(jobs->size()) == limit) {
    response.set_next_before_id(response.jobs(response.jobs_size() - 1).id());
  }
  return response;
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
    v1::Job& job = it->second.job;
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_reason("cancelled by user while pending");
    metrics_->jobs_finished.Add({{"state", JobStateName(v1::JOB_STATE_CANCELLED)}}).Increment();
    job.set_finished_unix_ms(clock_->UnixMs());
    RecomputeTotals(job);  // what earlier attempts spent
    result = job;
    --active_by_client_[job.submitted_by()];
    RetireJobMetricsLocked(job);
    ChangedLocked(it->second);
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
    const std::string& why = active_.at(id).store_error;
    return absl::UnavailableError(absl::StrCat(
        "job ", id, " is cancelled but the job store could not record it",
        why.empty() ? "" : ": ", why, " (it stays cancelled; the coordinator keeps retrying)"));
  }
  return result;
}

absl::StatusOr<v1::Job> Coordinator::WaitForJobChange(
    int64_t id, v1::Job* last, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    v1::Job current;
    auto it = active_.find(id);
    if (it != active_.end()) {
      current = it->second.job;
    } else {
      // Ended and stored: read it without the lock, and it does not change any more.
      lock.unlock();
      absl::StatusOr<v1::Job> stored = store_->Get(id);
      if (!stored.ok()) return stored.status();
      *last = *stored;
      return *std::move(stored);
    }
    bool same = last->id() == id &&
                google::protobuf::util::MessageDifferencer::Equals(current, *last);
    if (!same || IsTerminal(current.state()) || stopping_ ||
        std::chrono::steady_clock::now() >= deadline) {
      *last = current;
      return current;
    }
    changed_.wait_until(lock, deadline);
  }
}

std::vector<v1::WorkerInfo> Coordinator::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w.info);
  return out;
}

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  // Names end up in `joule workers`, logs, /http_sd JSON and metric labels: refuse what
  // any of them cannot carry, in one line.
  if (absl::Status s = CheckText("host", request.host(), 253); !s.ok()) return s;
  if (absl::Status s = CheckText("metrics_address", request.metrics_address(), 261); !s.ok()) {
    return s;
  }
  if (request.energy_sources_size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("energy_sources has ", request.energy_sources_size(), " entries, more than 8"));
  }
  for (const std::string& source : request.energy_sources()) {
    if (absl::Status s = CheckText("energy_sources", source, 32); !s.ok()) return s;
  }
  static const std::string boot = BootToken();
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = absl::StrCat("w", next_worker_seq_++, ".", boot);
  Worker& w = workers_[id];
  w.info.set_worker_id(id);
  w.info.set_host(request.host());
  w.info.set_device_kind(request.device_kind() == v1::DEVICE_KIND_GPU ? v1::DEVICE_KIND_GPU
                                                                       : v1::DEVICE_KIND_CPU);
  w.info.set_cores(request.cores());
  w.info.set_pid(request.pid());
  w.info.set_metrics_address(request.metrics_address());
  *w.info.mutable_energy_sources() = request.energy_sources();
  w.info.set_memory_bytes(std::max<int64_t>(0, request.memory_bytes()));
  w.info.set_device_memory_bytes(std::max<int64_t>(0, request.device_memory_bytes()));
  w.info.set_state(v1::WORKER_STATE_REGISTERED);
  w.info.set_registered_unix_ms(clock_->UnixMs());
  w.info.set_last_seen_unix_ms(clock_->UnixMs());
  w.last_seen = clock_->SteadyNow();
  spdlog::info("worker {} registered: host {}, pid {}, {} {} cores", id, w.info.host(),
               w.info.pid(), w.info.cores(), DeviceKindName(w.info.device_kind()));
  v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_interval_ms(static_cast<int32_t>(options_.heartbeat_interval.count()));
  for (const std::string& root : options_.data_roots) response.add_data_roots(root);
  return response;
}

absl::Status Coordinator::OpenSession(const std::string& worker_id,
                                      std::shared_ptr<SessionSink> sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker \"", SanitizeUtf8(worker_id, 64),
                                            "\" is not registered; register again"));
  }
  if (it->second.sink) {
    return absl::AlreadyExistsError(
        absl::StrCat("worker \"", worker_id, "\" already has a session"));
  }
  it->second.sink = std::move(sink);
  it->second.info.set_state(v1::WORKER_STATE_IDLE);
  it->second.last_seen = clock_->SteadyNow();
  spdlog::info("worker {}: session open", worker_id);
  ScheduleLocked();
  changed_.notify_all();
  return absl::OkStatus();
}

void Coordinator::OnWorkerMessage(const std::string& worker_id, const v1::WorkerMessage& message) {
  std::lock_guard<std::mutex> lock(mu_);
  auto wit = workers_.find(worker_id);
  if (wit == workers_.end()) return;
  Worker& worker = wit->second;
  worker.last_seen = clock_->SteadyNow();
  worker.info.set_last_seen_unix_ms(clock_->UnixMs());
  switch (message.kind_case()) {
    case v1::WorkerMessage::kProgress: {
      const v1::ProgressReport& p = message.progress();
      auto it = active_.find(p.job_id());
      if (it == active_.end() || it->second.job.state() != v1::JOB_STATE_RUNNING ||
          it->second.job.attempt() != p.attempt() || p.rank() != 0 ||
          worker.info.job_id() != p.job_id()) {
        return;
      }
      *it->second.job.mutable_progress() = p.progress();
      ChangedLocked(it->second);
      return;
    }
    case v1::WorkerMessage::kResult:
      HandleResultLocked(worker, message.result());
      return;
    default:
      return;  // heartbeats only refresh last_seen
  }
}

void Coordinator::HandleResultLocked(Worker& worker, const v1::ResultReport& report) {
  const bool current = worker.info.state() == v1::WORKER_STATE_BUSY &&
                       worker.info.job_id() == report.job_id() &&
                       worker.attempt == report.attempt();
  // The rank: the one this worker runs, or for a result delivered late (after the
  // attempt ended, or by a worker that reconnected) the one the result names.
  const int32_t rank = current ? worker.info.rank() : report.result().rank();
  if (current) {
    worker.stop_deadline.reset();
    worker.info.set_state(v1::WORKER_STATE_IDLE);
    worker.info.set_job_id(0);
    worker.info.set_rank(0);
    worker.attempt = 0;
  }
  auto it = active_.find(report.job_id());
  if (it == active_.end()) {
    // Ended and stored: the writer merges it into the stored job, outside the lock.
    late_results_.push_back({rank, worker.info.worker_id(), report});
    writer_wake_.notify_one();
  } else if (it->second.job.state() != v1::JOB_STATE_RUNNING ||
             it->second.job.attempt() != report.attempt() || !current) {
    // A rank of an attempt that already ended: its energy was spent all the same.
    ActiveJob& active = it->second;
    const double before = active.job.result().energy().total_joules();
    if (MergeLateResult(active.job, rank, worker.info.worker_id(), report)) {
      const prometheus::Labels labels{{"joule_job", std::to_string(active.job.id())}};
      if (metrics_->job_energy.Has(labels)) {
        metrics_->job_energy.Add(labels).Increment(
            std::max(0.0, active.job.result().energy().total_joules() - before));
      }
      const v1::RankResult& rr = report.result();
      // Re-queued on a peer's error, but this rank's own error is one no retry gets past.
      if (active.job.state() == v1::JOB_STATE_PENDING && active.job.attempt() == report.attempt() &&
          !rr.ok() && !rr.cancelled() &&
          !IsRetryable(static_cast<absl::StatusCode>(rr.error_code()))) {
        const std::string why = absl::StrCat("rank ", rank, " (worker ", worker.info.worker_id(),
                                             ") in attempt ", report.attempt(), ": ", rr.error());
        active.job.set_state(v1::JOB_STATE_FAILED);
        active.job.set_reason(why);
        active.job.set_finished_unix_ms(clock_->UnixMs());
        metrics_->jobs_finished.Add({{"state", JobStateName(v1::JOB_STATE_FAILED)}}).Increment();
        --active_by_client_[active.job.submitted_by()];
        RetireJobMetricsLocked(active.job);
        spdlog::info("job {}: ended FAILED: {}", active.job.id(), why);
      }
      ChangedLocked(active);
    }
  } else {
    ActiveJob& active = it->second;
    v1::Job& job = active.job;
    v1::RankResult* r = job.mutable_result()->add_ranks();
    *r = report.result();
    r->set_rank(rank);
    r->set_worker_id(worker.info.worker_id());
    if (!r->ok()) {
      FailAttemptLocked(active,
                        absl::StrCat("rank ", rank, " (worker ", worker.info.worker_id(),
                                     "): ", r->error()),
                        IsRetryable(static_cast<absl::StatusCode>(r->error_code())));
      // The summary of the failed attempt remembers how well its reason explains it.
      v1::JobResult* result = job.mutable_result();
      for (v1::AttemptSummary& a : *result->mutable_attempts()) {
        if (a.attempt() == report.attempt()) a.set_reason_code(r->error_code());
      }
    } else if (job.result().ranks_size() == job.spec().workers()) {
      v1::JobResult* result = job.mutable_result();
      std::sort(result->mutable_ranks()->begin(), result->mutable_ranks()->end(),
                [](const v1::RankResult& a, const v1::RankResult& b) { return a.rank() < b.rank(); });
      const v1::RankResult& r0 = result->ranks(0);
      // Data parallelism means one model: ranks that ended apart trained something else
      // (the workers compare hashes too; this holds even for a worker that does not).
      std::string differ;
      for (const v1::RankResult& rr : result->ranks()) {
        if (rr.parameter_hash() != r0.parameter_hash()) {
          absl::StrAppend(&differ, differ.empty() ? "" : ", ", "rank ", rr.rank(), " has ",
                          SanitizeUtf8(rr.parameter_hash(), 16));
        }
      }
      if (!differ.empty()) {
        EndAttemptLocked(active, v1::JOB_STATE_FAILED,
                         absl::StrCat("the ranks ended with different parameters: rank 0 has ",
                                      SanitizeUtf8(r0.parameter_hash(), 16), ", ", differ));
        ScheduleLocked();
        return;
      }
      result->set_test_accuracy(r0.test_accuracy());
      result->set_test_loss(r0.test_loss());
      result->set_steps(r0.steps());
      result->set_resumed_from_step(r0.resumed_from_step());
      int64_t samples = 0;
      double train_seconds = 0;
      for (const v1::RankResult& rr : result->ranks()) {
        samples += rr.samples();
        train_seconds = std::max(train_seconds, rr.train_seconds());
      }
      result->set_train_seconds(train_seconds);
      // This attempt's throughput; result.samples covers every attempt (below).
      result->set_samples_per_second(train_seconds > 0 ? samples / train_seconds : 0);
      EndAttemptLocked(active, v1::JOB_STATE_SUCCEEDED, "");
    } else {
      ChangedLocked(active);
    }
  }
  ScheduleLocked();
}

v1::Job Coordinator::EndAttemptLocked(ActiveJob& active, v1::JobState state,
                                      const std::string& reason) {
  v1::Job& job = active.job;
  job.set_state(state);
  job.set_reason(reason);
  job.set_finished_unix_ms(clock_->UnixMs());
  // The energy account covers the ranks that reported (all of them on success), and
  // every earlier attempt.
  CloseAttemptLocked(active, state, reason);
  metrics_->jobs_finished.Add({{"state", JobStateName(state)}}).Increment();
  StopRanksLocked(job, reason);  // none is busy with it any more after a success
  spdlog::info("job {}: attempt {} ended {}{}{}", job.id(), job.attempt(), JobStateName(state),
               reason.empty() ? "" : ": ", reason);
  --active_by_client_[job.submitted_by()];
  RetireJobMetricsLocked(job);
  ChangedLocked(active);
  // Stays in active_ until the writer has stored it.
  return job;
}

void Coordinator::LoseWorkerLocked(const std::string& worker_id, const std::string& reason) {
  auto wit = workers_.find(worker_id);
  if (wit == workers_.end()) return;
  Worker worker = std::move(wit->second);
  workers_.erase(wit);
  spdlog::warn("worker {} lost: {}", worker_id, reason);
  if (worker.sink) worker.sink->Close();
  if (worker.info.state() == v1::WORKER_STATE_BUSY && !shutting_down_) {
    auto it = active_.find(worker.info.job_id());
    if (it != active_.end() && it->second.job.state() == v1::JOB_STATE_RUNNING &&
        it->second.job.attempt() == worker.attempt) {
      FailAttemptLocked(it->second,
                        absl::StrCat("worker ", worker_id, " (rank ", worker.info.rank(),
                                     ") was lost: ", reason),
                        /*retryable=*/true);
    }
  }
  ScheduleLocked();
  changed_.notify_all();
}

void Coordinator::CloseSession(const std::string& worker_id, const SessionSink* sink,
                               const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.sink.get() != sink) return;
  LoseWorkerLocked(worker_id, reason);
}

void Coordinator::CheckHeartbeats(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  std::vector<std::pair<std::string, std::string>> lost;
  for (const auto& [id, w] : workers_) {
    if (now - w.last_seen > options_.heartbeat_timeout) {
      lost.emplace_back(id, absl::StrCat("no heartbeat for more than ",
                                         options_.heartbeat_timeout.count(), " ms"));
    } else if (w.stop_deadline && now > *w.stop_deadline &&
               w.info.state() == v1::WORKER_STATE_BUSY) {
      lost.emplace_back(id, absl::StrCat("still busy ", options_.stop_timeout.count(),
                                         " ms after being told to stop job ", w.info.job_id()));
    }
  }
  for (const auto& [id, why] : lost) LoseWorkerLocked(id, why);
}

void Coordinator::ScheduleLocked() {
  if (stopping_ || shutting_down_) return;
  std::vector<PendingJob> pending;
  for (const auto& [id, a] : active_) {
    if (a.job.state() != v1::JOB_STATE_PENDING) continue;
    pending.push_back({id, a.job.spec().priority(), a.job.spec().device_kind(),
                       a.job.spec().workers()});
  }
  if (pending.empty()) return;
  std::vector<WorkerSlot> slots;
  for (const auto& [id, w] : workers_) {
    if (!w.sink) continue;
    slots.push_back({id, w.info.device_kind(), w.info.state() == v1::WORKER_STATE_IDLE});
  }
  ScheduleDecision decision = Schedule(std::move(pending), slots);
  const auto now = clock_->SteadyNow();
  for (const Placement& p : decision.placements) {
    ActiveJob& active = active_.at(p.job_id);
    v1::Job& job = active.job;
    metrics_->queue_wait.Observe(std::chrono::duration<double>(now - active.queued_at).count());
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_attempt(job.attempt() + 1);
    // Created at 0 when the job starts, so increase() sees the energy added at its end.
    metrics_->job_energy.Add({{"joule_job", std::to_string(job.id())}});
    job.set_reason("");
    job.set_started_unix_ms(clock_->UnixMs());
    active.attempt_started = now;
    job.clear_worker_ids();
    // What earlier attempts leave: why they failed, what they did and spent.
    v1::JobResult earlier;
    earlier.mutable_failed_attempts()->Swap(job.mutable_result()->mutable_failed_attempts());
    earlier.mutable_attempts()->Swap(job.mutable_result()->mutable_attempts());
    job.mutable_result()->Swap(&earlier);
    RecomputeTotals(job);
    job.clear_progress();
    job.mutable_progress()->set_test_accuracy(-1);
    for (const std::string& w : p.workers) job.add_worker_ids(w);
    const std::string scope = Scope(job.id(), job.attempt());
    kv_.OpenScope(scope);
    for (size_t rank = 0; rank < p.workers.size(); ++rank) {
      Worker& w = workers_.at(p.workers[rank]);
      w.info.set_state(v1::WORKER_STATE_BUSY);
      w.info.set_job_id(job.id());
      w.info.set_rank(static_cast<int32_t>(rank));
      w.attempt = job.attempt();
      v1::CoordinatorMessage m;
      v1::Assignment* a = m.mutable_assignment();
      a->set_job_id(job.id());
      a->set_attempt(job.attempt());
      a->set_rank(static_cast<int32_t>(rank));
      a->set_world_size(static_cast<int32_t>(p.workers.size()));
      *a->mutable_spec() = job.spec();
      a->set_rendezvous_prefix(scope);
      a->set_job_uid(job.uid());
      w.sink->Send(m);
    }
    spdlog::info("job {}: attempt {} started on {} workers", job.id(), job.attempt(),
                 p.workers.size());
    ChangedLocked(active);
  }
  for (const auto& [id, waiting] : decision.waiting) {
    ActiveJob& active = active_.at(id);
    const int restarts = active.job.result().failed_attempts_size();
    const std::string why =
        restarts == 0 ? waiting
                      : absl::StrCat("restart ", restarts, " of ", active.job.spec().max_restarts(),
                                     " (", active.job.result().failed_attempts(restarts - 1),
                                     "): ", waiting);
    if (active.job.reason() != why) {
      active.job.set_reason(why);
      ChangedLocked(active);
    }
  }
}

void Coordinator::SetJobInfoLocked(const v1::Job& job) {
  if (job_info_.count(job.id())) return;
  prometheus::Gauge& g = metrics_->job_info.Add({{"joule_job", std::to_string(job.id())},
            {"name", SanitizeUtf8(job.spec().name(), 128)},
            {"model", SanitizeUtf8(job.spec().model(), 128)},
            {"dataset", SanitizeUtf8(job.spec().dataset(), 128)},
            {"device_kind", DeviceKindName(job.spec().device_kind())},
            {"workers", std::to_string(job.spec().workers())},
            {"submitted_by", SanitizeUtf8(job.submitted_by(), 128)}});
  g.Set(1);
  job_info_[job.id()] = &g;
}

void Coordinator::RetireJobMetricsLocked(const v1::Job& job) {
  finished_metrics_.push_back(job.id());
  while (static_cast<int>(finished_metrics_.size()) > std::max(0, options_.metrics_finished_jobs)) {
    const int64_t id = finished_metrics_.front();
    finished_metrics_.pop_front();
    metrics_->job_energy.Remove(&metrics_->job_energy.Add({{"joule_job", std::to_string(id)}}));
    if (auto g = job_info_.find(id); g != job_info_.end()) {
      metrics_->job_info.Remove(g->second);
      job_info_.erase(g);
    }
  }
}

void Coordinator::RefreshMetrics() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<v1::JobState, int> jobs{{v1::JOB_STATE_PENDING, 0}, {v1::JOB_STATE_RUNNING, 0}};
  for (const auto& [id, a] : active_) {
    if (!IsTerminal(a.job.state())) ++jobs[a.job.state()];
  }
  for (const auto& [state, n] : jobs) {
    metrics_->jobs.Add({{"state", JobStateName(state)}}).Set(n);
  }
  std::map<std::pair<std::string, std::string>, int> workers;
  for (auto kind : {v1::DEVICE_KIND_CPU, v1::DEVICE_KIND_GPU}) {
    for (auto st : {v1::WORKER_STATE_IDLE, v1::WORKER_STATE_BUSY, v1::WORKER_STATE_REGISTERED}) {
      workers[{WorkerStateName(st), DeviceKindName(kind)}] = 0;
    }
  }
  for (const auto& [id, w] : workers_) {
    ++workers[{WorkerStateName(w.info.state()), DeviceKindName(w.info.device_kind())}];
  }
  for (const auto& [key, n] : workers) {
    metrics_->workers.Add({{"state", key.first}, {"device_kind", key.second}}).Set(n);
  }
}

std::string Coordinator::HttpSdJson() {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [id, w] : workers_) {
    if (w.info.metrics_address().empty() || !w.sink) continue;
    const bool busy = w.info.state() == v1::WORKER_STATE_BUSY;
    // Target labels stay put for the worker's life (a changing target label would start
    // new series for all of its metrics at every job); the current job and rank go in
    // __meta_ labels, which relabel_configs can use and which are dropped otherwise.
    groups.push_back({{"targets", {w.info.metrics_address()}},
                      {"labels",
                       {{"joule_worker", id},
                        {"joule_host", w.info.host()},
                        {"__meta_joule_job", busy ? std::to_string(w.info.job_id()) : ""},
                        {"__meta_joule_rank", busy ? std::to_string(w.info.rank()) : ""}}}});
  }
  // Names are checked at registration; replace rather than throw if one slips through.
  return groups.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace joule::server
