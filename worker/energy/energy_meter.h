#ifndef JOULE_WORKER_ENERGY_ENERGY_METER_H_
#define JOULE_WORKER_ENERGY_ENERGY_METER_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "worker/energy/cpu_times.h"
#include "worker/energy/estimated_source.h"
#include "worker/energy/node_power.h"
#include "worker/energy/perf_rapl_source.h"
#include "worker/energy/phase_clock.h"
#include "worker/energy/power_source.h"

namespace joule::worker {

// Energy of one (device, source, phase), in joules.
struct EnergyEntry {
  std::string device;
  std::string source;
  std::string phase;
  double joules = 0;
};

// One sampling interval's result, passed to the listener (the metrics exporter).
struct EnergySample {
  std::string job;   // the job the interval was charged to ("" when idle)
  std::string rank;
  std::vector<EnergyEntry> entries;  // joules of this interval, by device, source, phase
  struct Power {
    EnergyChannel channel;
    double watts = 0;  // attributed to this worker over the interval
  };
  std::vector<Power> power;
  std::vector<DeviceStatus> devices;  // power limits and utilisation, where known
  std::vector<SourceState> sources;   // each source's state (counting, stuck, ...)
  double node_joules = 0;             // whole-node energy charged to this worker (BMC)
  // Sources read side by side over this interval (a counter and its standby), each as
  // charged to this worker, joules: JobEnergy::cross_checks' increments.
  struct CrossCheck {
    std::string source, reference;
    double joules = 0, reference_joules = 0;
  };
  std::vector<CrossCheck> cross_checks;
};

// JobEnergy::node_split's values (RankResult.node_split carries them).
inline constexpr char kNodeSplitComponents[] = "component energy";
inline constexpr char kNodeSplitCpuTime[] = "cpu time";
inline constexpr char kNodeSplitMixed[] = "component energy and cpu time";

// A job's energy so far as this worker measured it.
struct JobEnergy {
  std::vector<EnergyEntry> entries;  // cumulative, by device, source, phase
  double total_joules = 0;
  double watts = 0;                  // over the last interval
  bool estimated = false;
  // Each once, at most 16: the sources' warnings on the job's intervals (lower bounds,
  // dropped intervals) and their standing notes (e.g. a mirrored zone counted once).
  std::vector<std::string> warnings;
  // Whole-node energy from the BMC charged to this worker (its share of the host's
  // measured component energy, else of its busy CPU time: EnergyMeter::ChargeNodeLocked),
  // and its component energy (`entries`') over the same intervals; 0 and 0 without a node
  // meter. Not in total_joules. node_split: how node_joules was split, kNodeSplit*.
  double node_joules = 0;
  double node_component_joules = 0;
  std::string node_source;
  std::string node_split;
  // Sources read side by side over the same intervals (a counter and its standby), each
  // pair's joules as charged to this worker: (source, reference) -> (joules, reference's).
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> cross_checks;
};

// Samples every power source on its own thread (never the training thread) every
// `period`, and charges each interval's energy:
//  - to devices: a shared device (CPU package, DRAM) by this process's share of the
//    machine's busy CPU time, share = d(process CPU s) / d(system busy CPU s) over the
//    last kShareWindow intervals (one 100 ms interval holds only ~20 ticks of /proc/stat
//    on two cores: too few for a steady ratio), clamped to [0, 1]; where the machine was
//    not busy at all in the window, the last share stands; an owned device (GPU) or a
//    per-process estimate is charged in full;
//  - to phases: in proportion to the time the PhaseClock spent in each during the
//    interval (all to idle if it recorded none);
//  - to the current job (BeginJob), whose totals EndJob() returns.
//
// Thread-safe. Sample() may also be called directly (tests, job boundaries).
class EnergyMeter {
 public:
  using Listener = std::function<void(const EnergySample&)>;

  // `phases`, `cpu` and `clock` must outlive the meter.
  EnergyMeter(std::vector<std::unique_ptr<PowerSource>> sources, PhaseClock* phases,
              CpuTimes* cpu, const Clock* clock);
  ~EnergyMeter();

  // Starts the sampling thread (period > 0). Stop() or the destructor ends it.
  void Start(std::chrono::milliseconds period);
  void Stop();
  void SetListener(Listener listener);
  // Whole-node power to charge this worker its share of (EnergyMeter samples its totals;
  // null: none).
  void SetNode(std::shared_ptr<NodeEnergyPoller> node);

  static constexpr int kShareWindow = 10;

