#ifndef JOULE_SERVER_COORDINATOR_SERVER_H_
#define JOULE_SERVER_COORDINATOR_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/http_server.h"
#include "common/security.h"
#include "server/coordinator.h"
#include "server/grpc_services.h"
#include "server/liveness_listener.h"

namespace joule::server {

// What a coordinator process serves, and where: the Coordinator's options plus its
// addresses and TLS.
struct CoordinatorServerOptions {
  CoordinatorOptions coordinator;
  // gRPC address, "host:port" ("127.0.0.1:0" picks a free port).
  std::string address = "127.0.0.1:7070";
  // Where /metrics, /http_sd (and the web UI, coordinator.web_ui) are served over plain
  // HTTP ("127.0.0.1:0" picks a free port); empty: not served.
  std::string metrics_address;
  // The server's TLS; tls.insecure serves plain text.
  ServerTls tls;
  // Heartbeats over UDP (LivenessListener), on the gRPC address's host: unset, none (the
  // session streams carry them); 0, the gRPC port's number, or a free port when that is
  // taken; N > 0, that port (UNAVAILABLE when it cannot be bound).
  std::optional<int> liveness_udp_port;
  // Off loopback, serve without client tokens or a way to admit workers, and the web UI
  // over plain HTTP.
  bool allow_unauthenticated = false;

  // CoordinatorOptions::Validate, then the rules for what a coordinator may expose:
  // plain text (tls.insecure) only on a loopback `address`; off loopback, client tokens
  // and a way to admit workers (a join token or a client CA) unless
  // `allow_unauthenticated`; the web UI (every job's spec, log and workers over plain
  // HTTP) only on a loopback `metrics_address` unless `allow_unauthenticated`.
  // Errors: INVALID_ARGUMENT naming the flag that fixes it. Pure.
  absl::Status Validate() const;
};

// A running coordinator: the Coordinator plus a gRPC server bound to options.address and,
// when options.metrics_address is set, the HTTP server of /metrics, /http_sd and the web
// UI. Owns them; Shutdown() (or the destructor) stops the servers and ends every stream.
// Thread-safe.
class CoordinatorServer {
 public:
  // Errors: INVALID_ARGUMENT from options.Validate(); UNAVAILABLE when an address cannot
  // be bound (a busy gRPC port is refused before the job store is opened); those of
  // Coordinator::Create.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(CoordinatorServerOptions options);
  ~CoordinatorServer();
  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }
  // The UDP port heartbeats are taken on, 0 when none.
  int liveness_port() const { return liveness_ ? liveness_->port() : 0; }
  // "host:port" of the metrics endpoint, or empty.
  std::string metrics_address() const { return http_ ? http_->address() : ""; }
  Coordinator& coordinator() { return *coordinator_; }
  // A channel to this server inside the process (no socket): for tests and embedders.
  std::shared_ptr<grpc::Channel> InProcessChannel() {
    return server_->InProcessChannel(grpc::ChannelArguments());
  }
  void Wait() { server_->Wait(); }
  void Shutdown();

 private:
  CoordinatorServer() = default;
  // Binds heartbeats over UDP on `host` (CoordinatorServerOptions::liveness_udp_port's
  // `option`; 0: `grpc_port`'s number, else a free one) and offers it to registrations.
  absl::Status StartLiveness(const std::string& host, int option, int grpc_port);
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobServiceImpl> jobs_;
  std::unique_ptr<WorkerServiceImpl> workers_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::string address_;
  std::once_flag shutdown_once_;
  std::unique_ptr<LivenessListener> liveness_;  // last: stopped before the coordinator
};

}  // namespace joule::server

#endif  // JOULE_SERVER_COORDINATOR_SERVER_H_
