#include "worker/agent/attempt_runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "worker/agent/job_log.h"
#include "worker/train/trainer.h"

namespace joule::worker {

QuietEnergyReports::QuietEnergyReports(std::function<void()> report,
                                       std::chrono::milliseconds period)
    : report_(std::move(report)), period_(period), last_(std::chrono::steady_clock::now()) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (cv_.wait_until(lock, last_ + period_, [this] { return stopping_; })) break;
      const auto now = std::chrono::steady_clock::now();
      if (now < last_ + period_) continue;  // heard meanwhile
      last_ = now;
      lock.unlock();
      report_();
      lock.lock();
    }
  });
}

QuietEnergyReports::~QuietEnergyReports() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void QuietEnergyReports::Heard() {
  std::lock_guard<std::mutex> lock(mu_);
  last_ = std::chrono::steady_clock::now();
}

AttemptRunner::AttemptRunner(AttemptRunnerOptions options, EnergyMeter* meter,
                             WorkerMetrics* metrics, PhaseClock* phases, AttemptOutbox* outbox,
                             KvFactory kv)
    : options_(std::move(options)),
      meter_(meter),
      metrics_(metrics),
      phases_(phases),
      outbox_(outbox),
      kv_(std::move(kv)) {
  (void)ProcessJobLog();  // installed before the attempt's thread logs
}

AttemptRunner::~AttemptRunner() {
  Cancel();
  Join();
}

absl::Status AttemptRunner::Start(const v1::Assignment& assignment,
                                  std::vector<std::string> data_roots) {
  std::lock_guard<std::mutex> lock(start_mu_);
  if (active_) {
    return absl::FailedPreconditionError(
        absl::StrCat("still busy with job ", job_id_.load(), " attempt ", attempt_.load()));
  }
  if (thread_.joinable()) thread_.join();  // its result is handed over: it is ending
  job_id_ = assignment.job_id();
  attempt_ = assignment.attempt();
  budgeted_ = assignment.spec().energy_budget_joules() > 0;
  cancel_ = false;
  stop_requested_ = false;
  active_ = true;
  thread_ = std::thread(&AttemptRunner::Train, this, assignment, std::move(data_roots));
  return absl::OkStatus();
}

bool AttemptRunner::Apply(const v1::CancelAttempt& c) {
  if (!active_ || c.job_id() != job_id_ || c.attempt() != attempt_) return false;
  // The coordinator asks for a checkpoint only once a rank has reported a step (before
  // then it stops every rank at once: there is nothing new to checkpoint).
  if (c.checkpoint() && budgeted_) {
    spdlog::info("job {} attempt {}: asked to stop after a checkpoint: {}", c.job_id(),
                 c.attempt(), c.reason());
    stop_requested_ = true;
  } else {
    spdlog::info("job {} attempt {}: cancelled by the coordinator: {}", c.job_id(), c.attempt(),
                 c.reason());
    Cancel();
  }
  return true;
}

void AttemptRunner::Cancel() {
  cancel_ = true;
  // Leave a collective a peer will never join now, instead of waiting for its timeout.
  std::lock_guard<std::mutex> lock(pg_mu_);
  if (process_group_) process_group_->Abort();
}

