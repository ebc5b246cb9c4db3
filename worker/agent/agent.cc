#include "worker/agent/agent.h"

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/names.h"
#include "common/text.h"
#include "worker/agent/grpc_kv_client.h"
#include "worker/comm/gloo_process_group.h"

namespace joule::worker {
namespace {

// A channel's connectivity state as words, for log lines.
const char* ConnectivityName(grpc_connectivity_state state) {
  switch (state) {
    case GRPC_CHANNEL_IDLE: return "idle";
    case GRPC_CHANNEL_CONNECTING: return "connecting";
    case GRPC_CHANNEL_READY: return "ready";
    case GRPC_CHANNEL_TRANSIENT_FAILURE: return "failed";
    case GRPC_CHANNEL_SHUTDOWN: return "shut down";
  }
  return "unknown";
}

// Milliseconds on the steady clock: how long the session has been silent.
int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// MemAvailable of /proc/meminfo, bytes: what a job may allocate without swapping
// (proc(5)); 0 when it cannot be read.
int64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

absl::Status AgentOptions::Validate() const {
  if (!host.empty()) {
    if (absl::Status s = CheckText("host", host, 253); !s.ok()) return s;
  }
  if (coordinator.empty()) return absl::InvalidArgumentError("coordinator address is empty");
  if (gloo_hostname.empty()) return absl::InvalidArgumentError("gloo hostname is empty");
  if (collective_timeout.count() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective timeout ", collective_timeout.count(), " ms is not positive"));
  }
  if (energy_period.count() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("energy period ", energy_period.count(), " ms is negative"));
  }
  if (energy.estimate.watts_per_busy_core < 0 || energy.estimate.idle_watts < 0) {
    return absl::InvalidArgumentError("estimated watts per busy core and idle watts must be >= 0");
  }
  if (trainer.default_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads ", trainer.default_threads, " is less than 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto creds = MakeChannelCredentials(options.tls, options.coordinator);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  if (options.keepalive_time.count() > 0) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options.keepalive_time.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                static_cast<int>(options.keepalive_timeout.count()));
    // Pings also between sessions and while the worker has nothing to send.
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  // A lost connection is retried every second at first and never more than 2 s apart, and
  // a connection attempt (a SYN into a partition) is given up after 2 s: once the network
  // heals, the worker is back within about 2 s, not at gRPC's default backoff (up to 120 s)
  // or connect timeout (20 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  // Each channel its own connection (not gRPC's process-wide subchannel pool): a session
  // abandoned for silence is retried on a new channel, hence a new TCP connection, not on
  // the old one, which TCP's retransmission backoff may hold for seconds after the link
  // is back.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  const std::string target = options.coordinator;
  std::shared_ptr<grpc::ChannelCredentials> channel_creds = *creds;
  auto new_channel = [target, channel_creds, args] {
    return grpc::CreateCustomChannel(target, channel_creds, args);
  };
  std::shared_ptr<grpc::Channel> channel = new_channel();
  absl::StatusOr<std::unique_ptr<Agent>> agent =
      Create(std::move(options), v1::WorkerService::NewStub(channel));
  if (agent.ok()) {
    (*agent)->new_channel_ = new_channel;
    (*agent)->channel_ = channel;
  }
  return agent;
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(
    AgentOptions options, std::shared_ptr<v1::WorkerService::StubInterface> stub) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  // A GPU worker holds one device for its life (not its rank's position in each gang), and
  // meters that device only.
  std::optional<GpuClaim> gpu;
  if (options.device_kind == v1::DEVICE_KIND_GPU) {
    absl::StatusOr<std::vector<std::string>> ids = CudaDeviceBusIds();
    if (!ids.ok()) return ids.status();
    absl::StatusOr<GpuClaim> claim = GpuClaim::Claim(options.cuda_device, *ids);
    if (!claim.ok()) return claim.status();
    options.energy.gpu_pci_bus_id = claim->bus_id();
    options.energy.gpu_device = absl::StrCat("gpu-", claim->device());
    spdlog::info("training on CUDA device {} (PCI {})", claim->device(), claim->bus_id());
    gpu = std::move(*claim);
  }
  (void)JobLog();  // installed before any thread of the agent logs
  std::unique_ptr<Agent> agent(new Agent(std::move(options), std::move(stub)));
  agent->gpu_ = std::move(gpu);
  const AgentOptions& o = agent->options_;
  agent->registry_ = std::make_shared<prometheus::Registry>();
  agent->metrics_ = std::make_unique<WorkerMetrics>(agent->registry_);
  if (!o.metrics_address.empty()) {
    agent->http_ = std::make_unique<HttpServer>();
    agent->http_->ServeMetrics("/metrics", agent->registry_);
    if (absl::Status s = agent->http_->Start(o.metrics_address); !s.ok()) return s;
    spdlog::info("serving metrics on http://{}/metrics", agent->metrics_address());
  }
  if (o.energy_period.count() > 0) {
    agent->meter_ = std::make_unique<EnergyMeter>(
        OpenPowerSources(o.energy, &agent->cpu_times_, agent->clock_), &agent->phases_,
        &agent->cpu_times_, agent->clock_);
    agent->metrics_->SetDevices(agent->meter_->channels());
    WorkerMetrics* metrics = agent->metrics_.get();
    agent->meter_->SetListener([metrics](const EnergySample& s) { metrics->OnEnergy(s); });
    agent->meter_->Start(o.energy_period);
  }
  return agent;
}

std::string Agent::metrics_address() const {
  if (!http_) return "";
  const std::string& a = http_->address();
  // A wildcard bind is reachable at the address peers use for this host.
  if (a.rfind("0.0.0.0:", 0) == 0) return options_.gloo_hostname + a.substr(7);
  return a;
}

Agent::Agent(AgentOptions options, std::shared_ptr<v1::WorkerService::StubInterface> stub)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      stub_(std::move(stub)) {}

Agent::~Agent() {
  Stop();
  JoinTraining();
  if (meter_) meter_->Stop();
}

void Agent::JoinTraining() {
  if (!training_.joinable()) return;
  // A training thread stuck outside any collective (a hung file system, a driver) would
  // hold this worker forever: give it the collective timeout and a grace period, then
  // exit so that whatever supervises the worker starts a fresh one.
  const auto deadline =
      std::chrono::steady_clock::now() + options_.collective_timeout + std::chrono::seconds(30);
  while (training_active_ && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (training_active_) {
    spdlog::critical("job {} attempt {}: the training thread did not stop within {} ms of "
                     "being cancelled; exiting",
                     job_id_.load(), attempt_.load(),
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         options_.collective_timeout + std::chrono::seconds(30))
                         .count());
    std::_Exit(3);
  }
  training_.join();
}

JobLogSink& Agent::JobLog() {
  // One sink on the process's logger, whatever the number of agents (tests run several).
  static const std::shared_ptr<JobLogSink> sink = [] {
    auto created = std::make_shared<JobLogSink>();
    spdlog::default_logger()->sinks().push_back(created);
    return created;
  }();
  return *sink;
}

bool Agent::SendJobLog() {
  // Taken and sent as one step: the training thread's last drain must not overtake lines
  // the heartbeat thread took (they would reach the coordinator after the result).
  std::lock_guard<std::mutex> lock(log_send_mu_);
  {
    // Without a session the lines wait for the next one (a resumed attempt's).
    std::lock_guard<std::mutex> write(write_mu_);
    if (stream_ == nullptr) return false;
  }
  JobLogSink::Taken t = JobLog().Take();
  if (t.lines.empty() && t.dropped == 0) return false;
  v1::WorkerMessage m;
  v1::LogReport* r = m.mutable_log();
  r->set_job_id(t.job_id);
  r->set_attempt(t.attempt);
  r->set_dropped(t.dropped);
  for (v1::LogLine& l : t.lines) *r->add_lines() = std::move(l);
  Send(m);
  return true;
}

void Agent::CancelTraining() {
  cancel_ = true;
  // Leave a collective a peer will never join now, instead of waiting for its timeout.
  std::lock_guard<std::mutex> lock(pg_mu_);
  if (process_group_) process_group_->Abort();
}

void Agent::Stop() {
  CancelTraining();
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  if (session_ctx_) session_ctx_->TryCancel();
  cv_.notify_all();
}

void Agent::Run() {
  auto backoff = options_.reconnect_backoff;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    auto started = std::chrono::steady_clock::now();
    absl::Status s = RunSession();
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) break;
    if (std::chrono::steady_clock::now() - started > std::chrono::seconds(10)) {
      backoff = options_.reconnect_backoff;  // the session was healthy for a while
    }
    if (session_lost_at_) {
      const auto without = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - *session_lost_at_);
      if (without <= heartbeat_timeout_) {
        // An attempt waits on us: try again soon (the channel's own backoff paces the
        // connection attempts, AgentOptions' reconnect arguments).
        spdlog::warn("session with {} ended: {}; {} ms since the coordinator was heard, of "
                     "the {} its attempt waits; reconnecting",
                     options_.coordinator, s.ToString(), without.count(),
                     heartbeat_timeout_.count());
        cv_.wait_for(lock, options_.reconnect_backoff, [&] { return stopping_; });
        continue;
      }
      session_lost_at_.reset();
      lock.unlock();
      if (training_active_) {
        spdlog::warn("job {} attempt {}: the coordinator unheard for {} ms, longer than its "
                     "heartbeat timeout ({} ms): it has ended the attempt; stopping it",
                     job_id_.load(), attempt_.load(), without.count(),
                     heartbeat_timeout_.count());
        CancelTraining();
        JoinTraining();
      }
      lock.lock();
      if (stopping_) break;
    }
    spdlog::warn("session with {} ended: {}; reconnecting in {} ms", options_.coordinator,
                 s.ToString(), backoff.count());
    cv_.wait_for(lock, backoff, [&] { return stopping_; });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
  JoinTraining();
}

