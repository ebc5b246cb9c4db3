// joule-coordinator: the Joule control-plane daemon. Flags only; the rest is joule::server.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/logging.h"
#include "common/names.h"
#include "common/security.h"
#include "server/coordinator_server.h"

int main(int argc, char** argv) {
  CLI::App app{"joule-coordinator: takes training jobs over gRPC and gang-schedules them "
               "onto joule-worker processes"};
  std::string listen = "127.0.0.1:7070";
  std::string data_dir;
  std::string db_path;
  std::string address_file;
  std::string log_level = "info";
  int heartbeat_timeout_ms = 10000;
  std::string metrics_listen = "127.0.0.1:0";
  joule::ServerTls tls;
  std::string client_tokens_file, join_token_file;
  std::vector<std::string> data_roots;
  int max_active_jobs_per_client = 1000;
  bool allow_unauthenticated = false;
  double grid = joule::kDefaultGridGco2PerKwh;
  app.add_option("--listen", listen, "gRPC address (host:port; port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--data-dir", data_dir,
                 "state directory (default $JOULE_DATA_DIR or ~/.joule)");
  app.add_option("--db", db_path, "SQLite job store (default DATA_DIR/jobs.db)");
  app.add_option("--address-file", address_file,
                 "write the bound host:port here once serving (for port 0)");
  app.add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms,
                 "a worker silent this long is lost")
      ->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen,
                 "where /metrics and Prometheus http_sd (/http_sd) are served (port 0: a free "
                 "port; empty: off)")
      ->capture_default_str();
  app.add_option("--grid-gco2-per-kwh", grid,
                 "grid carbon intensity for the CO2 figure of energy reports")
      ->capture_default_str();
  app.add_option("--tls-cert", tls.cert_file, "PEM certificate chain of this server");
  app.add_option("--tls-key", tls.key_file, "PEM private key of this server");
  app.add_option("--tls-client-ca", tls.client_ca_file,
                 "require client certificates signed by this PEM CA");
  app.add_flag("--insecure", tls.insecure,
               "serve plain text instead of TLS (only on a loopback --listen address)");
  app.add_option("--client-tokens-file", client_tokens_file,
                 "\"NAME TOKEN\" lines: the bearer tokens JobService accepts (default: none "
                 "asked for)");
  app.add_option("--join-token-file", join_token_file,
                 "the bearer token workers must present (default: $JOULE_JOIN_TOKEN, else "
                 "none asked for)");
  app.add_flag("--allow-unauthenticated", allow_unauthenticated,
               "serve a non-loopback address without client tokens or worker authentication");
  app.add_option("--data-root", data_roots,
                 "directory that files named by jobs (idx:DIR and csv:FILE datasets, "
                 "torchscript:FILE models) must lie under; repeatable (default "
                 "/usr/share/datasets)");
  app.add_option("--max-active-jobs-per-client", max_active_jobs_per_client,
                 "jobs one client may have pending or running")
      ->capture_default_str();
  bool web_ui = false;
  app.add_flag("--web-ui", web_ui,
               "serve the web UI (jobs, a job's live power and log, workers) at /ui/ on the "
               "--metrics-listen address, behind the client tokens if any");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")->capture_default_str();
  app.set_version_flag("--version", joule::VersionLine("joule-coordinator"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag or value exits 2, as the README says.
    return app.exit(e) == 0 ? 0 : 2;
  }

  joule::InitLogging("joule-coordinator", log_level);
  if (data_dir.empty()) {
    const char* env = std::getenv("JOULE_DATA_DIR");
    const char* home = std::getenv("HOME");
    data_dir = env ? env : std::string(home ? home : ".") + "/.joule";
  }
  if (db_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(data_dir, ec);
    if (ec) {
      spdlog::error("cannot create data directory {}: {}", data_dir, ec.message());
      return 1;
    }
    db_path = data_dir + "/jobs.db";
  }

  // Block the shutdown signals in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  joule::server::CoordinatorServerOptions server_options;
  server_options.address = listen;
  server_options.metrics_address = metrics_listen;
  server_options.tls = tls;
  server_options.allow_unauthenticated = allow_unauthenticated;
  joule::server::CoordinatorOptions& options = server_options.coordinator;
  options.db_path = db_path;
  options.web_ui = web_ui;
  options.heartbeat_timeout = std::chrono::milliseconds(heartbeat_timeout_ms);
  options.grid_gco2_per_kwh = grid;
  options.max_active_jobs_per_client = max_active_jobs_per_client;
  if (!data_roots.empty()) options.data_roots = data_roots;
  if (!client_tokens_file.empty()) {
    auto tokens = joule::LoadClientTokens(client_tokens_file);
    if (!tokens.ok()) {
      spdlog::error("{}", tokens.status().ToString());
      return 2;
    }
    options.client_tokens = *std::move(tokens);
  }
  auto join = joule::LoadToken(join_token_file, "JOULE_JOIN_TOKEN");
  if (!join.ok()) {
    spdlog::error("{}", join.status().ToString());
    return 2;
  }
  options.join_token = *join;
  if (absl::Status s = server_options.Validate(); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  spdlog::info("authentication: {} client token(s), join token {}", options.client_tokens.size(),
               options.join_token.empty() ? "not required" : "required");
  auto server = joule::server::CoordinatorServer::Start(server_options);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", server.status().ToString());
    return 1;
  }
  spdlog::info("serving on {} (job store {})", (*server)->address(), db_path);
  if (!(*server)->metrics_address().empty()) {
    spdlog::info("metrics on http://{}/metrics, Prometheus http_sd on http://{}/http_sd",
                 (*server)->metrics_address(), (*server)->metrics_address());
  }
  if (!address_file.empty()) {
    // Line 1: the gRPC address; line 2: the metrics address (may be empty).
    std::string tmp = address_file + ".tmp";
    std::ofstream(tmp) << (*server)->address() << "\n" << (*server)->metrics_address() << "\n";
    std::filesystem::rename(tmp, address_file);
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("signal {}: shutting down", sig);
    (*server)->Shutdown();
  });
  (*server)->Wait();
  waiter.detach();
  server->reset();
  spdlog::info("stopped");
  return 0;
}
