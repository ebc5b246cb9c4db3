#include "worker/energy/energy_meter.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "worker/energy/nvml_source.h"
#include "worker/energy/perf_rapl_source.h"
#include "worker/energy/rapl_source.h"
#include "worker/energy/stuck_counter_guard.h"

namespace joule::worker {
namespace {
constexpr size_t kMaxWarnings = 16;

// A source with standing notes of its own added: why the sources before it in the order
// were passed over, which every job's report carries.
class NotedSource final : public PowerSource {
 public:
  NotedSource(std::unique_ptr<PowerSource> inner, std::vector<std::string> notes)
      : inner_(std::move(inner)), notes_(std::move(notes)) {}
  const std::vector<EnergyChannel>& channels() const override { return inner_->channels(); }
  absl::Status Read(Clock::TimePoint now, std::vector<double>* joules) override {
    return inner_->Read(now, joules);
  }
  void AppendNotes(std::vector<std::string>* out) const override {
    out->insert(out->end(), notes_.begin(), notes_.end());
    inner_->AppendNotes(out);
  }
  void AppendStatus(std::vector<DeviceStatus>* out) override { inner_->AppendStatus(out); }
  void AppendSourceStates(std::vector<SourceState>* out) const override {
    inner_->AppendSourceStates(out);
  }
  bool LastReadAll(std::vector<double>* joules) const override {
    return inner_->LastReadAll(joules);
  }

 private:
  std::unique_ptr<PowerSource> inner_;
  std::vector<std::string> notes_;
};

}  // namespace

EnergyMeter::EnergyMeter(std::vector<std::unique_ptr<PowerSource>> sources, PhaseClock* phases,
                         CpuTimes* cpu, const Clock* clock)
    : clock_(clock), phases_(phases), cpu_(cpu), sources_(std::move(sources)) {
  last_sample_ = clock_->Now();
  if (auto p = cpu_->ProcessSeconds(); p.ok()) last_process_cpu_ = *p;
  if (auto b = cpu_->SystemBusySeconds(); b.ok()) last_system_busy_ = *b;
}

EnergyMeter::~EnergyMeter() { Stop(); }

void EnergyMeter::Start(std::chrono::milliseconds period) {
  if (period.count() <= 0 || thread_.joinable()) return;
  thread_ = std::thread([this, period] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (stop_cv_.wait_for(lock, period, [this] { return stopping_; })) break;
      lock.unlock();
      Sample();
      lock.lock();
    }
  });
}