void AttemptRunner::Join() {
  std::lock_guard<std::mutex> lock(start_mu_);
  if (!thread_.joinable()) return;
  const auto grace = options_.collective_timeout + std::chrono::seconds(30);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (active_ && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (active_) {
    spdlog::critical("job {} attempt {}: the training thread did not stop within {} ms of "
                     "being cancelled; exiting",
                     job_id_.load(), attempt_.load(),
                     std::chrono::duration_cast<std::chrono::milliseconds>(grace).count());
    std::_Exit(3);
  }
  thread_.join();
}

TrainHooks AttemptRunner::MakeHooks(const v1::Assignment& a, KvClient& kv) {
  TrainHooks hooks;
  hooks.phases = phases_;
  hooks.on_step = [this](int64_t samples, double seconds, double loss) {
    metrics_->OnStep(samples, seconds, loss);
  };
  hooks.on_collective = [this](const char* op, int64_t bytes, double seconds) {
    metrics_->OnCollective(op, bytes, seconds);
  };
  hooks.connect = [&]() -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
    ConnectOptions connect;
    connect.transport = options_.transport;
    connect.gpu = a.spec().device_kind() == v1::DEVICE_KIND_GPU;
    connect.cuda_device = options_.cuda_device;
    connect.gloo.hostname = options_.gloo_hostname;
    connect.gloo.timeout = options_.collective_timeout;
    Transport chosen = Transport::kGloo;
    auto pg = ConnectProcessGroup(a.rank(), a.world_size(), kv, connect, &chosen);
    if (!pg.ok()) return pg.status();
    spdlog::info("job {} attempt {}: rank {} connected over {}", a.job_id(), a.attempt(),
                 a.rank(), TransportName(chosen));
    std::shared_ptr<ProcessGroup> shared(*std::move(pg));
    std::lock_guard<std::mutex> lock(pg_mu_);
    transport_ = TransportName(chosen);
    process_group_ = shared;
    if (cancel_) shared->Abort();  // cancelled while connecting
    return shared;
  };
  hooks.allgather = [&](const std::string& value) {
    return KvAllgather(kv, "allgather", a.rank(), a.world_size(), value,
                       options_.collective_timeout);
  };
  hooks.cancelled = [this] { return cancel_.load(); };
  hooks.stop_requested = [this] { return stop_requested_.load(); };
  hooks.energy_joules = [this] {
    if (meter_ == nullptr) return 0.0;
    meter_->Sample();  // an epoch's end: charge the interval up to now
    return meter_->JobTotals().total_joules;
  };
  hooks.on_progress = [&](const v1::RankProgress& p) {
    metrics_->OnProgress(p.epoch(), p.test_accuracy());
    v1::WorkerMessage m;
    v1::ProgressReport* report = m.mutable_progress();
    report->set_job_id(a.job_id());
    report->set_attempt(a.attempt());
    report->set_rank(a.rank());
    v1::RankProgress* progress = report->mutable_progress();
    *progress = p;
    {
      std::lock_guard<std::mutex> lock(pg_mu_);
      progress->set_transport(transport_);
    }
    if (meter_ != nullptr) {
      JobEnergy e = meter_->JobTotals();
      progress->set_energy_joules(e.total_joules);
      progress->set_power_watts(e.watts);
      progress->set_energy_estimated(e.estimated);
      power_.Add(p.elapsed_seconds(), e.total_joules);
    }
    if (quiet_ != nullptr) quiet_->Heard();
    outbox_->SendProgress(m);
  };
  return hooks;
}

