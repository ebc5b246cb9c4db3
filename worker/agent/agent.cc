#include "worker/agent/agent.h"

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/text.h"
#include "worker/agent/grpc_kv_client.h"

namespace joule::worker {

absl::Status AgentOptions::Validate() const {
  if (!host.empty()) {
    if (absl::Status s = CheckText("host", host, 253); !s.ok()) return s;
  }
  for (absl::string_view target : absl::StrSplit(coordinator, ',')) {
    if (absl::StripAsciiWhitespace(target).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinator address '", coordinator, "' is empty or has an empty entry"));
    }
  }
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
  // Several coordinators (a leader and its standbys, server/ha_coordinator.h): one address
  // each, comma-separated. Each channel made after a failed registration goes to the next.
  std::vector<std::string> targets;
  for (absl::string_view target : absl::StrSplit(options.coordinator, ',')) {
    targets.emplace_back(absl::StripAsciiWhitespace(target));
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds;
  for (const std::string& target : targets) {
    creds = MakeChannelCredentials(options.tls, target);  // the same for each; checks each
    if (!creds.ok()) return creds.status();
  }
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
  std::shared_ptr<grpc::ChannelCredentials> channel_creds = *creds;
  auto next = std::make_shared<std::atomic<size_t>>(0);
  auto new_channel = [targets, channel_creds, args, next] {
    return grpc::CreateCustomChannel(targets[next->fetch_add(1) % targets.size()], channel_creds,
                                     args);
  };
  std::shared_ptr<grpc::Channel> channel = new_channel();
  absl::StatusOr<std::unique_ptr<Agent>> agent = CreateRuntime(std::move(options));
  if (agent.ok()) (*agent)->Wire(v1::WorkerService::NewStub(channel), new_channel, channel);
  return agent;
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(
    AgentOptions options, std::shared_ptr<v1::WorkerService::StubInterface> stub) {
  if (stub == nullptr) return absl::InvalidArgumentError("no stub to the coordinator");
  absl::StatusOr<std::unique_ptr<Agent>> agent = CreateRuntime(std::move(options));
  if (agent.ok()) (*agent)->Wire(std::move(stub), nullptr, nullptr);
  return agent;
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::CreateRuntime(AgentOptions options) {
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
  (void)ProcessJobLog();  // installed before any thread of the agent logs
  std::unique_ptr<Agent> agent(new Agent(std::move(options)));
  agent->gpu_ = std::move(gpu);
  const AgentOptions& o = agent->options_;
  agent->registry_ = std::make_shared<prometheus::Registry>();
  agent->metrics_ = std::make_unique<WorkerMetrics>(agent->registry_);
  agent->metrics_->SetBlas(o.blas);
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
    if (!o.energy.redfish.url.empty() || o.energy.ipmi_dcmi) {
      absl::StatusOr<std::unique_ptr<NodePowerReader>> bmc = !o.energy.redfish.url.empty()
                                                                 ? OpenRedfish(o.energy.redfish)
                                                                 : OpenIpmiDcmi(o.energy.ipmi);
      if (bmc.ok()) {
        spdlog::info("energy: node: {} every {} ms", (*bmc)->Describe(),
                     o.energy.node_period.count());
        agent->node_ = std::make_shared<NodeEnergyPoller>(
            *std::move(bmc), agent->clock_, o.energy.node_period, 5 * o.energy.node_period);
        if (!o.energy.node_shared_dir.empty()) {
          if (absl::Status s = agent->node_->SetShared(o.energy.node_shared_dir); !s.ok()) {
            spdlog::warn("energy: {}; this worker polls the BMC itself", s.ToString());
          }
        }
        agent->node_->Start();
        agent->meter_->SetNode(agent->node_);
      } else {
        spdlog::warn("energy: node: no whole-node power: {}", bmc.status().ToString());
      }
    }
    agent->meter_->Start(o.energy_period);
  }
  return agent;
}

void Agent::Wire(std::shared_ptr<v1::WorkerService::StubInterface> stub,
                 std::function<std::shared_ptr<grpc::Channel>()> new_channel,
                 std::shared_ptr<grpc::Channel> channel) {
  SessionOptions session;
  session.coordinator = options_.coordinator;
  session.join_token = options_.join_token;
  session.reconnect_backoff = options_.reconnect_backoff;
  session.clock = clock_;
  v1::RegisterWorkerRequest& reg = session.registration;
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  reg.set_host(options_.host.empty() ? hostname : options_.host);
  reg.set_device_kind(options_.device_kind);
  reg.set_region(options_.region);
  reg.set_cores(static_cast<int32_t>(std::thread::hardware_concurrency()));
  reg.set_pid(getpid());
  reg.set_metrics_address(metrics_address());
  *reg.mutable_blas() = options_.blas;
  if (meter_) {
    for (const std::string& name : meter_->source_names()) reg.add_energy_sources(name);
  }
  session_ = std::make_unique<CoordinatorSession>(std::move(session), std::move(stub),
                                                  std::move(new_channel), std::move(channel));
  AttemptRunnerOptions runner;
  runner.trainer = options_.trainer;
  runner.transport = options_.transport;
  runner.gloo_hostname = options_.gloo_hostname;
  runner.collective_timeout = options_.collective_timeout;
  runner.cuda_device = gpu_ ? gpu_->device() : options_.cuda_device;
  runner.clock = clock_;
  CoordinatorSession* s = session_.get();
  const std::string token = options_.join_token;
  runner_ = std::make_unique<AttemptRunner>(
      std::move(runner), meter_.get(), metrics_.get(), &phases_, s,
      [s, token](const v1::Assignment& a) -> std::unique_ptr<KvClient> {
        return std::make_unique<GrpcKvClient>(s->stub(), a.rendezvous_prefix(), token);
      });
  session_->set_attempts(runner_.get());
}

std::string Agent::metrics_address() const {
  if (!http_) return "";
  const std::string& a = http_->address();
  // A wildcard bind is reachable at the address peers use for this host.
  if (a.rfind("0.0.0.0:", 0) == 0) return options_.gloo_hostname + a.substr(7);
  return a;
}

Agent::Agent(AgentOptions options)
    : options_(std::move(options)), clock_(options_.clock ? options_.clock : Clock::Real()) {}

Agent::~Agent() {
  Stop();
  runner_.reset();  // cancelled by Stop, joined here
  if (meter_) meter_->Stop();
}

void Agent::Run() { session_->Run(); }

void Agent::Stop() {
  // Not wired when Create failed half-way (e.g. the metrics address was taken).
  if (session_) session_->Stop();
}

}  // namespace joule::worker