void EnergyMeter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EnergyMeter::SetListener(Listener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

void EnergyMeter::SetNode(std::shared_ptr<NodeEnergyPoller> node) {
  std::lock_guard<std::mutex> lock(mu_);
  node_ = std::move(node);
  last_node_joules_ = node_ ? node_->totals().joules : 0;
  last_node_lost_ = node_ ? node_->totals().lost_seconds : 0;
  node_span_ = {};
  // The host's other workers' device energy is counted from here (their first sight).
  if (node_) node_->ExchangeDeviceJoules(own_devices_joules_);
}

void EnergyMeter::Sample() {
  std::lock_guard<std::mutex> lock(mu_);
  SampleLocked();
}

void EnergyMeter::BeginJob(const std::string& job, const std::string& rank) {
  std::lock_guard<std::mutex> lock(mu_);
  SampleLocked();
  SetJobLocked(job, rank);
}

JobEnergy EnergyMeter::EndJob() {
  std::lock_guard<std::mutex> lock(mu_);
  SampleLocked();
  JobEnergy totals = TotalsLocked();
  SetJobLocked("", "");
  return totals;
}

void EnergyMeter::SampleLocked() {
  const Clock::TimePoint now = clock_->Now();
  const PhaseSeconds phase_seconds = phases_->TakeInterval();
  double phase_total = 0;
  for (double s : phase_seconds) phase_total += s;

  // This process's share of the machine's busy CPU time over the recent window.
  absl::StatusOr<double> process = cpu_->ProcessSeconds();
  absl::StatusOr<double> busy = cpu_->SystemBusySeconds();
  if (process.ok() && busy.ok()) {
    share_window_.emplace_back(*process - last_process_cpu_, *busy - last_system_busy_);
    if (share_window_.size() > kShareWindow) share_window_.pop_front();
    last_process_cpu_ = *process;
    last_system_busy_ = *busy;
    double dp = 0, db = 0;
    for (const auto& [p, b] : share_window_) {
      dp += p;
      db += b;
    }
    if (db > 0) share_ = std::clamp(dp / db, 0.0, 1.0);
  } else {
    const std::string w = "cpu times unreadable; shared devices charged by the last share";
    if (std::find(job_warnings_.begin(), job_warnings_.end(), w) == job_warnings_.end() &&
        job_warnings_.size() < kMaxWarnings) {
      job_warnings_.push_back(w);
    }
  }
  const double share = share_;
  const double dt = Seconds(now - last_sample_);
  last_sample_ = now;

  EnergySample sample;
  sample.job = job_;
  sample.rank = rank_;
  double watts = 0;
  std::vector<double> joules;
  std::vector<std::string> notes;
  for (auto& source : sources_) {
    absl::Status st = source->Read(now, &joules);
    if (!st.ok()) {
      std::string w(st.message());
      if (std::find(job_warnings_.begin(), job_warnings_.end(), w) == job_warnings_.end() &&
          job_warnings_.size() < kMaxWarnings) {
        spdlog::warn("energy: {}", w);
        job_warnings_.push_back(w);
      }
    }
    // Standing notes go into every job's warnings, and into the log once.
    notes.clear();
    source->AppendNotes(&notes);
    for (const std::string& w : notes) {
      if (logged_notes_.insert(w).second) spdlog::warn("energy: {}", w);
      if (std::find(job_warnings_.begin(), job_warnings_.end(), w) == job_warnings_.end() &&
          job_warnings_.size() < kMaxWarnings) {
        job_warnings_.push_back(w);
      }
    }
    if (joules.size() != source->channels().size()) continue;  // interval lost
    // A counter read beside its standby: both as charged to this worker, per source.
    if (std::vector<double> all; source->LastReadAll(&all) && all.size() == joules.size()) {
      std::vector<std::pair<std::string, double>> sums;  // in channel order
      for (size_t i = 0; i < all.size(); ++i) {
        const EnergyChannel& ch = source->channels()[i];
        const double charged = all[i] * (ch.shared ? share : 1.0);
        if (sums.empty() || sums.back().first != ch.source) sums.emplace_back(ch.source, 0.0);
        sums.back().second += charged;
      }
      if (sums.size() == 2) {
        auto& pair = job_cross_[{sums[0].first, sums[1].first}];
        pair.first += sums[0].second;
        pair.second += sums[1].second;
        sample.cross_checks.push_back(
            {sums[0].first, sums[1].first, sums[0].second, sums[1].second});
      }
    }
    for (size_t i = 0; i < joules.size(); ++i) {
      const EnergyChannel& ch = source->channels()[i];
      const double charged = joules[i] * (ch.shared ? share : 1.0);
      if (ch.source != "estimated") {  // measured: what the node's split is made of
        node_span_.charged += charged;
        (ch.shared ? node_span_.shared_whole : node_span_.devices_whole) += joules[i];
        if (!ch.shared) own_devices_joules_ += joules[i];
      }
      sample.power.push_back({ch, dt > 0 ? charged / dt : 0.0});
      watts += dt > 0 ? charged / dt : 0.0;
      for (int k = 0; k < kPhaseCount; ++k) {
        const double fraction = phase_total > 0 ? phase_seconds[k] / phase_total
                                                : (k == static_cast<int>(Phase::kIdle) ? 1 : 0);
        const double e = charged * fraction;
        if (e <= 0) continue;
        const char* phase = PhaseName(static_cast<Phase>(k));
        sample.entries.push_back({ch.device, ch.source, phase, e});
        job_joules_[{ch.device, ch.source, phase}] += e;
      }
    }
  }
  job_watts_ = watts;
  if (node_) ChargeNodeLocked(dt * watts, share, &sample);
  if (listener_) {
    for (auto& source : sources_) {
      source->AppendStatus(&sample.devices);
      source->AppendSourceStates(&sample.sources);
    }
    listener_(sample);
  }
}

// The node's energy integrated since the last sample moves at each BMC reading (a second
// apart where this samples every 100 ms). It is split by component energy over the span
// since it last moved: this worker's measured component energy as charged to it, over the
// host's (the shared channels whole, read here as by every worker of the host, plus every
// worker's own devices: this one's, and the others' from NodeEnergyPoller::
// ExchangeDeviceJoules). Where the host measured no component energy in the span (only
// estimates), by this process's share of the host's busy CPU time. What no worker is
// charged (idle components, other processes) stays the host's. Beside it, every
// interval's component energy while the node is metered: all but the time of a gap the
// poller could not integrate (a failed reading, a lost stretch, a stale shared total).
void EnergyMeter::ChargeNodeLocked(double component_joules, double cpu_share,
                                   EnergySample* sample) {
  const NodeEnergyPoller::Totals t = node_->totals();
  const double node_delta = std::max(0.0, t.joules - last_node_joules_);
  last_node_joules_ = std::max(last_node_joules_, t.joules);
  const bool metered = t.readings > 0 && t.last_error.empty() && t.lost_seconds == last_node_lost_;
  last_node_lost_ = t.lost_seconds;
  if (metered) job_node_component_joules_ += component_joules;
  if (node_delta <= 0) return;
  const double others = node_->ExchangeDeviceJoules(own_devices_joules_);
  const double host = node_span_.shared_whole + node_span_.devices_whole + others;
  const bool by_components = host > 0;
  const double fraction =
      by_components ? std::clamp(node_span_.charged / host, 0.0, 1.0) : cpu_share;
  node_span_ = {};
  sample->node_joules = node_delta * fraction;
  job_node_joules_ += sample->node_joules;
  (by_components ? job_node_by_components_ : job_node_by_cpu_time_) += sample->node_joules;
}

void EnergyMeter::SetJobLocked(const std::string& job, const std::string& rank) {
  job_ = job;
  rank_ = rank;
  job_joules_.clear();
  job_warnings_.clear();
  job_node_joules_ = job_node_component_joules_ = 0;
  job_node_by_components_ = job_node_by_cpu_time_ = 0;
  job_cross_.clear();
}

JobEnergy EnergyMeter::JobTotals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TotalsLocked();
}

