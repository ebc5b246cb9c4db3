#include "server/coordinator_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>

#include "common/names.h"
#include "common/text.h"

namespace joule::server {
namespace {

prometheus::Labels JobLabel(int64_t id) { return {{"joule_job", std::to_string(id)}}; }

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(std::string version, int finished_jobs_kept,
                                       int64_t lease_epoch)
    : registry_(std::make_shared<prometheus::Registry>()),
      jobs_(prometheus::BuildGauge()
                .Name("joule_jobs")
                .Help("Jobs pending or running now")
                .Register(*registry_)),
      jobs_finished_(prometheus::BuildCounter()
                         .Name("joule_jobs_finished_total")
                         .Help("Job attempts that ended, by final state")
                         .Register(*registry_)),
      workers_(prometheus::BuildGauge()
                   .Name("joule_workers")
                   .Help("Registered workers by state and device kind")
                   .Register(*registry_)),
      queue_wait_(prometheus::BuildHistogram()
                      .Name("joule_job_queue_wait_seconds")
                      .Help("Time from submit (or re-queue) to the start of an attempt")
                      .Register(*registry_)
                      .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.5, 1, 5, 10, 30, 60,
                                                                       300, 900, 3600, 14400})),
      job_energy_(prometheus::BuildCounter()
                      .Name("joule_job_energy_joules_total")
                      .Help("Energy of job attempts, summed over ranks, added when they end")
                      .Register(*registry_)),
      job_co2_(prometheus::BuildCounter()
                   .Name("joule_job_co2_grams_total")
                   .Help("A job's CO2 at the grid's intensity over its run (each rank's energy "
                         "at its region's intensity then; the coordinator's "
                         "--carbon-intensity sources), grams, added when it ends")
                   .Register(*registry_)),
      job_info_(prometheus::BuildGauge()
                    .Name("joule_job_info")
                    .Help("Always 1: a job's identity, to name joule_job in dashboards")
                    .Register(*registry_)),
      job_running_(prometheus::BuildGauge()
                       .Name("joule_job_running")
                       .Help("1 while an attempt of the job runs; absent otherwise")
                       .Register(*registry_)),
      job_budget_(prometheus::BuildGauge()
                      .Name("joule_job_energy_budget_joules")
                      .Help("A job's energy budget (spec energy_budget_joules), joules")
                      .Register(*registry_)),
      job_budget_used_(prometheus::BuildGauge()
                           .Name("joule_job_energy_budget_used_ratio")
                           .Help("A budgeted job's energy so far over its budget, every rank "
                                 "and attempt; 1 stops it")
                           .Register(*registry_)),
      usage_joules_(prometheus::BuildCounter()
                        .Name("joule_usage_energy_joules_total")
                        .Help("Energy of jobs by submitter and device kind, joules, added as "
                              "attempts end and late ranks report (every source)")
                        .Register(*registry_)),
      usage_jobs_(prometheus::BuildCounter()
                      .Name("joule_usage_jobs_total")
                      .Help("Jobs ended, by submitter, device kind and final state")
                      .Register(*registry_)),
      usage_device_hours_(prometheus::BuildCounter()
                              .Name("joule_usage_device_hours_total")
                              .Help("Device-hours of ended jobs (every attempt), by submitter "
                                    "and device kind")
                              .Register(*registry_)),
      usage_co2_(prometheus::BuildCounter()
                     .Name("joule_usage_co2_grams_total")
                     .Help("CO2 of ended jobs over their run at the grid's intensity then "
                           "(the coordinator's --carbon-intensity source), grams, by "
                           "submitter and device kind")
                     .Register(*registry_)),
      usage_co2_saved_(prometheus::BuildCounter()
                           .Name("joule_usage_co2_saved_grams_total")
                           .Help("What carbon-aware jobs emitted less than they would have at "
                                 "their submit time's intensity, grams, by submitter and "
                                 "device kind")
                           .Register(*registry_)),
      grid_intensity_(prometheus::BuildGauge()
                          .Name("joule_grid_carbon_intensity_gco2_per_kwh")
                          .Help("The grid's carbon intensity now from the coordinator's "
                                "--carbon-intensity source, gCO2/kWh, by region")
                          .Register(*registry_)),
      finished_jobs_kept_(std::max(0, finished_jobs_kept)) {
  auto& liveness = prometheus::BuildCounter()
                       .Name("joule_coordinator_liveness_datagrams_total")
                       .Help(
                           "Heartbeat datagrams over UDP, by outcome: taken, or refused "
                           "(forged, replayed, malformed, oversized, or of no worker in a "
                           "session)")
                       .Register(*registry_);
  liveness_taken_ = &liveness.Add({{"outcome", "taken"}});
  liveness_refused_ = &liveness.Add({{"outcome", "refused"}});
  AddCoordinatorBuildInfo(*registry_, std::move(version));
  LeadershipGauges leadership = AddLeadershipMetrics(*registry_);
  leadership.leading->Set(1);
  leadership.lease_epoch->Set(static_cast<double>(lease_epoch));
}

