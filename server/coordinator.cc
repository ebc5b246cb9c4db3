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
#include "common/names.h"
#include "server/scheduler.h"

namespace joule::server {
namespace {

// 64 random bits, hex: a job's identity beyond its id, which a new database reuses.
std::string NewJobUid() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16));
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
                       .Register(r)) {}
  prometheus::Family<prometheus::Gauge>& jobs;
  prometheus::Family<prometheus::Counter>& jobs_finished;
  prometheus::Family<prometheus::Gauge>& workers;
  prometheus::Histogram& queue_wait;
  prometheus::Family<prometheus::Counter>& job_energy;
};

namespace {

// Failures that another attempt would meet again: bad input, bad data, ranks that disagree.
bool IsRetryableCode(absl::StatusCode code) {
  switch (code) {
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

void AddEarlierAttempts(v1::EnergyReport* e, double earlier) {
  e->set_earlier_attempts_joules(earlier);
  e->set_total_joules(e->total_joules() + earlier);
  e->set_kwh(e->total_joules() / 3.6e6);
  e->set_co2_grams(e->kwh() * e->grid_gco2_per_kwh());
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
  // Stop the other ranks, keep the energy already reported, and queue the next attempt.
  StopRanksLocked(job, reason);
  v1::JobResult* result = job.mutable_result();
  double joules = result->energy().earlier_attempts_joules();
  for (const v1::RankResult& r : result->ranks()) {
    for (const v1::EnergyRecord& e : r.energy()) joules += e.joules();
  }
  result->clear_ranks();
  result->add_failed_attempts(absl::StrCat("attempt ", job.attempt(), ": ", reason));
  result->mutable_energy()->set_earlier_attempts_joules(joules);
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_finished_unix_ms(NowUnixMs());  // re-queued at: the queue wait starts here
  job.set_reason(absl::StrCat("attempt ", job.attempt(), " failed (", reason, "); restart ",
                              failed + 1, " of ", job.spec().max_restarts(), " queued"));
  job.clear_worker_ids();
  PersistLocked(job);
  metrics_->jobs_finished.Add({{"state", "restarted"}}).Increment();
  spdlog::warn("job {}: {}", job.id(), job.reason());
  ChangedLocked(active);
}

std::string Coordinator::Scope(int64_t job_id, int32_t attempt) {
  return absl::StrCat("job/", job_id, "/attempt/", attempt);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(options.db_path);
  if (!store.ok()) return store.status();
  absl::StatusOr<std::vector<v1::Job>> unfinished = (*store)->ListUnfinished();
  if (!unfinished.ok()) return unfinished.status();
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options), *std::move(store)));
  std::lock_guard<std::mutex> lock(c->mu_);
  for (v1::Job& job : *unfinished) {
    if (job.state() == v1::JOB_STATE_RUNNING) {
      job.set_state(v1::JOB_STATE_PENDING);
      job.set_reason(absl::StrCat("re-queued: the coordinator restarted during attempt ",
                                  job.attempt()));
      job.clear_worker_ids();
      c->PersistLocked(job);
      spdlog::info("job {}: re-queued after coordinator restart", job.id());
    }
    ++c->active_by_client_[job.submitted_by()];
    c->active_[job.id()].job = std::move(job);
  }
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)),
      store_(std::move(store)),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(std::make_unique<Metrics>(*registry_)) {
  next_worker_seq_ = 1;
  heartbeat_thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      changed_.wait_for(lock, std::chrono::milliseconds(500));
      if (stopping_) break;
      lock.unlock();
      CheckHeartbeats(std::chrono::steady_clock::now());
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
}

void Coordinator::PersistLocked(const v1::Job& job) {
  if (absl::Status s = store_->Update(job); !s.ok()) {
    spdlog::error("job {}: could not persist state {}: {}", job.id(), JobStateName(job.state()),
                  s.ToString());
  }
}

void Coordinator::ChangedLocked(ActiveJob& active) {
  ++active.version;
  changed_.notify_all();
}