JobEnergy EnergyMeter::TotalsLocked() const {
  JobEnergy out;
  for (const auto& [key, joules] : job_joules_) {
    const auto& [device, source, phase] = key;
    out.entries.push_back({device, source, phase, joules});
    out.total_joules += joules;
    if (source == "estimated") out.estimated = true;
  }
  out.watts = job_watts_;
  out.warnings = job_warnings_;
  out.node_joules = job_node_joules_;
  out.node_component_joules = job_node_component_joules_;
  if (node_) out.node_source = node_->Describe();
  if (job_node_by_components_ > 0) out.node_split = kNodeSplitComponents;
  if (job_node_by_cpu_time_ > 0) {
    out.node_split = out.node_split.empty() ? kNodeSplitCpuTime : kNodeSplitMixed;
  }
  out.cross_checks = job_cross_;
  return out;
}

std::vector<EnergyChannel> EnergyMeter::channels() const {
  std::vector<EnergyChannel> out;
  for (const auto& s : sources_) {
    out.insert(out.end(), s->channels().begin(), s->channels().end());
  }
  return out;
}

std::vector<SourceState> EnergyMeter::source_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SourceState> out;
  for (const auto& s : sources_) s->AppendSourceStates(&out);
  return out;
}

std::vector<std::string> EnergyMeter::source_names() const {
  std::set<std::string> names;
  for (const SourceState& s : source_states()) {
    if (s.state == "counting" || s.state == "standing_in") names.insert(s.source);
  }
  return {names.begin(), names.end()};
}

