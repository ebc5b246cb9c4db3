#include "worker/metrics/worker_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace joule::worker {

namespace p = prometheus;

namespace {

// 0.5 ms .. ~16 s, doubling: covers a logreg step on one core to a ResNet step.
p::Histogram::BucketBoundaries TimeBuckets() {
  p::Histogram::BucketBoundaries b;
  for (double v = 0.0005; v < 20; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

struct WorkerMetrics::Families {
  explicit Families(p::Registry& r)
      : energy(p::BuildCounter()
                   .Name("joule_energy_joules_total")
                   .Help("Energy charged to this worker, by job, rank, device, source and phase")
                   .Register(r)),
        power(p::BuildGauge()
                  .Name("joule_power_watts")
                  .Help("Power charged to this worker over the last sampling interval")
                  .Register(r)),
        device_info(p::BuildGauge()
                        .Name("joule_device_info")
                        .Help("Devices this worker meters (value 1)")
                        .Register(r)),
        utilization(p::BuildGauge()
                        .Name("joule_gpu_utilization_ratio")
                        .Help("GPU busy fraction over NVML's last sample period")
                        .Register(r)),
        power_limit(p::BuildGauge()
                        .Name("joule_power_limit_watts")
                        .Help("Enforced power limit of the device")
                        .Register(r)),
        samples(p::BuildCounter()
                    .Name("joule_samples_total")
                    .Help("Training samples processed by this rank")
                    .Register(r)),
        steps(p::BuildCounter()
                  .Name("joule_steps_total")
                  .Help("Optimizer steps taken by this rank")
                  .Register(r)),
        step_seconds(p::BuildHistogram()
                         .Name("joule_step_duration_seconds")
                         .Help("Wall time of one training step")
                         .Register(r)),
        collective_seconds(p::BuildHistogram()
                               .Name("joule_collective_duration_seconds")
                               .Help("Wall time of one collective")
                               .Register(r)),
        collective_bytes(p::BuildCounter()
                             .Name("joule_collective_bytes_total")
                             .Help("Bytes of this rank's buffers reduced or broadcast")
                             .Register(r)),
        loss(p::BuildGauge()
                 .Name("joule_loss")
                 .Help("Training loss of this rank's last step")
                 .Register(r)) {}
  p::Family<p::Counter>& energy;
  p::Family<p::Gauge>& power;
  p::Family<p::Gauge>& device_info;
  p::Family<p::Gauge>& utilization;
  p::Family<p::Gauge>& power_limit;
  p::Family<p::Counter>& samples;
  p::Family<p::Counter>& steps;
  p::Family<p::Histogram>& step_seconds;
  p::Family<p::Histogram>& collective_seconds;
  p::Family<p::Counter>& collective_bytes;
  p::Family<p::Gauge>& loss;
};

WorkerMetrics::WorkerMetrics(std::shared_ptr<p::Registry> registry)
    : registry_(std::move(registry)), f_(std::make_unique<Families>(*registry_)) {}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::SetDevices(const std::vector<EnergyChannel>& channels) {
  for (const EnergyChannel& ch : channels) {
    f_->device_info
        .Add({{"device", ch.device}, {"uuid", ch.uuid}, {"name", ch.name}, {"source", ch.source}})
        .Set(1);
  }
}

void WorkerMetrics::OnEnergy(const EnergySample& sample) {
  for (const EnergyEntry& e : sample.entries) {
    f_->energy
        .Add({{"job", sample.job},
              {"rank", sample.rank},
              {"device", e.device},
              {"source", e.source},
              {"phase", e.phase}})
        .Increment(e.joules);
  }
  for (const EnergySample::Power& pw : sample.power) {
    f_->power.Add({{"device", pw.channel.device}, {"source", pw.channel.source}}).Set(pw.watts);
  }
  for (const DeviceStatus& d : sample.devices) {
    f_->utilization.Add({{"device", d.device}}).Set(d.utilization);
    f_->power_limit.Add({{"device", d.device}}).Set(d.power_limit_watts);
  }
}

void WorkerMetrics::BindJob(const std::string& job, const std::string& rank) {
  std::lock_guard<std::mutex> lock(mu_);
  job_ = job;
  rank_ = rank;
  const p::Labels labels{{"job", job}, {"rank", rank}};
  samples_ = &f_->samples.Add(labels);
  steps_ = &f_->steps.Add(labels);
  step_seconds_ = &f_->step_seconds.Add(labels, TimeBuckets());
  loss_ = &f_->loss.Add(labels);
}

void WorkerMetrics::OnStep(int64_t samples, double seconds, double loss) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!samples_) return;
  samples_->Increment(static_cast<double>(samples));
  steps_->Increment();
  step_seconds_->Observe(seconds);
  loss_->Set(loss);
}

void WorkerMetrics::OnCollective(const std::string& op, int64_t bytes, double seconds) {
  std::string job, rank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
    rank = rank_;
  }
  const p::Labels labels{{"job", job}, {"rank", rank}, {"op", op}};
  f_->collective_seconds.Add(labels, TimeBuckets()).Observe(seconds);
  f_->collective_bytes.Add(labels).Increment(static_cast<double>(bytes));
}

}  // namespace joule::worker
