// joule-coordinator: the Joule control-plane daemon. Flags only; the rest is joule::server.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/atomic_file.h"
#include "common/carbon_intensity.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/runtime.h"
#include "common/security.h"
#include "common/shutdown_signal.h"
#include "server/coordinator_server.h"
#include "server/ha_coordinator.h"

namespace {

// The flags as given; ResolveOptions turns them into the server's options.
struct Flags {
  std::string listen = "127.0.0.1:7070";
  std::string data_dir;
  std::string db_path, store;
  std::string store_password_file;
  std::string address_file;
  std::string log_level = "info";
  int heartbeat_timeout_ms = 10000;
  int max_heartbeats_per_second = 500;
  std::string liveness_udp = "same";
  std::string metrics_listen = "127.0.0.1:0";
  joule::ServerTls tls;
  std::string client_tokens_file, join_token_file;
  std::vector<std::string> data_roots;
  int max_active_jobs_per_client = 1000;
  bool allow_unauthenticated = false;
  bool web_ui = false;
  double grid = joule::kDefaultGridGco2PerKwh;
  std::vector<std::string> carbon_intensity;
  std::string region = "default";
  joule::server::CarbonSourceOptions carbon;
  double carbon_poll_s = 300;
  bool ha = false;
  std::string advertise;
  int lease_ms = 5000;
  int reattach_window_ms = -1;
};

// The grid's carbon intensity: the constant, the sources by region and how URLs are
// fetched (issue 31).
void AddCarbonFlags(CLI::App& app, Flags& f) {
  app.add_option("--grid-gco2-per-kwh", f.grid,
                 "grid carbon intensity for the CO2 figure of energy reports (a constant; "
                 "see --carbon-intensity)")
      ->capture_default_str();
  app.add_option("--carbon-intensity", f.carbon_intensity,
                 "[REGION=]FILE or http(s):// URL of the grid's carbon intensity over time (a "
                 "file re-read when it changes, a URL polled): CSV `time,gco2_per_kwh`, or the "
                 "JSON of a Carbon Aware SDK forecast, Electricity Maps' or WattTime's "
                 "forecast, or NESO's GB intensity; without REGION=, this coordinator's "
                 "--region's. Repeat it for each region the workers are in (joule-worker "
                 "--region). Carbon-aware jobs (joule submit --carbon-aware) wait for the "
                 "greenest start and region before their deadline; ended jobs get their CO2 "
                 "over their run");
  app.add_option("--region", f.region,
                 "the grid region of this coordinator's site: workers that name none are in "
                 "it (letters, digits, '.', '_', '-': a zone such as DE)")
      ->capture_default_str();
  app.add_option("--carbon-intensity-poll", f.carbon_poll_s,
                 "seconds between two fetches of a --carbon-intensity URL")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_option("--carbon-intensity-token-file", f.carbon.token_file,
                 "a file holding the --carbon-intensity URL's API token (read at each fetch; "
                 "sent as Authorization: Bearer TOKEN, or in --carbon-intensity-token-header)");
  app.add_option("--carbon-intensity-token-header", f.carbon.token_header,
                 "the header the token goes in (Electricity Maps: auth-token)")
      ->capture_default_str();
  app.add_option("--carbon-intensity-ca", f.carbon.ca_file,
                 "PEM CA certificates an https --carbon-intensity URL is checked against "
                 "(default: the system's)");
}

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--listen", f.listen, "gRPC address (host:port; port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--liveness-udp", f.liveness_udp,
                 "where workers send heartbeats over UDP (HMAC-sealed, batched: far cheaper "
                 "than on their gRPC streams at thousands of workers): \"same\" (the --listen "
                 "port's number, or a free port when that is taken), a port, or \"off\" (the "
                 "streams carry them). Workers fall back to their stream while UDP goes "
                 "unanswered")
      ->capture_default_str();
  app.add_option("--data-dir", f.data_dir, "state directory (default $JOULE_DATA_DIR or ~/.joule)");
  app.add_option("--store", f.store,
                 "job store: sqlite:PATH, or postgresql://[user@]host[:port]/dbname (the "
                 "password from a password file, PGPASSFILE or PGPASSWORD; never in the URI); "
                 "default sqlite:DATA_DIR/jobs.db");
  app.add_option("--store-password-file", f.store_password_file,
                 "with a postgresql:// --store: the role's password, read from this file "
                 "(whitespace trimmed; a container's secret) and given to libpq as this "
                 "process's PGPASSWORD");
  app.add_option("--db", f.db_path, "SQLite job store file (the same as --store sqlite:PATH)");
  app.add_option("--address-file", f.address_file,
                 "write the bound host:port here once serving (for port 0)");
  app.add_option("--heartbeat-timeout-ms", f.heartbeat_timeout_ms,
                 "a worker silent this long is lost")
      ->capture_default_str();
  app.add_option("--max-heartbeats-per-second", f.max_heartbeats_per_second,
                 "the workers' heartbeats this coordinator aims to handle, all together: past "
                 "it their interval grows from 1 s up to a quarter of the heartbeat timeout "
                 "(500/s cost 9% of one core in bench/README; 0: always 1 s)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics-listen", f.metrics_listen,
                 "where /metrics and Prometheus http_sd (/http_sd) are served (port 0: a free "
                 "port; empty: off)")
      ->capture_default_str();
  AddCarbonFlags(app, f);
  app.add_option("--tls-cert", f.tls.cert_file, "PEM certificate chain of this server");
  app.add_option("--tls-key", f.tls.key_file, "PEM private key of this server");
  app.add_option("--tls-client-ca", f.tls.client_ca_file,
                 "require client certificates signed by this PEM CA");
  app.add_flag("--insecure", f.tls.insecure,
               "serve plain text instead of TLS (only on a loopback --listen address)");
  app.add_option("--client-tokens-file", f.client_tokens_file,
                 "\"NAME TOKEN\" lines: the bearer tokens JobService accepts (default: none "
                 "asked for)");
  app.add_option("--join-token-file", f.join_token_file,
                 "the bearer token workers must present (default: $JOULE_JOIN_TOKEN, else "
                 "none asked for)");
  app.add_flag("--allow-unauthenticated", f.allow_unauthenticated,
               "serve a non-loopback address without client tokens or worker authentication");
  app.add_option("--data-root", f.data_roots,
                 "directory that files named by jobs (idx:DIR and csv:FILE datasets, "
                 "torchscript:FILE models) must lie under; repeatable (default "
                 "/usr/share/datasets)");
  app.add_option("--max-active-jobs-per-client", f.max_active_jobs_per_client,
                 "jobs one client may have pending or running")
      ->capture_default_str();
  app.add_flag("--web-ui", f.web_ui,
               "serve the web UI (jobs, a job's live power and log, workers) at /ui/ on the "
               "--metrics-listen address, behind the client tokens if any");
  app.add_flag("--ha", f.ha,
               "stand by for leadership: several coordinators share one --store (PostgreSQL); "
               "the one holding its lease serves, the others answer with its address and "
               "take over when the lease lapses");
  app.add_option("--advertise-address", f.advertise,
                 "with --ha: the host:port clients and workers reach this coordinator at "
                 "(default: the bound --listen address)");
  app.add_option("--lease-ms", f.lease_ms,
                 "with --ha: the leader's lease; a standby takes over within about this long "
                 "of the leader's loss")
      ->capture_default_str();
  app.add_option("--reattach-window-ms", f.reattach_window_ms,
                 "how long a coordinator that starts (or takes over) with attempts running "
                 "waits for their ranks to come back and adopts them; those whose ranks do "
                 "not all come back are re-queued (default: the heartbeat timeout with --ha, "
                 "0 without: re-queued at once)");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error")->capture_default_str();
}