std::vector<std::unique_ptr<PowerSource>> OpenPowerSources(const EnergyOptions& options,
                                                           CpuTimes* cpu, const Clock* clock) {
  std::vector<std::unique_ptr<PowerSource>> sources;
  if (options.use_nvml) {
    auto nvml = options.gpu_pci_bus_id.empty()
                    ? NvmlSource::Open(options.nvml_library,
                                       std::getenv("CUDA_VISIBLE_DEVICES"), clock->Now())
                    : NvmlSource::OpenByPciBusId(options.nvml_library, options.gpu_pci_bus_id,
                                                 options.gpu_device, clock->Now());
    if (nvml.ok()) {
      spdlog::info("energy: nvml: {} GPU(s)", (*nvml)->channels().size());
      bool counter = false;
      for (const EnergyChannel& ch : (*nvml)->channels()) counter |= ch.source == "nvml";
      // The same GPUs' power, integrated, stands in for an energy counter that sticks.
      auto power = !counter ? absl::StatusOr<std::unique_ptr<NvmlSource>>(nullptr)
                   : options.gpu_pci_bus_id.empty()
                       ? NvmlSource::Open(options.nvml_library, std::getenv("CUDA_VISIBLE_DEVICES"),
                                          clock->Now(), NvmlReading::kPowerOnly)
                       : NvmlSource::OpenByPciBusId(options.nvml_library, options.gpu_pci_bus_id,
                                                    options.gpu_device, clock->Now(),
                                                    NvmlReading::kPowerOnly);
      if (power.ok() && *power != nullptr &&
          (*power)->channels().size() == (*nvml)->channels().size()) {
        sources.push_back(
            std::make_unique<StuckCounterGuard>(*std::move(nvml), *std::move(power), cpu));
      } else {
        sources.push_back(*std::move(nvml));
      }
    } else {
      spdlog::warn("energy: no GPU energy: {}", nvml.status().ToString());
    }
  }
  const auto estimate = [&] {
    return std::make_unique<EstimatedSource>(cpu, options.estimate, clock->Now());
  };
  // Why each CPU source before the one used was not: standing notes, which the meter logs
  // once and every job's report carries.
  std::vector<std::string> passed_over;
  absl::StatusOr<std::unique_ptr<RaplSource>> rapl =
      RaplSource::Open(options.powercap_root, clock->Now());
  if (!rapl.ok()) {
    passed_over.push_back(
        absl::StrCat("cpu energy: rapl (powercap) not used: ", rapl.status().message()));
    if (!options.perf_power_pmu.empty()) {
      rapl = OpenPerfRaplSource(
          options.perf_power_pmu,
          options.perf_reader ? options.perf_reader : std::shared_ptr(SystemPerfCounterReader()),
          clock->Now());
      if (!rapl.ok()) {
        passed_over.push_back(absl::StrCat("cpu energy: perf_rapl (the perf power PMU) not used: ",
                                           rapl.status().message()));
      }
    }
  }
  if (rapl.ok()) {
    std::string zones;
    for (const auto& ch : (*rapl)->channels()) zones += " " + ch.device;
    spdlog::info("energy: {} zones:{}", (*rapl)->channels().front().source, zones);
    auto guard = std::make_unique<StuckCounterGuard>(*std::move(rapl), estimate(), cpu);
    if (options.stuck_probe.count() > 0) guard->ProbeAtStart(options.stuck_probe, *clock);
    std::unique_ptr<PowerSource> guarded = std::move(guard);
    sources.push_back(passed_over.empty() ? std::move(guarded)
                                          : std::make_unique<NotedSource>(std::move(guarded),
                                                                          std::move(passed_over)));
  } else {
    spdlog::warn("energy: CPU energy is estimated: CPU time x {} W per busy core + {} W idle",
                 options.estimate.watts_per_busy_core, options.estimate.idle_watts);
    sources.push_back(std::make_unique<NotedSource>(estimate(), std::move(passed_over)));
  }
  return sources;
}

}  // namespace joule::worker
