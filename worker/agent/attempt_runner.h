#ifndef JOULE_WORKER_AGENT_ATTEMPT_RUNNER_H_
#define JOULE_WORKER_AGENT_ATTEMPT_RUNNER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/energy_report.h"
#include "joule/v1/worker.pb.h"
#include "worker/agent/attempt_control.h"
#include "worker/comm/connect.h"
#include "worker/comm/kv_client.h"
#include "worker/energy/energy_meter.h"
#include "worker/energy/phase_clock.h"
#include "worker/energy/power_series.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/train/train_options.h"

namespace joule::worker {

struct AttemptRunnerOptions {
  TrainerOptions trainer;
  // How the ranks exchange gradients (comm/connect.h), the address peers reach this rank's
  // Gloo on, and the bound on the rendezvous and each collective.
  Transport transport = Transport::kAuto;
  std::string gloo_hostname = "127.0.0.1";
  std::chrono::milliseconds collective_timeout{60000};
  // The CUDA device a GPU attempt trains on (the worker's GpuClaim), or -1.
  int cuda_device = -1;
  // Times the attempt and its energy (AgentOptions::clock); not owned.
  const Clock* clock = Clock::Real();
};

// Runs one training attempt at a time on its own thread: binds the attempt's log lines
// and energy, connects the process group through the attempt's rendezvous KV, trains
// (RunTraining), and hands the rank's result, with its energy by device, source and phase
// and its power over time, to the outbox. Progress reports go out as the trainer makes
// them, with the rank's energy, power and transport.
//
// The attempt stops early on Cancel (its process group aborted, so a collective a peer
// will never join is left at once) or, for a budgeted job, at the step the ranks agree on
// after the coordinator asks for a graceful stop (one that writes a checkpoint first; one
// asked for before the attempt's first step cancels at once: nothing to checkpoint).
//
// Thread-safe: Cancel, Apply and the accessors may be called from any thread (the
// session's, its heartbeat thread, the agent's). Start and Join serialise: a Start while
// another thread joins waits for that attempt to end (the worker calls both from its
// session's thread, and Join from its destructor once Run has returned). Not copyable.
// While a running attempt's trainer sends no progress (staging, loading the data,
// connecting, a long evaluation or checkpoint), calls `report` once every `period` of
// silence on its own thread, so that the coordinator hears of the energy spent before the
// first step: a budget that the set-up alone passes is stopped at once, not a period after
// training starts. Heard() restarts the period. The destructor stops and joins the
// thread. Thread-safe.
class QuietEnergyReports {
 public:
  QuietEnergyReports(std::function<void()> report, std::chrono::milliseconds period);
  ~QuietEnergyReports();
  QuietEnergyReports(const QuietEnergyReports&) = delete;
  QuietEnergyReports& operator=(const QuietEnergyReports&) = delete;
  // A progress report went out: the next quiet one waits a whole period from now.
  void Heard();

 private:
  const std::function<void()> report_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                       // mu_
  std::chrono::steady_clock::time_point last_;  // the last report of either kind; mu_
  std::thread thread_;
};

class AttemptRunner final : public AttemptControl {
 public:
  // A rendezvous KV scoped to the attempt (its rendezvous_prefix): the coordinator's KV
  // RPCs in the worker, an in-process store in tests.
  using KvFactory = std::function<std::unique_ptr<KvClient>(const v1::Assignment&)>;

  // `meter` may be null (metering off: the result says it reported no energy); `metrics`,
  // `phases` and `outbox` must outlive the runner.
  AttemptRunner(AttemptRunnerOptions options, EnergyMeter* meter, WorkerMetrics* metrics,
                PhaseClock* phases, AttemptOutbox* outbox, KvFactory kv);
  // Cancels the attempt in flight and joins its thread (Join).
  ~AttemptRunner();
  AttemptRunner(const AttemptRunner&) = delete;
  AttemptRunner& operator=(const AttemptRunner&) = delete;

  // Starts `assignment` on the runner's thread. Files the job names open beneath
  // options.trainer.allowed_roots, or when that is empty beneath `data_roots` (the
  // coordinator's). FAILED_PRECONDITION naming the job in flight when one runs.
  absl::Status Start(const v1::Assignment& assignment,
                     std::vector<std::string> data_roots) override;
  // The coordinator's CancelAttempt, if it names the attempt in flight: a graceful stop
  // after a checkpoint when it asks for one and the job has an energy budget, else Cancel.
  // Returns whether it applied.
  bool Apply(const v1::CancelAttempt& cancel) override;
  // Stops the attempt in flight (if any) at once; its result says cancelled.
  void Cancel() override;
  // Waits for the attempt's thread. A thread stuck outside any collective (a hung file
  // system, a driver) would hold the worker forever: past the collective timeout plus
  // 30 s the process exits (status 3), so that whatever supervises it starts a fresh one.
  void Join() override;

  // Whether an attempt runs now (false once its result is handed to the outbox), and
  // which one (the last started when none runs).
  bool active() const override { return active_; }
  int64_t job_id() const override { return job_id_; }
  int32_t attempt() const override { return attempt_; }
  // What its training thread is doing (the heartbeat's phase).
  v1::RankPhase phase() const override { return RankPhaseOf(phases_->current()); }

 private:
  void Train(v1::Assignment assignment, std::vector<std::string> data_roots);
  // What the trainer calls back for attempt `a`: metrics, the process group through `kv`
  // (which, like `a`, must outlive the hooks), progress, cancellation.
  TrainHooks MakeHooks(const v1::Assignment& a, KvClient& kv);

  const AttemptRunnerOptions options_;
  EnergyMeter* const meter_;
  WorkerMetrics* const metrics_;
  PhaseClock* const phases_;
  AttemptOutbox* const outbox_;
  const KvFactory kv_;

  std::mutex start_mu_;  // Start and Join: one thread at a time
  std::thread thread_;
  std::atomic<bool> active_{false};
  std::atomic<bool> cancel_{false};
  // A graceful stop of a budgeted job: the ranks agree on a step and checkpoint there
  // (TrainHooks::stop_requested).
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> budgeted_{false};
  // Set before active_; read by any thread.
  std::atomic<int64_t> job_id_{0};
  std::atomic<int32_t> attempt_{0};
  PowerSeries power_{kMaxPowerSamples};  // the attempt's power (its thread only)
  // Energy reports while the trainer is silent (the attempt's thread only; null without a
  // meter or between attempts).
  std::unique_ptr<QuietEnergyReports> quiet_;
  std::mutex pg_mu_;
  std::shared_ptr<ProcessGroup> process_group_;  // of the attempt in flight; pg_mu_
  std::string transport_;  // the attempt's ("shm", "gloo", "nccl"); pg_mu_
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_AGENT_ATTEMPT_RUNNER_H_