void Agent::Send(const v1::WorkerMessage& message) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stream_) stream_->Write(message);
}

void Agent::SendResult(v1::WorkerMessage message) {
  // Text in a result quotes user data (a CSV cell, a file name): the coordinator cannot
  // parse a message whose strings are not UTF-8 and would drop the whole session.
  v1::RankResult* r = message.mutable_result()->mutable_result();
  r->set_error(SanitizeUtf8(r->error(), 4096));
  for (std::string& w : *r->mutable_energy_warnings()) w = SanitizeUtf8(w, 1024);
  for (v1::EnergyRecord& e : *r->mutable_energy()) {
    e.set_device(SanitizeUtf8(e.device(), 128));
  }
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stream_) stream_->Write(message);
  result_in_session_ = true;
  kept_results_.push_back(std::move(message));
  while (kept_results_.size() > kMaxKeptResults) kept_results_.pop_front();
}

absl::StatusOr<v1::RegisterWorkerResponse> Agent::Register(bool resume) {
  v1::RegisterWorkerRequest reg;
  if (resume) {
    std::lock_guard<std::mutex> lock(mu_);
    reg.set_resume_worker_id(worker_id_);
    reg.set_resume_job_id(job_id_);
    reg.set_resume_attempt(attempt_);
  }
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  reg.set_host(options_.host.empty() ? hostname : options_.host);
  reg.set_device_kind(options_.device_kind);
  reg.set_cores(static_cast<int32_t>(std::thread::hardware_concurrency()));
  reg.set_pid(getpid());
  reg.set_metrics_address(metrics_address());
  reg.set_memory_bytes(AvailableMemoryBytes());
  if (meter_) {
    for (const std::string& name : meter_->source_names()) reg.add_energy_sources(name);
  }
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext ctx;
    AddBearer(&ctx, options_.join_token);
    // Resuming: no later than the attempt's deadline, so that the worker stops an attempt
    // the coordinator has ended on time (Run), not a connection timeout later.
    // Each try is short (1.5 s) and, after a failed one, on a new channel: a new
    // connection attempt, whose SYN goes out as soon as the link is back, instead of one
    // waiting out its own retransmission backoff.
    std::chrono::milliseconds wait = std::chrono::seconds(5);
    if (resume) {
      std::lock_guard<std::mutex> lock(mu_);
      if (session_lost_at_) {
        wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                              *session_lost_at_ + heartbeat_timeout_ -
                              std::chrono::steady_clock::now()),
                          std::chrono::milliseconds(100), std::chrono::milliseconds(1500));
      }
    }
    ctx.set_deadline(std::chrono::system_clock::now() + wait);
    ctx.set_wait_for_ready(true);
    std::shared_ptr<v1::WorkerService::StubInterface> stub;
    std::shared_ptr<grpc::Channel> channel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fresh_channel_ && new_channel_) {
        channel_ = new_channel_();
        stub_ = v1::WorkerService::NewStub(channel_);
      }
      fresh_channel_ = false;
      stub = stub_;
      channel = channel_;
    }
    grpc::Status s = stub->RegisterWorker(&ctx, reg, &registered);
    if (!s.ok()) {
      if (resume) {
        std::lock_guard<std::mutex> lock(mu_);
        fresh_channel_ = true;
      }
      absl::Status failed = FromGrpcStatus(s);
      if (channel == nullptr || (!absl::IsUnavailable(failed) && !absl::IsDeadlineExceeded(failed))) {
        return failed;  // the coordinator answered: its refusal says why
      }
      // No answer: whether a connection was made at all (a link still down and a
      // coordinator that does not answer look alike otherwise).
      return absl::Status(failed.code(), absl::StrCat(failed.message(), " (connection ",
                                                      ConnectivityName(channel->GetState(false)),
                                                      ")"));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    coordinator_roots_.assign(registered.data_roots().begin(), registered.data_roots().end());
    worker_id_ = registered.worker_id();
    heartbeat_timeout_ = std::chrono::milliseconds(std::max(0, registered.heartbeat_timeout_ms()));
  }
  return registered;
}

