#include "server/coordinator_server.h"

#include <netdb.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/web_ui.h"

namespace joule::server {
namespace {

// The shortest interval between a client's pings the server accepts (worker keepalive: 30 s).
constexpr int kMinPingIntervalMs = 4000;

// Why binding `address` ("host:port", "[v6]:port") fails, as the kernel says it
// ("address already in use"), or nullopt when a bind as gRPC makes it (SO_REUSEADDR, no
// SO_REUSEPORT) succeeds.
std::optional<std::string> BindError(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "not host:port";
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return gai_strerror(rc);
  }
  std::optional<std::string> why;
  for (addrinfo* a = found; a != nullptr && !why; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      std::string message = std::strerror(errno);
      if (!message.empty()) message[0] = static_cast<char>(std::tolower(message[0]));
      why = message;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return why;
}

}  // namespace

absl::Status CoordinatorServerOptions::Validate() const {
  if (absl::Status s = coordinator.Validate(); !s.ok()) return s;
  const CoordinatorOptions& options = coordinator;
  if (tls.insecure && !IsLoopbackAddress(address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plain text is only allowed on loopback; ", address,
        " is not (give --tls-cert and --tls-key)"));
  }
  if (!IsLoopbackAddress(address) && !allow_unauthenticated &&
      (options.client_tokens.empty() ||
       (options.join_token.empty() && tls.client_ca_file.empty()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        address, " is reachable off this machine: give --client-tokens-file, and "
                 "--join-token-file or --tls-client-ca for workers (or --allow-unauthenticated)"));
  }
  // Plain HTTP: tokens would cross the network in clear, so none is offered there.
  if (options.web_ui && !metrics_address.empty() && !IsLoopbackAddress(metrics_address) &&
      !allow_unauthenticated) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--web-ui on ", metrics_address,
        " would serve jobs off this machine over plain HTTP: serve it on loopback behind a "
        "TLS proxy (or give --allow-unauthenticated)"));
  }
  return absl::OkStatus();
}


absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions server_options) {
  if (absl::Status s = server_options.Validate(); !s.ok()) return s;
  CoordinatorOptions& options = server_options.coordinator;
  const std::string& address = server_options.address;
  const std::string& metrics_address = server_options.metrics_address;
  const ServerTls& tls = server_options.tls;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      MakeServerCredentials(tls, address);
  if (!creds.ok()) return creds.status();
  std::map<std::string, std::string> join;
  if (!options.join_token.empty()) join[options.join_token] = "worker";
  std::map<std::string, std::string> clients = options.client_tokens;
  const bool web_ui = options.web_ui;
  const std::map<std::string, std::string> ui_clients = options.client_tokens;
  // A busy port is refused before the job store is opened: a second coordinator started
  // by mistake must not re-queue the running jobs of the first.
  if (!absl::EndsWith(address, ":0")) {
    if (std::optional<std::string> why = BindError(address)) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", *why));
    }
  }
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(std::move(options));
  if (!c.ok()) return c.status();
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->coordinator_ = *std::move(c);
  s->jobs_ = std::make_unique<JobServiceImpl>(s->coordinator_.get(), std::move(clients));
  s->workers_ = std::make_unique<WorkerServiceImpl>(s->coordinator_.get(), std::move(join));
  // Heartbeats over UDP before the gRPC port opens when its number is known, so that no
  // worker registers without it (a fleet re-registering with a new leader, at once).
  {
    const std::string listen_host = address.substr(0, address.rfind(':'));
    int listen_port = 0;
    (void)absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &listen_port);
    const std::optional<int> udp = server_options.liveness_udp_port;
    if (udp && (*udp > 0 || listen_port > 0)) {
      if (absl::Status st = s->StartLiveness(listen_host, *udp, listen_port); !st.ok()) return st;
    }
  }
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC sets SO_REUSEPORT by default, so a second coordinator on a busy port would bind
  // too and share the first one's connections; refuse the port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Workers ping after 30 s without a frame (AgentOptions::keepalive_time); gRPC's
  // default answers pings more often than every 5 minutes, while the server sends no data,
  // with GOAWAY ("too_many_pings"). Accept them down to kMinPingIntervalMs apart, with or
  // without a call.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddListeningPort(address, *creds, &port);
  builder.RegisterService(s->jobs_.get());
  builder.RegisterService(s->workers_.get());
  builder.SetMaxReceiveMessageSize(4 << 20);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || port == 0) {
    // gRPC logs why but returns no error: ask the kernel the same question.
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ",
                                               BindError(address).value_or("unknown error")));
  }
  std::string host = address.substr(0, address.rfind(':'));
  s->address_ = absl::StrCat(host, ":", port);
  if (server_options.liveness_udp_port && !s->liveness_) {
    if (absl::Status st = s->StartLiveness(host, *server_options.liveness_udp_port, port);
        !st.ok()) {
      return st;
    }
  }
  if (!metrics_address.empty()) {
    s->http_ = std::make_unique<HttpServer>();
    Coordinator* c = s->coordinator_.get();
    s->http_->Serve("/metrics", [c] {
      c->RefreshMetrics();
      prometheus::TextSerializer serializer;
      return HttpServer::Response{"text/plain; version=0.0.4; charset=utf-8",
                                  serializer.Serialize(c->registry()->Collect())};
    });
    // Readiness: this process leads and serves (a standby answers 503 on the same path).
    s->http_->Serve("/ready", [] { return HttpServer::Response{"text/plain", "leading\n"}; });
    s->http_->Serve("/http_sd", [c] {
      return HttpServer::Response{"application/json", c->HttpSdJson()};
    });
    if (web_ui) InstallWebUi(*s->http_, c, ui_clients);
    if (absl::Status st = s->http_->Start(metrics_address); !st.ok()) return st;
  }
  return s;
}

absl::Status CoordinatorServer::StartLiveness(const std::string& host, int option, int grpc_port) {
  Coordinator* c = coordinator_.get();
  std::string udp_host = host;
  if (udp_host.size() >= 2 && udp_host.front() == '[') {
    udp_host = udp_host.substr(1, udp_host.size() - 2);
  }
  const int wanted = option > 0 ? option : grpc_port;
  auto handler = [c](const std::vector<LivenessListener::Datagram>& in,
                     std::vector<std::string>* replies) { c->OnLivenessDatagrams(in, replies); };
  absl::StatusOr<std::unique_ptr<LivenessListener>> udp =
      LivenessListener::Start(udp_host, wanted, handler);
  if (!udp.ok() && option == 0) {
    spdlog::warn("{}; heartbeats over UDP take a free port instead",
                 std::string(udp.status().message()));
    udp = LivenessListener::Start(udp_host, 0, handler);
  }
  if (!udp.ok()) return udp.status();
  liveness_ = *std::move(udp);
  c->SetLivenessPort(liveness_->port());
  spdlog::info("heartbeats over UDP on port {}", liveness_->port());
  return absl::OkStatus();
}

void CoordinatorServer::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    // First the coordinator: streams that end from here on are the shutdown, not lost
    // workers, so running attempts stay as they are, to be re-queued at the next start.
    coordinator_->BeginShutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });
}

CoordinatorServer::~CoordinatorServer() {
  http_.reset();
  if (!coordinator_) return;
  Shutdown();
  if (server_) server_->Wait();
}

}  // namespace joule::server
