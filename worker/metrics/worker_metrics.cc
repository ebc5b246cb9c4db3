#include "worker/metrics/worker_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <cmath>

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
        node_energy(
            p::BuildCounter()
                .Name("joule_node_energy_joules_total")
                .Help(
                    "Whole-node energy from the BMC charged to this worker (its "
                    "share of the host's component energy, else of its busy CPU time), by job and "
                    "rank; the same power as the "
                    "components' and more: never add it to joule_energy_joules_total")
                .Register(r)),
        cross_check(p::BuildCounter()
                        .Name("joule_energy_cross_check_joules_total")
                        .Help("Two sources read over the same intervals, each as charged to "
                              "this worker (side=\"source\": the one charged, "
                              "side=\"reference\": the one standing by, e.g. NVML's counter "
                              "against its power integral): their rates' ratio is the "
                              "meters' agreement; never add it to joule_energy_joules_total")
                        .Register(r)),
        source_info(p::BuildGauge()
                        .Name("joule_energy_source_info")
                        .Help("Each energy source this worker reads (value 1): state counting, "
                              "stuck (a counter that stopped: another stands in), standing_in, "
                              "or standby; reason where not counting")
                        .Register(r)),
        blas_info(p::BuildGauge()
                      .Name("joule_blas_info")
                      .Help("The BLAS library and kernel this worker's CPU GEMMs run on "
                            "(value 1); fallback: narrower than the CPU's vectors")
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
                 .Register(r)),
        test_accuracy(p::BuildGauge()
                          .Name("joule_test_accuracy_ratio")
                          .Help("Test accuracy (0..1) after the job's last finished epoch, "
                                "from the ranks that report progress")
                          .Register(r)),
        epoch(p::BuildGauge()
                  .Name("joule_epoch")
                  .Help("Epoch (1-based) the job is training, from the ranks that report "
                        "progress")
                  .Register(r)) {}
  p::Family<p::Counter>& energy;
  p::Family<p::Gauge>& power;
  p::Family<p::Gauge>& device_info;
  p::Family<p::Counter>& node_energy;
  p::Family<p::Counter>& cross_check;
  p::Family<p::Gauge>& source_info;
  p::Family<p::Gauge>& blas_info;
  p::Family<p::Gauge>& utilization;
  p::Family<p::Gauge>& power_limit;
  p::Family<p::Counter>& samples;
  p::Family<p::Counter>& steps;
  p::Family<p::Histogram>& step_seconds;
  p::Family<p::Histogram>& collective_seconds;
  p::Family<p::Counter>& collective_bytes;
  p::Family<p::Gauge>& loss;
  p::Family<p::Gauge>& test_accuracy;
  p::Family<p::Gauge>& epoch;
};

// Every series created for one job, so that it can be removed.
struct WorkerMetrics::JobSeries {
  std::vector<p::Counter*> energy, node_energy, counters_samples, counters_steps, collective_bytes;
  std::vector<p::Histogram*> step_seconds, collective_seconds;
  std::vector<p::Gauge*> loss, test_accuracy, epoch;
};

WorkerMetrics::JobSeries& WorkerMetrics::SeriesLocked(const std::string& job) {
  auto& s = series_[job];
  if (!s) s = std::make_unique<JobSeries>();
  return *s;
}

WorkerMetrics::WorkerMetrics(std::shared_ptr<p::Registry> registry)
    : registry_(std::move(registry)), f_(std::make_unique<Families>(*registry_)) {}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::SetBlas(const v1::BlasInfo& blas) {
  f_->blas_info
      .Add({{"library", blas.library().empty() ? "unknown" : blas.library()},
            {"core", blas.core()},
            {"fallback", blas.fallback() ? "true" : "false"}})
      .Set(1);
}

void WorkerMetrics::SetDevices(const std::vector<EnergyChannel>& channels) {
  for (const EnergyChannel& ch : channels) {
    f_->device_info
        .Add({{"device", ch.device}, {"uuid", ch.uuid}, {"name", ch.name}, {"source", ch.source}})
        .Set(1);
  }
}

void WorkerMetrics::OnEnergy(const EnergySample& sample) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const EnergyEntry& e : sample.entries) {
    p::Counter& c = f_->energy.Add({{"joule_job", sample.job},
                                    {"joule_rank", sample.rank},
                                    {"device", e.device},
                                    {"source", e.source},
                                    {"phase", e.phase}});
    c.Increment(e.joules);
    if (!sample.job.empty()) {
      auto& v = SeriesLocked(sample.job).energy;
      if (std::find(v.begin(), v.end(), &c) == v.end()) v.push_back(&c);
    }
  }
  if (sample.node_joules > 0) {
    p::Counter& c = f_->node_energy.Add({{"joule_job", sample.job}, {"joule_rank", sample.rank}});
    c.Increment(sample.node_joules);
    if (!sample.job.empty()) {
      auto& v = SeriesLocked(sample.job).node_energy;
      if (std::find(v.begin(), v.end(), &c) == v.end()) v.push_back(&c);
    }
  }
  for (const EnergySample::CrossCheck& c : sample.cross_checks) {
    const std::map<std::string, std::string> pair = {{"source", c.source},
                                                     {"reference", c.reference}};
    auto side = [&](const char* name) -> p::Counter& {
      std::map<std::string, std::string> labels = pair;
      labels.emplace("side", name);
      return f_->cross_check.Add(labels);
    };
    if (!std::isfinite(c.joules) || !std::isfinite(c.reference_joules)) continue;
    side("source").Increment(std::max(0.0, c.joules));
    side("reference").Increment(std::max(0.0, c.reference_joules));
  }
  for (const EnergySample::Power& pw : sample.power) {
    f_->power.Add({{"device", pw.channel.device}, {"source", pw.channel.source}}).Set(pw.watts);
  }
  for (const DeviceStatus& d : sample.devices) {
    f_->utilization.Add({{"device", d.device}}).Set(d.utilization);
    f_->power_limit.Add({{"device", d.device}}).Set(d.power_limit_watts);
  }
  // One series per source, its labels the state now: a state left is removed (no stale
  // "stuck" beside "counting").
  std::vector<p::Gauge*> states;
  for (const SourceState& st : sample.sources) {
    states.push_back(
        &f_->source_info.Add({{"source", st.source}, {"state", st.state}, {"reason", st.reason}}));
    states.back()->Set(1);
  }
  for (p::Gauge* g : source_states_) {
    if (std::find(states.begin(), states.end(), g) == states.end()) f_->source_info.Remove(g);
  }
  source_states_ = std::move(states);
}

