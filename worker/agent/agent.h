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
#include "worker/agent/job_log.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/comm/connect.h"
#include "worker/devices/gpu_claim.h"
#include "worker/train/trainer.h"

namespace joule::worker {

struct AgentOptions {
  std::string coordinator = "127.0.0.1:7070";  // host:port of joule-coordinator
  v1::DeviceKind device_kind = v1::DEVICE_KIND_CPU;
  std::string host;                            // shown in `joule workers`; default hostname
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
  // late. Without it a worker partitioned from its coordinator notices only when TCP's
  // retransmissions give up (minutes), and reconnects only at TCP's next retransmission
  // after the network heals (seconds to tens of seconds). The coordinator accepts pings
  // this frequent (server/grpc_services.cc, kMinPingIntervalMs); 0 turns keepalive off.
  std::chrono::milliseconds keepalive_time{5000};
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
  // Durations (energy intervals, phases) and timestamps (heartbeats); not owned.
  const Clock* clock = Clock::Real();

  // INVALID_ARGUMENT naming the bad field.
  absl::Status Validate() const;
};

// The worker's control loop: registers with the coordinator, holds the session (sends
// heartbeats, progress and results; receives assignments and cancels), runs one training
// attempt at a time on its own thread, and reconnects with backoff if the session breaks.
// A session that breaks mid-attempt (a link outage) does not stop the attempt: its
// collectives are peer to peer. The worker abandons a session that carries no word from
// the coordinator for a third of the heartbeat timeout, connects again and asks to resume;
// it stops the attempt when the coordinator refuses (the attempt has ended) or when it has
// had no session for longer than the heartbeat timeout (the coordinator has failed it).
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
  Agent(AgentOptions options, std::shared_ptr<v1::WorkerService::StubInterface> stub);
  // Registers with the coordinator (host, device, memory, energy sources) and keeps the
  // data roots it answers with. Errors: those of the RPC.
  // With `resume`, asks to be the worker it was (worker_id_) for the attempt it holds
  // (job_id_, attempt_).
  absl::StatusOr<v1::RegisterWorkerResponse> Register(bool resume);
  // One session, from registration to the stream's end. Returns how it ended.
  absl::Status RunSession();
  // After a registration that asked to resume: goes on with the attempt when granted,
  // stops it otherwise.
  void FinishResume(const v1::RegisterWorkerResponse& registered);
  // An assignment (starts the training thread, or answers busy) or a cancel.
  void OnCoordinatorMessage(const v1::CoordinatorMessage& message, const std::string& worker_id);
  // The session's stream ended, `last_heard_ms` (steady) after the coordinator's last
  // message: keeps the attempt for a resume, or stops it.
  void EndSession(int64_t last_heard_ms);
  // The session's first messages: the worker's id, then the results kept from earlier
  // sessions.
  void SendHello(const std::string& worker_id);
  void Train(v1::Assignment assignment);
  // What the trainer calls back for attempt `a`: metrics, the rendezvous through `kv`
  // (which, like `a`, must outlive the hooks), progress, cancellation.
  TrainHooks MakeHooks(const v1::Assignment& a, KvClient& kv);
  // Stops the attempt in flight: the flag the trainer polls, and an abort of its
  // process group.
  void CancelTraining();
  // Joins the training thread; exits the process (status 3) if it does not stop within the
  // collective timeout plus 30 s.
  void JoinTraining();
  void Send(const v1::WorkerMessage& message);
  // The process's job-log sink (installed on the default logger once).
  static JobLogSink& JobLog();
  // Sends the lines logged in the attempt that wait (at most JobLogSink::kMaxTake); false
  // when there were none.
  bool SendJobLog();
  // Sends an attempt's result, and keeps it: a write gRPC accepted may still be lost with
  // the connection (a coordinator killed or restarted), so the kept results are sent again
  // at the start of every session, and the coordinator counts each rank once. Keeps the
  // newest kMaxKeptResults.
  void SendResult(v1::WorkerMessage message);
  static constexpr size_t kMaxKeptResults = 16;

  const AgentOptions options_;
  const Clock* const clock_;
  ProcCpuTimes cpu_times_;
  PhaseClock phases_{clock_};
  std::unique_ptr<EnergyMeter> meter_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<HttpServer> http_;
  std::shared_ptr<v1::WorkerService::StubInterface> stub_;  // replaced under mu_
  // Makes a new channel (Create(options) only; null with a caller's stub), the channel of
  // stub_ when it made it (its state goes into a failed registration's error), and
  // whether the next registration uses a new one (a session was abandoned for silence).
  // mu_.
  std::function<std::shared_ptr<grpc::Channel>()> new_channel_;
  std::shared_ptr<grpc::Channel> channel_;
  bool fresh_channel_ = false;
  // GPU workers: the device this worker holds for its life (see GpuClaim).
  std::optional<GpuClaim> gpu_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  grpc::ClientContext* session_ctx_ = nullptr;
  grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>* stream_ = nullptr;
  std::mutex write_mu_;
  std::deque<v1::WorkerMessage> kept_results_;  // guarded by write_mu_
  // A result was sent in the current session (it may not arrive if the session breaks);
  // guarded by write_mu_.
  bool result_in_session_ = false;
  std::vector<std::string> coordinator_roots_;  // data roots it sent; guarded by mu_
  // The id the coordinator gave at the last registration, and its heartbeat timeout (0:
  // a coordinator that neither acknowledges heartbeats nor resumes attempts). Guarded by mu_.
  std::string worker_id_;
  std::chrono::milliseconds heartbeat_timeout_{0};
  // Set when a session ended mid-attempt: the attempt goes on, and the next registration
  // asks to resume it, until heartbeat_timeout_ has passed. Guarded by mu_.
  std::optional<std::chrono::steady_clock::time_point> session_lost_at_;

  // The attempt in flight.
  std::thread training_;
  std::atomic<bool> training_active_{false};
  std::atomic<bool> cancel_{false};
  // A graceful stop (CancelAttempt.checkpoint) of a budgeted job: the ranks agree on a
  // step and checkpoint there (TrainHooks::stop_requested).
  std::atomic<bool> stop_requested_{false};
  // Set by the session thread before training_active_; read by the heartbeat thread.
  std::atomic<int64_t> job_id_{0};
  std::atomic<int32_t> attempt_{0};
  bool budgeted_ = false;  // the attempt's spec has an energy budget (session thread)
  PowerSeries power_{kMaxPowerSamples};  // the attempt's power (training thread)
  std::mutex pg_mu_;
  std::shared_ptr<ProcessGroup> process_group_;  // of the attempt in flight
  std::string transport_;  // the attempt's ("shm", "gloo", "nccl"); guarded by pg_mu_
  std::mutex log_send_mu_;  // SendJobLog's take-and-send
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_AGENT_AGENT_H_