// The password in `path` (--store-password-file): the file's text, surrounding whitespace
// trimmed. Errors (INVALID_ARGUMENT, naming the file, never showing any of its content): the
// file cannot be read, is empty, is over 4 KiB, or holds a NUL or a line break inside.
absl::StatusOr<std::string> ReadStorePassword(const std::string& path) {
  const std::string where = absl::StrCat("--store-password-file ", path, ": ");
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(where, "cannot be read"));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > 4096) return absl::InvalidArgumentError(absl::StrCat(where, "over 4 KiB"));
  std::string password(absl::StripAsciiWhitespace(text));
  if (password.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "is empty"));
  if (password.find_first_of(std::string("\0\n\r", 3)) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "holds a NUL or a line break inside the password"));
  }
  return password;
}

// The coordinator's region and its --carbon-intensity [REGION=]SOURCE sources, each read
// once (a file that does not parse stops the start). Errors: INVALID_ARGUMENT naming the
// flag.
absl::Status ResolveCarbonSources(const Flags& f, joule::server::CoordinatorOptions& options) {
  if (absl::Status s = joule::CheckRegionName("--region", f.region); !s.ok()) return s;
  options.region = f.region;
  // One token, one endpoint: a token must not reach a second host (one region's API key
  // sent to another region's server, perhaps over plain http).
  if (!f.carbon.token_file.empty()) {
    std::set<std::string> origins;
    for (const std::string& arg : f.carbon_intensity) {
      absl::StatusOr<std::pair<std::string, std::string>> named =
          joule::server::ParseRegionalSource(arg, f.region);
      if (named.ok() && joule::server::IsUrlSource(named->second)) {
        origins.insert(joule::server::UrlOrigin(named->second));
      }
    }
    if (origins.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--carbon-intensity-token-file: the token would be sent to ", origins.size(),
                       " hosts (", absl::StrJoin(origins, ", "),
                       "); every --carbon-intensity URL must be on one host to share a token"));
    }
  }
  for (const std::string& arg : f.carbon_intensity) {
    absl::StatusOr<std::pair<std::string, std::string>> named =
        joule::server::ParseRegionalSource(arg, f.region);
    if (!named.ok()) return named.status();
    const auto& [region, where] = *named;
    if (options.carbon.count(region) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--carbon-intensity: region ", region, " has two sources"));
    }
    joule::server::CarbonSourceOptions carbon = f.carbon;
    carbon.poll = std::chrono::milliseconds(std::llround(f.carbon_poll_s * 1000));
    auto source = std::make_shared<joule::server::CarbonIntensitySource>(where, carbon);
    source->Refresh(absl::ToUnixMillis(absl::Now()));
    // A bad file is the operator's to fix now; an endpoint that is down may come back (its
    // carbon-aware jobs start at once meanwhile, as the log says).
    if (const std::string error = source->Get().error; !error.empty() && !source->is_url()) {
      return absl::InvalidArgumentError(absl::StrCat("--carbon-intensity ", arg, ": ", error));
    }
    options.carbon[region] = std::move(source);
  }
  return absl::OkStatus();
}