void CoordinatorMetrics::LivenessDatagrams(uint64_t taken, uint64_t refused) {
  if (taken > 0) liveness_taken_->Increment(static_cast<double>(taken));
  if (refused > 0) liveness_refused_->Increment(static_cast<double>(refused));
}

void AddCoordinatorBuildInfo(prometheus::Registry& registry, std::string version) {
  prometheus::BuildGauge()
      .Name("joule_build_info")
      .Help("The coordinator's build: version and protocol")
      .Register(registry)
      .Add({{"version", std::move(version)}, {"program", "joule-coordinator"}, {"api", "joule.v1"}})
      .Set(1);
}

LeadershipGauges AddLeadershipMetrics(prometheus::Registry& registry) {
  LeadershipGauges g;
  g.leading = &prometheus::BuildGauge()
                   .Name("joule_coordinator_leading")
                   .Help("1 while this coordinator leads and serves, 0 while it stands by")
                   .Register(registry)
                   .Add({});
  g.lease_epoch = &prometheus::BuildGauge()
                       .Name("joule_coordinator_lease_epoch")
                       .Help(
                           "The epoch (fencing token) of the leadership this coordinator "
                           "serves, or of the leader a standby knows of; 0 without standbys")
                       .Register(registry)
                       .Add({});
  return g;
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

void CoordinatorMetrics::SetJobInfo(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (info_.count(job.id())) return;
  prometheus::Gauge& g =
      job_info_.Add({{"joule_job", std::to_string(job.id())},
                     {"name", SanitizeUtf8(job.spec().name(), 128)},
                     {"model", SanitizeUtf8(job.spec().model(), 128)},
                     {"dataset", SanitizeUtf8(job.spec().dataset(), 128)},
                     {"device_kind", DeviceKindName(job.spec().device_kind())},
                     {"workers", std::to_string(job.spec().workers())},
                     {"submitted_by", SanitizeUtf8(job.submitted_by(), 128)}});
  g.Set(1);
  info_[job.id()] = &g;
}

void CoordinatorMetrics::AttemptStarted(int64_t id, double queue_wait_seconds) {
  queue_wait_.Observe(queue_wait_seconds);
  job_energy_.Add(JobLabel(id));
  job_running_.Add(JobLabel(id)).Set(1);
}

void CoordinatorMetrics::AttemptAdopted(int64_t id) {
  job_energy_.Add(JobLabel(id));
  job_running_.Add(JobLabel(id)).Set(1);
}

namespace {
prometheus::Labels UsageLabels(const v1::Job& job) {
  return {{"user", job.submitted_by().empty() ? "anonymous" : job.submitted_by()},
          {"device_kind", DeviceKindName(job.spec().device_kind())}};
}
}  // namespace

void CoordinatorMetrics::AddJobEnergy(const v1::Job& job, double joules) {
  if (joules <= 0) return;
  usage_joules_.Add(UsageLabels(job)).Increment(joules);
  std::lock_guard<std::mutex> lock(mu_);  // not while JobEnded removes the series
  const prometheus::Labels labels = JobLabel(job.id());
  if (job_energy_.Has(labels)) job_energy_.Add(labels).Increment(joules);
}

void CoordinatorMetrics::AttemptEnded(int64_t id, const std::string& state) {
  jobs_finished_.Add({{"state", state}}).Increment();
  if (job_running_.Has(JobLabel(id))) job_running_.Remove(&job_running_.Add(JobLabel(id)));
}

void CoordinatorMetrics::SetBudgetUse(int64_t id, double budget_joules, double used_ratio) {
  std::lock_guard<std::mutex> lock(mu_);
  // An ended job's share still changes as late ranks report, while its series are kept.
  if (std::find(finished_.begin(), finished_.end(), id) != finished_.end() &&
      !job_budget_used_.Has(JobLabel(id))) {
    return;
  }
  job_budget_.Add(JobLabel(id)).Set(budget_joules);
  job_budget_used_.Add(JobLabel(id)).Set(used_ratio);
}

void CoordinatorMetrics::JobEnded(const v1::Job& job) {
  prometheus::Labels labels = UsageLabels(job);
  usage_device_hours_.Add(labels).Increment(std::max(0.0, job.result().energy().device_hours()));
  if (const v1::CarbonAccount& c = job.carbon(); !c.source().empty()) {
    usage_co2_.Add(labels).Increment(std::max(0.0, c.grams()));
    job_co2_.Add(JobLabel(job.id())).Increment(std::max(0.0, c.grams()));
    // A counter only rises: a job that emitted more than at submit adds nothing here.
    if (job.spec().carbon_aware() && c.grams_at_submit() > c.grams()) {
      usage_co2_saved_.Add(labels).Increment(c.grams_at_submit() - c.grams());
    }
  }
  labels["state"] = JobStateName(job.state());
  usage_jobs_.Add(labels).Increment();
  std::lock_guard<std::mutex> lock(mu_);
  finished_.push_back(job.id());
  while (static_cast<int>(finished_.size()) > finished_jobs_kept_) {
    const int64_t old = finished_.front();
    finished_.pop_front();
    if (job_energy_.Has(JobLabel(old))) job_energy_.Remove(&job_energy_.Add(JobLabel(old)));
    for (auto* family : {&job_budget_, &job_budget_used_}) {
      if (family->Has(JobLabel(old))) family->Remove(&family->Add(JobLabel(old)));
    }
    if (job_co2_.Has(JobLabel(old))) job_co2_.Remove(&job_co2_.Add(JobLabel(old)));
    if (auto g = info_.find(old); g != info_.end()) {
      job_info_.Remove(g->second);
      info_.erase(g);
    }
  }
}

void CoordinatorMetrics::SetGridIntensity(const std::string& region,
                                          std::optional<double> gco2_per_kwh) {
  const prometheus::Labels labels{{"region", region}};
  if (gco2_per_kwh) {
    grid_intensity_.Add(labels).Set(*gco2_per_kwh);
  } else if (grid_intensity_.Has(labels)) {
    grid_intensity_.Remove(&grid_intensity_.Add(labels));
  }
}

void CoordinatorMetrics::SetCounts(const std::map<v1::JobState, int>& jobs,
                                   const std::vector<v1::WorkerInfo>& workers) {
  for (auto state : {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING}) {
    auto it = jobs.find(state);
    jobs_.Add({{"state", JobStateName(state)}}).Set(it == jobs.end() ? 0 : it->second);
  }
  std::map<std::pair<std::string, std::string>, int> counts;
  for (auto kind : {v1::DEVICE_KIND_CPU, v1::DEVICE_KIND_GPU}) {
    for (auto st : {v1::WORKER_STATE_IDLE, v1::WORKER_STATE_BUSY, v1::WORKER_STATE_REGISTERED}) {
      counts[{WorkerStateName(st), DeviceKindName(kind)}] = 0;
    }
  }
  for (const v1::WorkerInfo& w : workers) {
    ++counts[{WorkerStateName(w.state()), DeviceKindName(w.device_kind())}];
  }
  for (const auto& [key, n] : counts) {
    workers_.Add({{"state", key.first}, {"device_kind", key.second}}).Set(n);
  }
}

}  // namespace joule::server