absl::StatusOr<int64_t> Coordinator::Submit(v1::JobSpec spec, const std::string& request_id,
                                            bool* existing, const std::string& client) {
  if (absl::Status s = NormalizeAndValidateSpec(spec, options_.limits); !s.ok()) return s;
  for (const std::string& path : UserPaths(spec)) {  // idx:/csv: data, torchscript: models
    if (absl::Status s = CheckUnderRoots(path, options_.data_roots); !s.ok()) return s;
  }
  if (request_id.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id is ", request_id.size(), " bytes, more than 256"));
  }
  v1::Job job;
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_created_unix_ms(NowUnixMs());
  // Request ids are the client's own: the same id from another client is another job.
  const std::string scoped_request_id =
      request_id.empty() ? "" : absl::StrCat(client, "/", request_id);
  job.set_request_id(scoped_request_id);
  job.mutable_progress()->set_test_accuracy(-1);
  job.set_submitted_by(client);
  job.set_uid(NewJobUid());
  std::lock_guard<std::mutex> lock(mu_);
  if (!request_id.empty()) {
    // A retried submit returns the job it made, whatever the limits say now.
    absl::StatusOr<v1::Job> stored = store_->GetByRequestId(scoped_request_id);
    if (stored.ok()) {
      *existing = true;
      return stored->id();
    }
  }
  const int active_for_client = active_by_client_[client];
  if (active_for_client >= options_.max_active_jobs_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "client ", client, " already has ", active_for_client, " jobs pending or running (limit ",
        options_.max_active_jobs_per_client, ")"));
  }
  if (absl::Status s = store_->Insert(&job, existing); !s.ok()) return s;
  if (*existing) return job.id();
  spdlog::info("job {}: submitted ({} on {}, {} {} workers, global batch {})", job.id(),
               job.spec().model(), job.spec().dataset(), job.spec().workers(),
               DeviceKindName(job.spec().device_kind()), job.spec().global_batch_size());
  ++active_by_client_[client];
  ActiveJob& active = active_[job.id()];
  active.job = std::move(job);
  int64_t id = active.job.id();
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
  } else {
    ScheduleLocked();
  }
  ChangedLocked(active);
  return id;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_.find(id);
  if (it != active_.end()) return it->second.job;
  return store_->Get(id);
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request) {
  int limit = request.page_size() <= 0 ? 100 : std::min(request.page_size(), 1000);
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<std::vector<v1::Job>> jobs =
      store_->List(request.state(), request.before_id(), limit);
  if (!jobs.ok()) return jobs.status();
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
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_.find(id);
  if (it != active_.end() && client != "anonymous" && it->second.job.submitted_by() != client) {
    return absl::PermissionDeniedError(absl::StrCat("job ", id, " belongs to client ",
                                                    it->second.job.submitted_by(), ", not ",
                                                    client));
  }
  if (it == active_.end()) {
    absl::StatusOr<v1::Job> job = store_->Get(id);
    if (!job.ok()) return job.status();
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is already ", JobStateName(job->state())));
  }
  v1::Job result;
  if (it->second.job.state() == v1::JOB_STATE_PENDING) {
    v1::Job& job = it->second.job;
    job.set_state(v1::JOB_STATE_CANCELLED);
    job.set_reason("cancelled by user while pending");
    metrics_->jobs_finished.Add({{"state", JobStateName(v1::JOB_STATE_CANCELLED)}}).Increment();
    job.set_finished_unix_ms(NowUnixMs());
    PersistLocked(job);
    result = job;
    ChangedLocked(it->second);
    --active_by_client_[it->second.job.submitted_by()];
    active_.erase(it);
  } else {
    result = EndAttemptLocked(it->second, v1::JOB_STATE_CANCELLED, "cancelled by user");
  }
  spdlog::info("job {}: cancelled", id);
  ScheduleLocked();
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
      absl::StatusOr<v1::Job> stored = store_->Get(id);
      if (!stored.ok()) return stored.status();
      current = *std::move(stored);
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

v1::RegisterWorkerResponse Coordinator::RegisterWorker(const v1::RegisterWorkerRequest& request) {
  static const std::string boot = BootToken();
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = absl::StrCat("w", next_worker_seq_++, ".", boot);
  Worker& w = workers_[id];
  w.info.set_worker_id(id);
  w.info.set_host(request.host().substr(0, 256));
  w.info.set_device_kind(request.device_kind() == v1::DEVICE_KIND_GPU ? v1::DEVICE_KIND_GPU
                                                                       : v1::DEVICE_KIND_CPU);
  w.info.set_cores(request.cores());
  w.info.set_pid(request.pid());
  w.info.set_metrics_address(request.metrics_address().substr(0, 256));
  for (int i = 0; i < std::min(request.energy_sources_size(), 8); ++i) {
    w.info.add_energy_sources(request.energy_sources(i).substr(0, 32));
  }
  w.info.set_state(v1::WORKER_STATE_REGISTERED);
  w.info.set_registered_unix_ms(NowUnixMs());
  w.info.set_last_seen_unix_ms(NowUnixMs());
  w.last_seen = std::chrono::steady_clock::now();
  spdlog::info("worker {} registered: host {}, pid {}, {} {} cores", id, w.info.host(),
               w.info.pid(), w.info.cores(), DeviceKindName(w.info.device_kind()));
  v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_interval_ms(static_cast<int32_t>(options_.heartbeat_interval.count()));
  return response;
}

absl::Status Coordinator::OpenSession(const std::string& worker_id,
                                      std::shared_ptr<SessionSink> sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker \"", worker_id.substr(0, 64),
                                            "\" is not registered; register again"));
  }
  if (it->second.sink) {
    return absl::AlreadyExistsError(
        absl::StrCat("worker \"", worker_id, "\" already has a session"));
  }
  it->second.sink = std::move(sink);
  it->second.info.set_state(v1::WORKER_STATE_IDLE);
  it->second.last_seen = std::chrono::steady_clock::now();
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
  worker.last_seen = std::chrono::steady_clock::now();
  worker.info.set_last_seen_unix_ms(NowUnixMs());
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
  if (worker.info.state() != v1::WORKER_STATE_BUSY || worker.info.job_id() != report.job_id() ||
      worker.attempt != report.attempt()) {
    spdlog::warn("worker {}: ignoring a result for job {} attempt {} it was not running",
                 worker.info.worker_id(), report.job_id(), report.attempt());
    return;
  }
  const int32_t rank = worker.info.rank();
  worker.stop_deadline.reset();
  worker.info.set_state(v1::WORKER_STATE_IDLE);
  worker.info.set_job_id(0);
  worker.info.set_rank(0);
  worker.attempt = 0;

  auto it = active_.find(report.job_id());
  if (it == active_.end()) {
    AddLateResultLocked(rank, worker.info.worker_id(), report);
  } else if (it->second.job.attempt() != report.attempt() ||
             it->second.job.state() != v1::JOB_STATE_RUNNING) {
    // A rank of a failed attempt of a job that will run again: its energy counts.
    v1::EnergyReport* e = it->second.job.mutable_result()->mutable_energy();
    double joules = 0;
    for (const v1::EnergyRecord& rec : report.result().energy()) joules += rec.joules();
    e->set_earlier_attempts_joules(e->earlier_attempts_joules() + joules);
    // The attempt was re-queued on the first error to arrive, often a peer's "connection
    // closed"; if this rank's own error is one no retry gets past, it is the root cause.
    const v1::RankResult& rr = report.result();
    if (!rr.ok() && !rr.cancelled() &&
        !IsRetryable(static_cast<absl::StatusCode>(rr.error_code()))) {
      ActiveJob& active = it->second;
      if (active.job.state() == v1::JOB_STATE_PENDING) {
        active.job.set_state(v1::JOB_STATE_RUNNING);  // ended below like a running attempt
      }
      EndAttemptLocked(active, v1::JOB_STATE_FAILED,
                       absl::StrCat("rank ", rank, " (worker ", worker.info.worker_id(),
                                    ") in attempt ", report.attempt(), ": ", rr.error()));
    }
  } else if (it->second.job.state() == v1::JOB_STATE_RUNNING &&
             it->second.job.attempt() == report.attempt()) {
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
    } else if (job.result().ranks_size() == job.spec().workers()) {
      v1::JobResult* result = job.mutable_result();
      std::sort(result->mutable_ranks()->begin(), result->mutable_ranks()->end(),
                [](const v1::RankResult& a, const v1::RankResult& b) { return a.rank() < b.rank(); });
      const v1::RankResult& r0 = result->ranks(0);
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
      result->set_samples(samples);
      result->set_train_seconds(train_seconds);
      result->set_samples_per_second(train_seconds > 0 ? samples / train_seconds : 0);
      result->set_wall_seconds((NowUnixMs() - job.started_unix_ms()) / 1000.0);
      EndAttemptLocked(active, v1::JOB_STATE_SUCCEEDED, "");
    } else {
      ChangedLocked(active);
    }
  }
  ScheduleLocked();
}