void Agent::SendHello(const std::string& worker_id) {
  v1::WorkerMessage hello;
  hello.set_hello_worker_id(worker_id);
  Send(hello);
  // Results an earlier session may not have delivered (the attempt ended with it).
  std::lock_guard<std::mutex> lock(write_mu_);
  for (const v1::WorkerMessage& m : kept_results_) {
    if (stream_ == nullptr || !stream_->Write(m)) break;
  }
}

void Agent::FinishResume(const v1::RegisterWorkerResponse& registered) {
  std::chrono::milliseconds without{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    without = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - *session_lost_at_);
    session_lost_at_.reset();
  }
  if (registered.resumed()) {
    spdlog::info("job {} attempt {}: resumed as worker {} after {} ms without a session",
                 job_id_.load(), attempt_.load(), registered.worker_id(), without.count());
  } else if (training_active_) {
    spdlog::warn("job {} attempt {}: the coordinator did not resume it (it has ended); "
                 "stopping it",
                 job_id_.load(), attempt_.load());
    CancelTraining();
    JoinTraining();
  }
}

void Agent::OnCoordinatorMessage(const v1::CoordinatorMessage& message,
                                 const std::string& worker_id) {
  if (message.has_assignment()) {
    const v1::Assignment& a = message.assignment();
    if (training_active_) {
      v1::WorkerMessage m;
      m.mutable_result()->set_job_id(a.job_id());
      m.mutable_result()->set_attempt(a.attempt());
      m.mutable_result()->mutable_result()->set_ok(false);
      m.mutable_result()->mutable_result()->set_error(
          absl::StrCat("worker ", worker_id, " is still busy with job ", job_id_.load()));
      Send(m);
      return;
    }
    if (training_.joinable()) training_.join();
    job_id_ = a.job_id();
    attempt_ = a.attempt();
    budgeted_ = a.spec().energy_budget_joules() > 0;
    cancel_ = false;
    stop_requested_ = false;
    training_active_ = true;
    training_ = std::thread(&Agent::Train, this, a);
  } else if (message.has_cancel()) {
    const v1::CancelAttempt& c = message.cancel();
    if (training_active_ && c.job_id() == job_id_ && c.attempt() == attempt_) {
      if (c.checkpoint() && budgeted_) {
        spdlog::info("job {} attempt {}: asked to stop after a checkpoint: {}", c.job_id(),
                     c.attempt(), c.reason());
        stop_requested_ = true;
      } else {
        spdlog::info("job {} attempt {}: cancelled by the coordinator: {}", c.job_id(),
                     c.attempt(), c.reason());
        CancelTraining();
      }
    }
  }
}