  // Takes one sample now (charging the interval to the job current until now).
  void Sample();
  // Atomically: samples (closing the interval before the job), then charges what follows
  // to `job` and `rank` with fresh totals.
  void BeginJob(const std::string& job, const std::string& rank);
  // Atomically: samples (closing the job's last interval), returns the job's totals, and
  // charges what follows to no job. So the totals equal what the listener was given for
  // the job, interval for interval.
  JobEnergy EndJob();
  // The current job's totals so far.
  JobEnergy JobTotals() const;

  std::vector<EnergyChannel> channels() const;
  // The sources charged now, e.g. {"rapl"} or {"estimated"} (not a fallback standing by).
  std::vector<std::string> source_names() const;
  std::vector<SourceState> source_states() const;

 private:
  const Clock* clock_;
  PhaseClock* phases_;
  CpuTimes* cpu_;
  std::vector<std::unique_ptr<PowerSource>> sources_;

  mutable std::mutex mu_;  // guards everything below and serialises Sample()
  Listener listener_;
  std::string job_, rank_;
  std::map<std::tuple<std::string, std::string, std::string>, double> job_joules_;
  double job_watts_ = 0;
  std::vector<std::string> job_warnings_;
  std::shared_ptr<NodeEnergyPoller> node_;
  double last_node_joules_ = 0, last_node_lost_ = 0;
  double job_node_joules_ = 0, job_node_component_joules_ = 0;
  double job_node_by_components_ = 0, job_node_by_cpu_time_ = 0;  // node_joules by split
  // Measured (not estimated) component energy since the node's total last moved: this
  // worker's as charged, the shared channels' whole, its own devices' whole.
  struct NodeSpan {
    double charged = 0, shared_whole = 0, devices_whole = 0;
  } node_span_;
  double own_devices_joules_ = 0;  // its own devices' whole energy since start (J)
  void ChargeNodeLocked(double component_joules, double cpu_share, EnergySample* sample);
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> job_cross_;
  std::set<std::string> logged_notes_;  // sources' standing notes already logged
  void SampleLocked();
  void SetJobLocked(const std::string& job, const std::string& rank);
  JobEnergy TotalsLocked() const;
  double last_process_cpu_ = 0, last_system_busy_ = 0;
  std::deque<std::pair<double, double>> share_window_;  // (d process s, d busy s)
  double share_ = 1.0;
  Clock::TimePoint last_sample_;

  std::thread thread_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
};

// Which sources a worker meters, with fallbacks.
struct EnergyOptions {
  std::string powercap_root = "/sys/class/powercap";
  // The perf power PMU, where the powercap files cannot be read (perf_rapl_source.h);
  // empty: not tried.
  std::string perf_power_pmu = "/sys/bus/event_source/devices/power";
  // RAPL counters (either interface) that do not advance in this long at start are stuck
  // from the start (StuckCounterGuard::ProbeAtStart); 0: no probe.
  std::chrono::milliseconds stuck_probe{100};
  // How perf counters are opened and read: null, perf_event_open (tests give a fake).
  std::shared_ptr<PerfCounterReader> perf_reader;
  // Whole-node power from the BMC (redfish.url empty: none), polled every node_period.
  RedfishOptions redfish;
  // Where there is no Redfish URL: IPMI DCMI through ipmitool, when ipmi_dcmi is set.
  bool ipmi_dcmi = false;
  IpmiOptions ipmi;
  std::chrono::milliseconds node_period{1000};
  // Where the workers of a host share one BMC poller (NodeEnergyPoller::SetShared); empty:
  // each worker polls the BMC itself.
  std::string node_shared_dir = DefaultNodePowerDir();
  bool use_nvml = false;  // GPU workers
  std::string nvml_library = "libnvidia-ml.so.1";
  // With use_nvml: meter only the GPU at this PCI bus id (the one the worker trains on),
  // as channel `gpu_device`; empty: every visible GPU.
  std::string gpu_pci_bus_id;
  std::string gpu_device = "gpu-0";
  EstimateOptions estimate;
};

// Opens NVML (if asked), then CPU energy from the first of: RAPL's powercap files, the
// perf power PMU (perf_rapl), the estimate, logging why each one before was passed over.
// Every counter source is watched by a StuckCounterGuard: RAPL's (either) stands in
// `estimated` for a counter that never moves, NVML's counter its power integral
// (nvml_power). Never fails: the estimate is always possible. `cpu` and `clock` must
// outlive the sources.
std::vector<std::unique_ptr<PowerSource>> OpenPowerSources(const EnergyOptions& options,
                                                           CpuTimes* cpu, const Clock* clock);

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_ENERGY_METER_H_