void WorkerMetrics::BindJob(const std::string& job, const std::string& rank) {
  std::lock_guard<std::mutex> lock(mu_);
  // Drop the series of every job but the one just finished and the new one.
  for (auto it = series_.begin(); it != series_.end();) {
    if (it->first == job_ || it->first == job) {
      ++it;
      continue;
    }
    JobSeries& s = *it->second;
    for (auto* c : s.energy) f_->energy.Remove(c);
    for (auto* c : s.node_energy) f_->node_energy.Remove(c);
    for (auto* c : s.counters_samples) f_->samples.Remove(c);
    for (auto* c : s.counters_steps) f_->steps.Remove(c);
    for (auto* c : s.collective_bytes) f_->collective_bytes.Remove(c);
    for (auto* h : s.step_seconds) f_->step_seconds.Remove(h);
    for (auto* h : s.collective_seconds) f_->collective_seconds.Remove(h);
    for (auto* g : s.loss) f_->loss.Remove(g);
    for (auto* g : s.test_accuracy) f_->test_accuracy.Remove(g);
    for (auto* g : s.epoch) f_->epoch.Remove(g);
    it = series_.erase(it);
  }
  job_ = job;
  rank_ = rank;
  const p::Labels labels{{"joule_job", job}, {"joule_rank", rank}};
  samples_ = &f_->samples.Add(labels);
  steps_ = &f_->steps.Add(labels);
  step_seconds_ = &f_->step_seconds.Add(labels, TimeBuckets());
  loss_ = &f_->loss.Add(labels);
  const p::Labels allreduce{{"joule_job", job}, {"joule_rank", rank}, {"op", "allreduce"}};
  allreduce_seconds_ = &f_->collective_seconds.Add(allreduce, TimeBuckets());
  allreduce_bytes_ = &f_->collective_bytes.Add(allreduce);
  JobSeries& s = SeriesLocked(job);
  s.counters_samples.push_back(samples_);
  s.counters_steps.push_back(steps_);
  s.step_seconds.push_back(step_seconds_);
  s.loss.push_back(loss_);
  s.collective_seconds.push_back(allreduce_seconds_);
  s.collective_bytes.push_back(allreduce_bytes_);
}

void WorkerMetrics::EndJob() {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(job_);
  if (it != series_.end()) {
    JobSeries& s = *it->second;
    for (auto* g : s.loss) f_->loss.Remove(g);
    for (auto* g : s.epoch) f_->epoch.Remove(g);
    s.loss.clear();
    s.epoch.clear();
  }
  samples_ = steps_ = allreduce_bytes_ = nullptr;
  step_seconds_ = allreduce_seconds_ = nullptr;
  loss_ = nullptr;
}

void WorkerMetrics::OnStep(int64_t samples, double seconds, double loss) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!samples_) return;
  samples_->Increment(static_cast<double>(samples));
  steps_->Increment();
  step_seconds_->Observe(seconds);
  loss_->Set(loss);
}

void WorkerMetrics::OnProgress(int epoch, double test_accuracy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!samples_) return;
  const p::Labels labels{{"joule_job", job_}, {"joule_rank", rank_}};
  JobSeries& s = SeriesLocked(job_);
  // Each family removes only its own series (BindJob), so each keeps its own list.
  auto remember = [](std::vector<p::Gauge*>& v, p::Gauge* g) {
    if (std::find(v.begin(), v.end(), g) == v.end()) v.push_back(g);
  };
  p::Gauge& e = f_->epoch.Add(labels);
  e.Set(epoch);
  remember(s.epoch, &e);
  if (test_accuracy >= 0) {  // -1 before the first evaluation: no series yet
    p::Gauge& a = f_->test_accuracy.Add(labels);
    a.Set(test_accuracy);
    remember(s.test_accuracy, &a);
  }
}

void WorkerMetrics::OnCollective(const std::string& op, int64_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!samples_) return;  // no job bound
  if (op == "allreduce" && allreduce_seconds_) {  // the per-step one: no lookup
    allreduce_seconds_->Observe(seconds);
    allreduce_bytes_->Increment(static_cast<double>(bytes));
    return;
  }
  const p::Labels labels{{"joule_job", job_}, {"joule_rank", rank_}, {"op", op}};
  p::Histogram& h = f_->collective_seconds.Add(labels, TimeBuckets());
  p::Counter& c = f_->collective_bytes.Add(labels);
  h.Observe(seconds);
  c.Increment(static_cast<double>(bytes));
  JobSeries& s = SeriesLocked(job_);
  if (std::find(s.collective_seconds.begin(), s.collective_seconds.end(), &h) ==
      s.collective_seconds.end()) {
    s.collective_seconds.push_back(&h);
    s.collective_bytes.push_back(&c);
  }
}

}  // namespace joule::worker
