#ifndef JOULE_SERVER_COORDINATOR_METRICS_H_
#define JOULE_SERVER_COORDINATOR_METRICS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace prometheus {
class Gauge;
class Registry;
template <typename T>
class Family;
class Counter;
class Histogram;
}  // namespace prometheus

namespace joule::server {

// The coordinator's /metrics: jobs by state, workers by state and device kind, queue
// wait, energy per job, joule_build_info and joule_job_info (to name joule_job in
// dashboards). Job series (energy, info) are kept for jobs pending or running and for the
// `finished_jobs_kept` jobs that ended last, then removed: cardinality stays bounded
// whatever the coordinator's uptime (Prometheus's guidance on labels).
//
// Thread-safe (prometheus-cpp's metrics are; the bookkeeping has its own mutex).
// joule_build_info{version,program="joule-coordinator",api} = 1, in `registry`.
void AddCoordinatorBuildInfo(prometheus::Registry& registry, std::string version);

// Whether this coordinator leads, as etcd's etcd_server_is_leader says it: gauges
// joule_coordinator_leading (1 while it serves, 0 while it stands by; a coordinator without
// standbys always leads) and joule_coordinator_lease_epoch (the epoch it leads in, or the
// leader's epoch a standby knows of; 0 without standby coordinators). Alert when
// sum(joule_coordinator_leading) is 0 (nobody leads) or above 1 (the store's lease
// prevents it). Both registered in `registry`; the gauges live as long as it.
struct LeadershipGauges {
  prometheus::Gauge* leading = nullptr;
  prometheus::Gauge* lease_epoch = nullptr;
};
LeadershipGauges AddLeadershipMetrics(prometheus::Registry& registry);

class CoordinatorMetrics {
 public:
  // `lease_epoch`: the epoch this coordinator leads in (standby coordinators), 0 without.
  CoordinatorMetrics(std::string version, int finished_jobs_kept, int64_t lease_epoch = 0);
  ~CoordinatorMetrics();
  std::shared_ptr<prometheus::Registry> registry() { return registry_; }

  // joule_job_info{joule_job,name,model,dataset,device_kind,workers,submitted_by} = 1.
  void SetJobInfo(const v1::Job& job);
  // An attempt of job `id` starts: its energy series exists from 0 (so increase() sees
  // the energy added at its end), the queue wait is observed, and
  // joule_job_running{joule_job} is 1 until the attempt ends.
  void AttemptStarted(int64_t id, double queue_wait_seconds);
  // An attempt a coordinator found running at start and keeps (no queue wait to observe).
  void AttemptAdopted(int64_t id);
  // Adds energy to `job`'s series if it still exists (never re-creates a removed one), and
  // to joule_usage_energy_joules_total{user, device_kind} (its submitter's, kept for good:
  // users and device kinds are few, unlike jobs).
  void AddJobEnergy(const v1::Job& job, double joules);
  // An attempt of job `id` ended in `state` ("restarted" for one that is re-queued):
  // counted, and its joule_job_running series removed.
  void AttemptEnded(int64_t id, const std::string& state);
  // A budgeted job's joule_job_energy_budget_joules{joule_job} and
  // joule_job_energy_budget_used_ratio{joule_job} (its energy so far over the budget,
  // 0..1 and above), updated with each progress report; kept and removed with its
  // energy series.
  void SetBudgetUse(int64_t id, double budget_joules, double used_ratio);
  // `job` ended: its series are kept among the finished_jobs_kept newest, then removed.
  // Counted in joule_usage_jobs_total{user, device_kind, state}, and its device-hours (its
  // report's, every attempt) in joule_usage_device_hours_total{user, device_kind}: `joule
  // usage`'s figures as counters, for dashboards and alerts per user.
  // With an intensity source (Job.carbon set), also its CO2 over its run in
  // joule_usage_co2_grams_total{user, device_kind}, and for a carbon-aware job what it
  // emitted less than at its submit time's intensity in
  // joule_usage_co2_saved_grams_total{user, device_kind} (nothing where it emitted more:
  // a counter only rises).
  void JobEnded(const v1::Job& job);
  // The grid's intensity now in `region` from the coordinator's --carbon-intensity
  // source, joule_grid_carbon_intensity_gco2_per_kwh{region}; none (removed) where it has
  // no figure.
  void SetGridIntensity(const std::string& region, std::optional<double> gco2_per_kwh);
  // Heartbeat datagrams over UDP: joule_coordinator_liveness_datagrams_total{outcome}
  // "taken" (a beat of a worker in session) or "refused" (forged, replayed, of no worker
  // in session, malformed or oversized).
  void LivenessDatagrams(uint64_t taken, uint64_t refused);
  // Gauges of jobs and workers, set from the counts given (every state/kind pair is set,
  // 0 when absent).
  void SetCounts(const std::map<v1::JobState, int>& jobs,
                 const std::vector<v1::WorkerInfo>& workers);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Counter>& jobs_finished_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Histogram& queue_wait_;
  prometheus::Family<prometheus::Counter>& job_energy_;
  prometheus::Family<prometheus::Counter>& job_co2_;  // joule_job_co2_grams_total
  prometheus::Family<prometheus::Gauge>& job_info_;
  prometheus::Family<prometheus::Gauge>& job_running_;
  prometheus::Family<prometheus::Gauge>& job_budget_;
  prometheus::Family<prometheus::Gauge>& job_budget_used_;
  prometheus::Family<prometheus::Counter>& usage_joules_;
  prometheus::Family<prometheus::Counter>& usage_jobs_;
  prometheus::Family<prometheus::Counter>& usage_device_hours_;
  prometheus::Family<prometheus::Counter>& usage_co2_;
  prometheus::Family<prometheus::Counter>& usage_co2_saved_;
  prometheus::Family<prometheus::Gauge>& grid_intensity_;
  prometheus::Counter* liveness_taken_ = nullptr;
  prometheus::Counter* liveness_refused_ = nullptr;
  const int finished_jobs_kept_;
  std::mutex mu_;
  std::deque<int64_t> finished_;                    // ended jobs whose series are kept
  std::map<int64_t, prometheus::Gauge*> info_;      // joule_job_info series by job
};

}  // namespace joule::server

#endif  // JOULE_SERVER_COORDINATOR_METRICS_H_
