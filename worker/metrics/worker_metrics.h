#ifndef JOULE_WORKER_METRICS_WORKER_METRICS_H_
#define JOULE_WORKER_METRICS_WORKER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"
#include "worker/energy/energy_meter.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace joule::worker {

// The worker's Prometheus metrics (prometheus-cpp), following Prometheus's naming
// conventions: base units, `_total` counters, identity in `_info`, bounded labels. The
// Joule job and rank are `joule_job` and `joule_rank`: `job` is the label Prometheus
// gives every target (the scrape job), and reusing it would need honor_labels.
//   joule_energy_joules_total{joule_job,joule_rank,device,source,phase}  counter
//   joule_power_watts{device,source}                          gauge, this worker's share
//   joule_device_info{device,uuid,name,source}                gauge = 1
//   joule_blas_info{library,core,fallback}                    gauge = 1 (SetBlas)
//   joule_gpu_utilization_ratio{device}, joule_power_limit_watts{device}  gauges (NVML)
//   joule_samples_total{joule_job,joule_rank}, joule_steps_total{...}     counters
//   joule_step_duration_seconds{joule_job,joule_rank}         histogram
//   joule_collective_duration_seconds{joule_job,joule_rank,op}  histogram
//   joule_collective_bytes_total{joule_job,joule_rank,op}     counter
//   joule_loss{joule_job,joule_rank}                          gauge
//   joule_energy_cross_check_joules_total{source,reference,side}  counter (no job labels:
//     the meters' agreement over the worker's life; side "source" or "reference")
// Energy before and between jobs carries joule_job="" (no label). A job's counters,
// histograms and its last test accuracy live until the job after next is bound: the last
// finished job stays for a final scrape, and a long-lived worker does not accumulate series
// without bound. The gauges of a job in training (joule_loss, joule_epoch) go when it ends
// (EndJob): a gauge that outlives its job reads as a job still training.
// Thread-safe: the training thread records steps and collectives, the meter's thread
// energy; prometheus-cpp's metrics are atomic.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(std::shared_ptr<prometheus::Registry> registry);
  ~WorkerMetrics();

  void SetDevices(const std::vector<EnergyChannel>& channels);
  // The BLAS its CPU GEMMs run on (worker/blas): one joule_blas_info series, value 1;
  // `fallback` "true" where the kernel is narrower than the CPU's vectors.
  void SetBlas(const v1::BlasInfo& blas);
  void OnEnergy(const EnergySample& sample);
  // Binds the step and collective series to a job; call before OnStep/OnCollective.
  void BindJob(const std::string& job, const std::string& rank);
  // One optimizer step of `samples` local samples that took `seconds` (wall).
  void OnStep(int64_t samples, double seconds, double loss);
  void OnCollective(const std::string& op, int64_t bytes, double seconds);
  // A progress report of the bound job: the epoch (1-based) being trained and the test
  // accuracy (0..1) after the last finished epoch, -1 before the first evaluation.
  void OnProgress(int epoch, double test_accuracy);
  // The bound job's attempt ended on this worker: its loss and epoch gauges are removed and
  // later OnStep/OnCollective/OnProgress calls record nothing until the next BindJob.
  void EndJob();

 private:
  struct Families;
  struct JobSeries;
  JobSeries& SeriesLocked(const std::string& job);
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
  std::mutex mu_;  // guards the bound series pointers and the per-job series
  std::string job_, rank_;
  std::string previous_job_;
  std::map<std::string, std::unique_ptr<JobSeries>> series_;
  std::vector<prometheus::Gauge*> source_states_;  // joule_energy_source_info's series now
  prometheus::Histogram* allreduce_seconds_ = nullptr;
  prometheus::Counter* allreduce_bytes_ = nullptr;
  prometheus::Counter* samples_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Histogram* step_seconds_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_METRICS_WORKER_METRICS_H_