void Agent::EndSession(int64_t last_heard_ms) {
  // The session is over. An attempt in flight goes on while the worker connects again to
  // resume it (the coordinator waits its heartbeat timeout for that), unless the worker is
  // stopping or the coordinator resumes nothing.
  bool keep = false;
  bool sent_result = false;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    sent_result = result_in_session_;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Also when the attempt ended in this session: its result may not have arrived, and
    // only the worker the coordinator still waits on can deliver it in time.
    keep = (training_active_ || sent_result) && !stopping_ &&
           heartbeat_timeout_.count() > 0;
    // Timed from the last word heard, as the coordinator times its heartbeat timeout from
    // the last heartbeat it heard.
    if (keep) {
      session_lost_at_ =
          std::chrono::steady_clock::time_point(std::chrono::milliseconds(last_heard_ms));
    }
  }
  if (keep) {
    spdlog::warn("job {} attempt {}: the session ended mid-attempt; {} while the worker "
                 "connects again to resume it (within {} ms)",
                 job_id_.load(), attempt_.load(),
                 training_active_ ? "training goes on" : "its result is kept",
                 heartbeat_timeout_.count());
  } else {
    CancelTraining();
    JoinTraining();
  }
}

absl::Status Agent::RunSession() {
  bool resume = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resume = session_lost_at_.has_value();
  }
  absl::StatusOr<v1::RegisterWorkerResponse> registered_or = Register(resume);
  if (!registered_or.ok()) return registered_or.status();
  const v1::RegisterWorkerResponse& registered = *registered_or;
  const std::string worker_id = registered.worker_id();
  const auto heartbeat_interval =
      std::chrono::milliseconds(std::max(100, registered.heartbeat_interval_ms()));
  if (resume) FinishResume(registered);
  // No word from the coordinator (its acks to our heartbeats) for this long: the session
  // is abandoned and a new connection made, rather than waiting for TCP to retransmit
  // into a link that came back (its backoff reaches seconds) while the coordinator's
  // heartbeat timeout runs. Off for a coordinator that does not acknowledge heartbeats.
  const std::chrono::milliseconds silence_limit =
      registered.heartbeat_timeout_ms() > 0
          ? std::max(2 * heartbeat_interval,
                     std::chrono::milliseconds(registered.heartbeat_timeout_ms() / 3))
          : std::chrono::milliseconds(0);
  std::atomic<int64_t> last_heard_ms{SteadyMs()};

  grpc::ClientContext ctx;
  AddBearer(&ctx, options_.join_token);
  std::shared_ptr<v1::WorkerService::StubInterface> stub;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stub = stub_;
  }
  auto stream = stub->Session(&ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::CancelledError("stopping");
    session_ctx_ = &ctx;
  }
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_ = stream.get();
    result_in_session_ = false;
  }
  SendHello(worker_id);
  spdlog::info("registered with {} as {}", options_.coordinator, worker_id);

  std::atomic<bool> session_done{false};
  std::thread heartbeats([&] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!session_done && !stopping_) {
      cv_.wait_for(lock, heartbeat_interval);
      if (session_done || stopping_) break;
      if (const int64_t silent = SteadyMs() - last_heard_ms;
          silence_limit.count() > 0 && silent > silence_limit.count()) {
        spdlog::warn("no word from {} for {} ms (the limit is a third of its {} ms heartbeat "
                     "timeout): abandoning the session to connect again",
                     options_.coordinator, silent, registered.heartbeat_timeout_ms());
        ctx.TryCancel();
        fresh_channel_ = true;  // under mu_: the next registration connects anew
        break;
      }
      lock.unlock();
      v1::WorkerMessage m;
      m.mutable_heartbeat()->set_unix_ms(clock_->UnixMs());
      if (training_active_) {
        m.mutable_heartbeat()->set_job_id(job_id_);
        m.mutable_heartbeat()->set_attempt(attempt_);
        m.mutable_heartbeat()->set_phase(RankPhaseOf(phases_.current()));
      }
      Send(m);
      SendJobLog();
      lock.lock();
    }
  });

  v1::CoordinatorMessage message;
  while (stream->Read(&message)) {
    last_heard_ms = SteadyMs();
    OnCoordinatorMessage(message, worker_id);
  }
  EndSession(last_heard_ms.load());
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_done = true;
    session_ctx_ = nullptr;
    cv_.notify_all();
  }
  heartbeats.join();
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_ = nullptr;
  }
  grpc::Status s = stream->Finish();
  return s.ok() ? absl::UnavailableError("the coordinator closed the session")
                : FromGrpcStatus(s);
}