// The server's options from the flags: the job store under the data directory (created),
// the tokens read from their files, every rule of CoordinatorServerOptions::Validate.
// Errors: INVALID_ARGUMENT for a bad flag or file (exit 2), others (exit 1).
absl::StatusOr<joule::server::CoordinatorServerOptions> ResolveOptions(Flags f) {
  if (f.data_dir.empty()) {
    const char* env = std::getenv("JOULE_DATA_DIR");
    const char* home = std::getenv("HOME");
    f.data_dir = env ? env : std::string(home ? home : ".") + "/.joule";
  }
  if (!f.db_path.empty() && !f.store.empty()) {
    return absl::InvalidArgumentError("give the job store with --store or --db, not both");
  }
  if (!f.db_path.empty()) f.store = "sqlite:" + f.db_path;
  if (f.store.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.data_dir, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot create data directory ", f.data_dir, ": ", ec.message()));
    }
    f.store = "sqlite:" + f.data_dir + "/jobs.db";
  }
  if (!f.store_password_file.empty()) {
    if (!absl::StartsWith(f.store, "postgresql://") && !absl::StartsWith(f.store, "postgres://")) {
      return absl::InvalidArgumentError(
          "--store-password-file needs a PostgreSQL --store (postgresql://...)");
    }
    absl::StatusOr<std::string> password = ReadStorePassword(f.store_password_file);
    if (!password.ok()) return password.status();
    // libpq reads it at every connection; this process spawns no other program.
    setenv("PGPASSWORD", password->c_str(), 1);
  }
  joule::server::CoordinatorServerOptions server_options;
  server_options.address = f.listen;
  server_options.metrics_address = f.metrics_listen;
  server_options.tls = f.tls;
  server_options.allow_unauthenticated = f.allow_unauthenticated;
  if (f.liveness_udp == "same") {
    server_options.liveness_udp_port = 0;
  } else if (f.liveness_udp != "off") {
    int port = 0;
    if (!absl::SimpleAtoi(f.liveness_udp, &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("--liveness-udp takes \"same\", \"off\" or a port 1-65535, not \"",
                       f.liveness_udp, "\""));
    }
    server_options.liveness_udp_port = port;
  }
  joule::server::CoordinatorOptions& options = server_options.coordinator;
  options.store = f.store;
  options.web_ui = f.web_ui;
  options.heartbeat_timeout = std::chrono::milliseconds(f.heartbeat_timeout_ms);
  options.max_heartbeats_per_second = f.max_heartbeats_per_second;
  options.reattach_window =
      std::chrono::milliseconds(f.reattach_window_ms >= 0 ? f.reattach_window_ms
                                : f.ha                    ? f.heartbeat_timeout_ms
                                                          : 0);
  options.grid_gco2_per_kwh = f.grid;
  if (absl::Status s = ResolveCarbonSources(f, options); !s.ok()) return s;
  options.max_active_jobs_per_client = f.max_active_jobs_per_client;
  if (!f.data_roots.empty()) options.data_roots = f.data_roots;
  if (!f.client_tokens_file.empty()) {
    auto tokens = joule::LoadClientTokens(f.client_tokens_file);
    if (!tokens.ok()) return absl::InvalidArgumentError(tokens.status().ToString());
    options.client_tokens = *std::move(tokens);
  }
  auto join = joule::LoadToken(f.join_token_file, "JOULE_JOIN_TOKEN");
  if (!join.ok()) return absl::InvalidArgumentError(join.status().ToString());
  options.join_token = *join;
  if (absl::Status s = server_options.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  return server_options;
}

}  // namespace

