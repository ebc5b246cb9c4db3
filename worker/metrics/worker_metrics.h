#ifndef JOULE_WORKER_METRICS_WORKER_METRICS_H_
#define JOULE_WORKER_METRICS_WORKER_METRICS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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
// conventions: base units, `_total` counters, identity in `_info`, labels bounded to
// job, rank, device, source, phase and op:
//   joule_energy_joules_total{job,rank,device,source,phase}   counter
//   joule_power_watts{device,source}                          gauge, this worker's share
//   joule_device_info{device,uuid,name,source}                gauge = 1
//   joule_gpu_utilization_ratio{device}, joule_power_limit_watts{device}  gauges (NVML)
//   joule_samples_total{job,rank}, joule_steps_total{job,rank}            counters
//   joule_step_duration_seconds{job,rank}                     histogram
//   joule_collective_duration_seconds{job,rank,op}            histogram
//   joule_collective_bytes_total{job,rank,op}                 counter
//   joule_loss{job,rank}                                      gauge
// Thread-safe: the training thread records steps and collectives, the meter's thread
// energy; prometheus-cpp's metrics are atomic.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(std::shared_ptr<prometheus::Registry> registry);
  ~WorkerMetrics();

  void SetDevices(const std::vector<EnergyChannel>& channels);
  void OnEnergy(const EnergySample& sample);
  // Binds the step and collective series to a job; call before OnStep/OnCollective.
  void BindJob(const std::string& job, const std::string& rank);
  // One optimizer step of `samples` local samples that took `seconds` (wall).
  void OnStep(int64_t samples, double seconds, double loss);
  void OnCollective(const std::string& op, int64_t bytes, double seconds);

 private:
  struct Families;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
  std::mutex mu_;  // guards the bound series pointers
  std::string job_, rank_;
  prometheus::Counter* samples_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Histogram* step_seconds_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_METRICS_WORKER_METRICS_H_