void Coordinator::AddLateResultLocked(int32_t rank, const std::string& worker_id,
                                      const v1::ResultReport& report) {
  // A rank of an attempt that already ended (failed, cancelled) reports: its energy was
  // spent all the same, so it joins the stored report.
  absl::StatusOr<v1::Job> stored = store_->Get(report.job_id());
  if (!stored.ok() || !IsTerminal(stored->state()) || stored->attempt() != report.attempt()) {
    return;
  }
  v1::JobResult* result = stored->mutable_result();
  for (const v1::RankResult& r : result->ranks()) {
    if (r.rank() == rank) return;
  }
  v1::RankResult* r = result->add_ranks();
  *r = report.result();
  r->set_rank(rank);
  r->set_worker_id(worker_id);
  const double before = result->energy().total_joules();
  const double earlier = result->energy().earlier_attempts_joules();
  *result->mutable_energy() =
      BuildEnergyReport(*result, options_.grid_gco2_per_kwh, stored->spec().workers());
  AddEarlierAttempts(result->mutable_energy(), earlier);
  metrics_->job_energy.Add({{"joule_job", std::to_string(stored->id())}})
      .Increment(std::max(0.0, result->energy().total_joules() - before));
  PersistLocked(*stored);
  changed_.notify_all();
}

v1::Job Coordinator::EndAttemptLocked(ActiveJob& active, v1::JobState state,
                                      const std::string& reason) {
  v1::Job& job = active.job;
  job.set_state(state);
  job.set_reason(reason);
  job.set_finished_unix_ms(NowUnixMs());
  v1::JobResult* result = job.mutable_result();
  if (result->wall_seconds() == 0) {
    result->set_wall_seconds((job.finished_unix_ms() - job.started_unix_ms()) / 1000.0);
  }
  // The energy account covers the ranks that reported (all of them on success), plus
  // what earlier attempts spent.
  const double earlier = result->energy().earlier_attempts_joules();
  *result->mutable_energy() =
      BuildEnergyReport(*result, options_.grid_gco2_per_kwh, job.spec().workers());
  AddEarlierAttempts(result->mutable_energy(), earlier);
  metrics_->jobs_finished.Add({{"state", JobStateName(state)}}).Increment();
  metrics_->job_energy.Add({{"joule_job", std::to_string(job.id())}})
      .Increment(result->energy().total_joules());
  StopRanksLocked(job, reason);  // none is busy with it any more after a success
  PersistLocked(job);
  spdlog::info("job {}: attempt {} ended {}{}{}", job.id(), job.attempt(), JobStateName(state),
               reason.empty() ? "" : ": ", reason);
  ChangedLocked(active);
  v1::Job final_job = std::move(job);
  --active_by_client_[final_job.submitted_by()];
  active_.erase(final_job.id());
  return final_job;
}