// Line 1: the gRPC address; line 2: the metrics address (may be empty). False (logged)
// when it cannot be written.
bool WriteAddressFile(const std::string& path, const std::string& address,
                      const std::string& metrics) {
  if (path.empty()) return true;
  if (absl::Status s = joule::WriteFileAtomically(path, absl::StrCat(address, "\n", metrics, "\n"));
      !s.ok()) {
    spdlog::error("cannot write the address file: {}", std::string(s.message()));
    return false;
  }
  return true;
}

// Serves until SIGINT or SIGTERM (InstallShutdownSignals: one thread waits for them),
// then shuts `server` down (a leader resigns first). Returns the exit code.
template <typename Server>
int ServeUntilSignal(Server& server) {
  std::thread waiter([&] {
    const int sig = joule::WaitForShutdownSignal();
    spdlog::info("signal {}: shutting down", sig);
    server.Shutdown();
  });
  server.Wait();
  waiter.detach();
  spdlog::info("stopped");
  return 0;
}

// --ha: a standby until this process holds the store's lease, the leader while it does.
int RunHa(const Flags& flags, const joule::server::CoordinatorServerOptions& options) {
  joule::server::HaOptions ha;
  ha.advertise = flags.advertise;
  ha.lease = std::chrono::milliseconds(flags.lease_ms);
  auto server = joule::server::HaCoordinatorServer::Start(options, ha);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", server.status().ToString());
    return absl::IsInvalidArgument(server.status()) ? 2 : 1;
  }
  // The metrics address changes with each leadership: not in the file.
  if (!WriteAddressFile(flags.address_file, (*server)->address(), "")) return 1;
  const int rc = ServeUntilSignal(**server);
  if (absl::Status s = (*server)->status(); !s.ok()) {
    spdlog::error("stopped: {}", s.ToString());
    return 1;
  }
  return rc;
}

int main(int argc, char** argv) {
  CLI::App app{
      "joule-coordinator: takes training jobs over gRPC and gang-schedules them "
      "onto joule-worker processes"};
  Flags flags;
  AddFlags(app, flags);
  app.set_version_flag("--version", joule::VersionLine("joule-coordinator"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag or value exits 2, as the README says.
    return app.exit(e) == 0 ? 0 : 2;
  }
  joule::InitProcessRuntime();
  joule::InitLogging("joule-coordinator", flags.log_level);
  absl::StatusOr<joule::server::CoordinatorServerOptions> server_options = ResolveOptions(flags);
  if (!server_options.ok()) {
    spdlog::error("{}", std::string(server_options.status().message()));
    return absl::IsInvalidArgument(server_options.status()) ? 2 : 1;
  }
  const joule::server::CoordinatorOptions& options = server_options->coordinator;

  if (absl::Status s = joule::InstallShutdownSignals(); !s.ok()) {
    spdlog::error("cannot start: {}", s.ToString());
    return 1;
  }

  spdlog::info("authentication: {} client token(s), join token {}", options.client_tokens.size(),
               options.join_token.empty() ? "not required" : "required");
  if (flags.ha) return RunHa(flags, *server_options);
  auto server = joule::server::CoordinatorServer::Start(*server_options);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", server.status().ToString());
    return 1;
  }
  spdlog::info("serving on {} (job store {})", (*server)->address(), options.store);
  if (!(*server)->metrics_address().empty()) {
    spdlog::info("metrics on http://{}/metrics, Prometheus http_sd on http://{}/http_sd",
                 (*server)->metrics_address(), (*server)->metrics_address());
  }
  if (!WriteAddressFile(flags.address_file, (*server)->address(), (*server)->metrics_address())) {
    (*server)->Shutdown();
    (*server)->Wait();
    return 1;
  }
  return ServeUntilSignal(**server);
}