TrainHooks Agent::MakeHooks(const v1::Assignment& a, KvClient& kv) {
  TrainHooks hooks;
  hooks.phases = &phases_;
  hooks.on_step = [this](int64_t samples, double seconds, double loss) {
    metrics_->OnStep(samples, seconds, loss);
  };
  hooks.on_collective = [this](const char* op, int64_t bytes, double seconds) {
    metrics_->OnCollective(op, bytes, seconds);
  };
  hooks.connect = [&]() -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
    ConnectOptions connect;
    connect.transport = options_.transport;
    connect.gpu = a.spec().device_kind() == v1::DEVICE_KIND_GPU;
    connect.cuda_device = gpu_ ? gpu_->device() : options_.cuda_device;
    connect.gloo.hostname = options_.gloo_hostname;
    connect.gloo.timeout = options_.collective_timeout;
    Transport chosen = Transport::kGloo;
    auto pg = ConnectProcessGroup(a.rank(), a.world_size(), kv, connect, &chosen);
    if (!pg.ok()) return pg.status();
    spdlog::info("job {} attempt {}: rank {} connected over {}", a.job_id(), a.attempt(),
                 a.rank(), TransportName(chosen));
    {
      std::lock_guard<std::mutex> lock(pg_mu_);
      transport_ = TransportName(chosen);
    }
    std::shared_ptr<ProcessGroup> shared(*std::move(pg));
    {
      std::lock_guard<std::mutex> lock(pg_mu_);
      process_group_ = shared;
      if (cancel_) shared->Abort();  // cancelled while connecting
    }
    return shared;
  };
  hooks.allgather = [&](const std::string& value) {
    return KvAllgather(kv, "allgather", a.rank(), a.world_size(), value,
                       options_.collective_timeout);
  };
  hooks.cancelled = [this] { return cancel_.load(); };
  hooks.stop_requested = [this] { return stop_requested_.load(); };
  hooks.energy_joules = [this] {
    if (!meter_) return 0.0;
    meter_->Sample();  // an epoch's end: charge the interval up to now
    return meter_->JobTotals().total_joules;
  };
  hooks.on_progress = [&](const v1::RankProgress& p) {
    metrics_->OnProgress(p.epoch(), p.test_accuracy());
    v1::WorkerMessage m;
    m.mutable_progress()->set_job_id(a.job_id());
    m.mutable_progress()->set_attempt(a.attempt());
    m.mutable_progress()->set_rank(a.rank());
    *m.mutable_progress()->mutable_progress() = p;
    {
      std::lock_guard<std::mutex> lock(pg_mu_);
      m.mutable_progress()->mutable_progress()->set_transport(transport_);
    }
    if (meter_) {
      JobEnergy e = meter_->JobTotals();
      m.mutable_progress()->mutable_progress()->set_energy_joules(e.total_joules);
      m.mutable_progress()->mutable_progress()->set_power_watts(e.watts);
      m.mutable_progress()->mutable_progress()->set_energy_estimated(e.estimated);
      power_.Add(p.elapsed_seconds(), e.total_joules);
    }
    Send(m);
  };
  return hooks;
}