void Coordinator::LoseWorkerLocked(const std::string& worker_id, const std::string& reason) {
  auto wit = workers_.find(worker_id);
  if (wit == workers_.end()) return;
  Worker worker = std::move(wit->second);
  workers_.erase(wit);
  spdlog::warn("worker {} lost: {}", worker_id, reason);
  if (worker.sink) worker.sink->Close();
  if (worker.info.state() == v1::WORKER_STATE_BUSY) {
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
  if (stopping_) return;
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
  for (const Placement& p : decision.placements) {
    ActiveJob& active = active_.at(p.job_id);
    v1::Job& job = active.job;
    metrics_->queue_wait.Observe(
        (NowUnixMs() - (job.finished_unix_ms() > 0 ? job.finished_unix_ms()
                                                   : job.created_unix_ms())) / 1000.0);
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_attempt(job.attempt() + 1);
    // Created at 0 when the job starts, so increase() sees the energy added at its end.
    metrics_->job_energy.Add({{"joule_job", std::to_string(job.id())}});
    job.set_reason("");
    job.set_started_unix_ms(NowUnixMs());
    job.clear_worker_ids();
    // What earlier attempts leave: why they failed and the energy they spent.
    const auto failed = job.result().failed_attempts();
    const double earlier = job.result().energy().earlier_attempts_joules();
    job.clear_result();
    *job.mutable_result()->mutable_failed_attempts() = failed;
    job.mutable_result()->mutable_energy()->set_earlier_attempts_joules(earlier);
    job.clear_progress();
    job.mutable_progress()->set_test_accuracy(-1);
    for (const std::string& w : p.workers) job.add_worker_ids(w);
    PersistLocked(job);
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

void Coordinator::RefreshMetrics() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<v1::JobState, int> jobs{{v1::JOB_STATE_PENDING, 0}, {v1::JOB_STATE_RUNNING, 0}};
  for (const auto& [id, a] : active_) ++jobs[a.job.state()];
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
  return groups.dump();
}

}  // namespace joule::server
