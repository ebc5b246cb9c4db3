#ifndef JOULE_WORKER_AGENT_AGENT_H_
#define JOULE_WORKER_AGENT_AGENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "joule/v1/worker.grpc.pb.h"
#include "common/energy_report.h"
#include "common/http_server.h"
#include "common/security.h"
#include "worker/energy/energy_meter.h"
#include "worker/energy/power_series.h"
#include "worker/agent/attempt_runner.h"
#include "worker/agent/job_log.h"
#include "worker/agent/session.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/comm/connect.h"
#include "worker/devices/gpu_claim.h"
#include "worker/train/trainer.h"

namespace joule::worker {

struct AgentOptions {
  // host:port of joule-coordinator; with standby coordinators, each one's, comma-separated.
  std::string coordinator = "127.0.0.1:7070";
  v1::DeviceKind device_kind = v1::DEVICE_KIND_CPU;
  std::string host;                            // shown in `joule workers`; default hostname
  // The grid region it draws power from (RegisterWorkerRequest.region); empty: the
  // coordinator's.
  std::string region;
  std::string gloo_hostname = "127.0.0.1";     // address peers reach this rank's Gloo on
  // How ranks exchange gradients: shared memory when a gang is on one host ("auto"), or
  // always Gloo over TCP ("gloo"), or shared memory only ("shm"). See comm/connect.h.
  Transport transport = Transport::kAuto;
  // GPU workers: the CUDA device to train on; negative: the first one no other worker on
  // this host holds (GpuClaim). Held for the worker's life; only it is metered.
  int cuda_device = -1;
  // Bound on rendezvous and each collective; a dead peer fails the attempt after this.
  std::chrono::milliseconds collective_timeout{60000};
  // Reconnect backoff after a lost session: starts here, doubles, capped at 5 s.
  std::chrono::milliseconds reconnect_backoff{200};
  // HTTP/2 keepalive on the channel to the coordinator: a ping after `keepalive_time`
  // without a frame received, the connection closed when its ack is `keepalive_timeout`
  // late (and gRPC sets the socket's TCP_USER_TIMEOUT to it: a heartbeat written into a
  // dead link ends the connection that long after). The acks to the worker's heartbeats
  // are the frames that keep pings away: the session's own silence limit (a third of the
  // heartbeat timeout, or two intervals) notices a silent coordinator first; the pings
  // are for a coordinator that answers heartbeats more than 30 s apart. Each ping costs the
  // coordinator a wakeup (as much as a heartbeat), so they are not more frequent. The
  // coordinator accepts pings down to 4 s apart (server/coordinator_server.cc,
  // kMinPingIntervalMs); 0 turns keepalive off.
  std::chrono::milliseconds keepalive_time{30000};
  std::chrono::milliseconds keepalive_timeout{5000};
  TrainerOptions trainer;
  // Where /metrics is served ("127.0.0.1:0": a free port); empty: not served.
  std::string metrics_address = "127.0.0.1:0";
  // Energy sampling period; 0 turns metering off.
  std::chrono::milliseconds energy_period{100};
  EnergyOptions energy;
  // TLS to the coordinator (plain text only with tls.insecure to a loopback address) and
  // the join token it asks of workers.
  ClientTls tls;
  std::string join_token;
  // The BLAS its CPU GEMMs run on, settled at start (worker/blas/blas_startup.h); sent with
  // the registration.
  v1::BlasInfo blas;
  // Durations (energy intervals, phases) and timestamps (heartbeats); not owned.
  const Clock* clock = Clock::Real();

  // INVALID_ARGUMENT naming the bad field.
  absl::Status Validate() const;
};

// The worker process's runtime: the GPU it holds, its energy meter, /metrics, and the
// two parts that do the work: the session with the coordinator (agent/session.h:
// registration, heartbeats, reconnects, resuming an attempt through an outage) and the
// attempt runner (agent/attempt_runner.h: one training attempt at a time on its own
// thread, its progress, energy and result).
//
// Run() blocks the calling thread; Stop() may be called from any thread (e.g. a signal
// handler thread) and makes Run() return.
class Agent {
 public:
  // Opens the energy sources, starts the meter and serves /metrics; talks to the
  // coordinator at options.coordinator over options.tls.
  // Errors: INVALID_ARGUMENT (options), UNAVAILABLE when the metrics address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<Agent>> Create(AgentOptions options);
  // The same over a stub the caller made (e.g. on an in-process channel, in tests):
  // options.coordinator and options.tls are not used.
  static absl::StatusOr<std::unique_ptr<Agent>> Create(
      AgentOptions options, std::shared_ptr<v1::WorkerService::StubInterface> stub);
  ~Agent();
  // host:port of /metrics, or empty.
  std::string metrics_address() const;
  void Run();
  void Stop();

 private:
  explicit Agent(AgentOptions options);
  // Validates the options, claims the GPU, serves /metrics and starts the meter.
  static absl::StatusOr<std::unique_ptr<Agent>> CreateRuntime(AgentOptions options);
  // The session and the runner, over `stub` (and `new_channel` to replace its channel).
  void Wire(std::shared_ptr<v1::WorkerService::StubInterface> stub,
            std::function<std::shared_ptr<grpc::Channel>()> new_channel,
            std::shared_ptr<grpc::Channel> channel);

  const AgentOptions options_;
  const Clock* const clock_;
  ProcCpuTimes cpu_times_;
  PhaseClock phases_{clock_};
  std::shared_ptr<NodeEnergyPoller> node_;  // whole-node power (BMC), when configured
  std::unique_ptr<EnergyMeter> meter_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<HttpServer> http_;
  // GPU workers: the device this worker holds for its life (see GpuClaim).
  std::optional<GpuClaim> gpu_;
  // The runner is the session's attempt and the session the runner's outbox: the runner
  // goes first (its thread joined) when the agent is destroyed.
  std::unique_ptr<CoordinatorSession> session_;
  std::unique_ptr<AttemptRunner> runner_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_AGENT_AGENT_H_