void AttemptRunner::Train(v1::Assignment a, std::vector<std::string> data_roots) {
  ProcessJobLog().Bind(a.job_id(), a.attempt());  // what it logs from here is the job's
  spdlog::info("job {} attempt {}: rank {} of {}: {} on {}, local batch {}", a.job_id(),
               a.attempt(), a.rank(), a.world_size(), a.spec().model(), a.spec().dataset(),
               a.spec().local_batch_size());
  const std::string job = std::to_string(a.job_id()), rank = std::to_string(a.rank());
  if (meter_ != nullptr) meter_->BeginJob(job, rank);
  metrics_->BindJob(job, rank);
  std::unique_ptr<KvClient> kv = kv_(a);
  power_ = PowerSeries(kMaxPowerSamples);
  {
    std::lock_guard<std::mutex> lock(pg_mu_);
    transport_.clear();
  }
  const Clock::TimePoint attempt_start = options_.clock->Now();
  TrainHooks hooks = MakeHooks(a, *kv);
  // Files a job names are opened beneath this worker's own roots, or else beneath the
  // coordinator's: a path swapped after submit cannot lead outside them.
  TrainerOptions trainer = options_.trainer;
  trainer.clock = options_.clock;  // the meter and the trainer time alike
  if (trainer.allowed_roots.empty()) trainer.allowed_roots = std::move(data_roots);
  if (meter_ != nullptr) {
    // The trainer's period, at least a second (a test's fast progress is no reason to
    // report quiet time more often).
    const auto period = std::chrono::milliseconds(
        std::max<int64_t>(1000, std::llround(1000 * trainer.progress_period_seconds)));
    quiet_ = std::make_unique<QuietEnergyReports>(
        [this, &a, attempt_start] {
          const JobEnergy e = meter_->JobTotals();
          v1::WorkerMessage m;
          v1::ProgressReport* report = m.mutable_progress();
          report->set_job_id(a.job_id());
          report->set_attempt(a.attempt());
          report->set_rank(a.rank());
          report->set_energy_only(true);
          v1::RankProgress* p = report->mutable_progress();
          p->set_elapsed_seconds(Seconds(options_.clock->Now() - attempt_start));
          p->set_energy_joules(e.total_joules);
          p->set_power_watts(e.watts);
          p->set_energy_estimated(e.estimated);
          outbox_->SendProgress(m);
        },
        period);
  }
  v1::RankResult result = RunTraining(a, trainer, hooks);
  quiet_.reset();  // before the result: no report of the attempt may follow it
  {
    std::lock_guard<std::mutex> lock(pg_mu_);
    process_group_.reset();
  }
  phases_->Enter(Phase::kIdle);
  metrics_->EndJob();
  if (!result.ok() && cancel_) result.set_cancelled(true);
  result.set_devices(1);
  result.set_rank(a.rank());  // names the rank when it is delivered late
  if (meter_ != nullptr) {
    JobEnergy e = meter_->EndJob();
    for (const EnergyEntry& entry : e.entries) {
      v1::EnergyRecord* r = result.add_energy();
      r->set_rank(a.rank());
      r->set_device(entry.device);
      r->set_source(entry.source);
      r->set_phase(entry.phase);
      r->set_joules(entry.joules);
    }
    for (const std::string& w : e.warnings) result.add_energy_warnings(w);
    for (const auto& [pair, joules] : e.cross_checks) {
      v1::EnergyCrossCheck* c = result.add_cross_checks();
      c->set_source(pair.first);
      c->set_joules(joules.first);
      c->set_reference_source(pair.second);
      c->set_reference_joules(joules.second);
    }
    if (e.node_joules > 0) {
      result.set_node_joules(e.node_joules);
      result.set_node_component_joules(e.node_component_joules);
      result.set_node_source(e.node_source);
      result.set_node_split(e.node_split);
    }
    power_.Add(Seconds(options_.clock->Now() - attempt_start), e.total_joules);
    for (const v1::PowerSample& p : power_.samples()) *result.add_power() = p;
  }
  if (result.ok()) {
    spdlog::info("job {} attempt {}: rank {} done: accuracy {:.4f}, {} samples in {:.2f} s",
                 a.job_id(), a.attempt(), a.rank(), result.test_accuracy(), result.samples(),
                 result.train_seconds());
  } else {
    spdlog::warn("job {} attempt {}: rank {} ended: {}", a.job_id(), a.attempt(), a.rank(),
                 result.error());
  }
  ProcessJobLog().Unbind();
  outbox_->FlushLog();
  v1::WorkerMessage m;
  m.mutable_result()->set_job_id(a.job_id());
  m.mutable_result()->set_attempt(a.attempt());
  m.mutable_result()->set_job_uid(a.job_uid());
  *m.mutable_result()->mutable_result() = std::move(result);
  // Idle before the coordinator hears of it: it may assign the next job at once, and
  // Start joins this thread before starting that one.
  active_ = false;
  outbox_->SendResult(std::move(m));
}

}  // namespace joule::worker