void Agent::Train(v1::Assignment a) {
  JobLog().Bind(a.job_id(), a.attempt());  // what it logs from here is the job's
  spdlog::info("job {} attempt {}: rank {} of {}: {} on {}, local batch {}", a.job_id(),
               a.attempt(), a.rank(), a.world_size(), a.spec().model(), a.spec().dataset(),
               a.spec().local_batch_size());
  const std::string job = std::to_string(a.job_id()), rank = std::to_string(a.rank());
  if (meter_) meter_->BeginJob(job, rank);
  metrics_->BindJob(job, rank);
  std::shared_ptr<v1::WorkerService::StubInterface> stub;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stub = stub_;
  }
  GrpcKvClient kv(stub, a.rendezvous_prefix(), options_.join_token);
  power_ = PowerSeries(kMaxPowerSamples);
  {
    std::lock_guard<std::mutex> lock(pg_mu_);
    transport_.clear();
  }
  const Clock::TimePoint attempt_start = clock_->Now();
  TrainHooks hooks = MakeHooks(a, kv);
  // Files a job names are opened beneath this worker's own roots, or else beneath the
  // coordinator's: a path swapped after submit cannot lead outside them.
  TrainerOptions trainer = options_.trainer;
  trainer.clock = clock_;  // the agent's: its meter and the trainer time alike
  if (trainer.allowed_roots.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    trainer.allowed_roots = coordinator_roots_;
  }
  v1::RankResult result = RunTraining(a, trainer, hooks);
  {
    std::lock_guard<std::mutex> lock(pg_mu_);
    process_group_.reset();
  }
  phases_.Enter(Phase::kIdle);
  metrics_->EndJob();
  if (!result.ok() && cancel_) result.set_cancelled(true);
  result.set_devices(1);
  result.set_rank(a.rank());  // names the rank when it is delivered late
  if (meter_) {
    JobEnergy e = meter_->EndJob();
    for (const EnergyEntry& entry : e.entries) {
      v1::EnergyRecord* r = result.add_energy();
      r->set_rank(a.rank());
      r->set_device(entry.device);
      r->set_source(entry.source);
      r->set_phase(entry.phase);
      r->set_joules(entry.joules);
    }
    for (const std::string& w : e.warnings) result.add_energy_warnings(w);
    power_.Add(Seconds(clock_->Now() - attempt_start), e.total_joules);
    for (const v1::PowerSample& p : power_.samples()) *result.add_power() = p;
  }
  if (result.ok()) {
    spdlog::info("job {} attempt {}: rank {} done: accuracy {:.4f}, {} samples in {:.2f} s",
                 a.job_id(), a.attempt(), a.rank(), result.test_accuracy(), result.samples(),
                 result.train_seconds());
  } else {
    spdlog::warn("job {} attempt {}: rank {} ended: {}", a.job_id(), a.attempt(), a.rank(),
                 result.error());
  }
  // The attempt's last lines go before its result (the coordinator takes lines only from a
  // worker still running the attempt).
  JobLog().Unbind();
  while (SendJobLog()) {
  }
  v1::WorkerMessage m;
  m.mutable_result()->set_job_id(a.job_id());
  m.mutable_result()->set_attempt(a.attempt());
  m.mutable_result()->set_job_uid(a.job_uid());
  *m.mutable_result()->mutable_result() = result;
  // Idle before the coordinator hears of it: it may assign the next job at once, and the
  // session thread joins this thread before starting that one.
  training_active_ = false;
  SendResult(std::move(m));
}

}  // namespace joule::worker
