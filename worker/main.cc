// joule-worker: joins a coordinator and trains the job ranks it is assigned.
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <thread>

#include <CLI/CLI.hpp>

#include "common/logging.h"
#include "common/security.h"
#include "common/names.h"
#include "worker/agent/agent.h"
#include "worker/comm/shm_process_group.h"

int main(int argc, char** argv) {
  // Training allocates and frees the same large activation buffers every step. glibc
  // serves blocks above its mmap threshold with fresh mappings and returns them on free,
  // so each step would page-fault its activations in again (seen: ~10% of a cnn step in
  // clear_page/page-fault kernel time). Keep them in the heap and do not trim it.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  CLI::App app{"joule-worker: trains the ranks of Joule jobs that the coordinator assigns"};
  joule::worker::AgentOptions options;
  std::string device_kind = "cpu";
  std::string log_level = "info";
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int collective_timeout_ms = static_cast<int>(options.collective_timeout.count());
  int energy_period_ms = static_cast<int>(options.energy_period.count());
  app.add_option("--coordinator", options.coordinator,
                 "coordinator host:port (default $JOULE_COORDINATOR or 127.0.0.1:7070)");
  app.add_option("--device-kind", device_kind, "cpu or gpu")->capture_default_str();
  app.add_option("--threads", threads,
                 "intra-op threads when the job does not set them (default: all cores; "
                 "use cores / workers when several workers share a host)")
      ->capture_default_str();
  app.add_option("--host", options.host, "name shown in `joule workers` (default hostname)");
  app.add_option("--gloo-host", options.gloo_hostname,
                 "address peers use to reach this worker's Gloo transport")
      ->capture_default_str();
  app.add_option("--cuda-device", options.cuda_device,
                 "GPU workers: CUDA device to train on, held for the worker's life (default: "
                 "the first device no other worker on this host holds)");
  std::string transport = "auto";
  app.add_option("--transport", transport,
                 "gradient transport: auto (shared memory when the whole gang is on this "
                 "host, else Gloo over TCP), gloo, or shm; GPU jobs always use NCCL")
      ->capture_default_str();
  app.add_option("--allowed-root", options.trainer.allowed_roots,
                 "directory that files named by jobs (idx:, csv:, torchscript:) must lie under "
                 "on this worker (repeatable; default: trust the coordinator's --data-root check)");
  app.add_option("--data-root", options.trainer.data_root,
                 "directory holding the named datasets")
      ->capture_default_str();
  app.add_option("--collective-timeout-ms", collective_timeout_ms,
                 "rendezvous and collective timeout; a dead peer fails the job after it")
      ->capture_default_str();
  app.add_option("--metrics-address", options.metrics_address,
                 "host:port to serve Prometheus /metrics on (port 0: a free port; empty: off; "
                 "default 127.0.0.1:0, or 0.0.0.0:0 when --gloo-host is not loopback)")
      ->capture_default_str();
  app.add_option("--energy-period-ms", energy_period_ms,
                 "energy sampling period in ms (0 turns metering off)")
      ->capture_default_str();
  app.add_option("--powercap-root", options.energy.powercap_root,
                 "where the RAPL powercap zones are")
      ->capture_default_str();
  app.add_option("--nvml-library", options.energy.nvml_library,
                 "NVML library to load for GPU energy")
      ->capture_default_str();
  app.add_option("--watts-per-busy-core", options.energy.estimate.watts_per_busy_core,
                 "estimated source: watts one busy core draws (server TDP / cores)")
      ->capture_default_str();
  app.add_option("--idle-watts", options.energy.estimate.idle_watts,
                 "estimated source: watts charged per wall second, busy or not")
      ->capture_default_str();
  app.add_option("--checkpoint-root", options.trainer.checkpoint_root,
                 "where job checkpoints are written and resumed from (shared storage when "
                 "workers run on several hosts; empty: no checkpoints; default "
                 "$JOULE_DATA_DIR/checkpoints or ~/.joule/checkpoints)")
      ->capture_default_str();
  app.add_option("--tls-ca", options.tls.ca_file, "PEM CA that signed the coordinator's certificate");
  app.add_option("--tls-cert", options.tls.cert_file, "PEM client certificate of this worker");
  app.add_option("--tls-key", options.tls.key_file, "PEM key of the client certificate");
  app.add_flag("--insecure", options.tls.insecure,
               "plain text to the coordinator instead of TLS (loopback only)");
  std::string join_token_file;
  app.add_option("--join-token-file", join_token_file,
                 "file holding the coordinator's join token (default: $JOULE_JOIN_TOKEN)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")->capture_default_str();
  if (const char* env = std::getenv("JOULE_COORDINATOR")) options.coordinator = env;
  {
    const char* data = std::getenv("JOULE_DATA_DIR");
    const char* home = std::getenv("HOME");
    options.trainer.checkpoint_root =
        std::string(data ? data : std::string(home ? home : ".") + "/.joule") + "/checkpoints";
  }
  app.set_version_flag("--version", joule::VersionLine("joule-worker"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag or value exits 2, as the README says.
    return app.exit(e) == 0 ? 0 : 2;
  }

  joule::InitLogging("joule-worker", log_level);
  auto kind = joule::ParseDeviceKind(device_kind);
  if (!kind.ok()) {
    spdlog::error("{}", kind.status().ToString());
    return 2;
  }
#ifndef JOULE_WITH_NCCL
  if (*kind == joule::v1::DEVICE_KIND_GPU) {
    spdlog::error("--device-kind gpu needs a worker built with the CUDA toolkit, NCCL and a "
                  "CUDA LibTorch (README: GPU builds); this build trains on CPU");
    return 2;
  }
#endif
  options.device_kind = *kind;
  auto chosen_transport = joule::worker::ParseTransport(transport);
  if (!chosen_transport.ok()) {
    spdlog::error("--transport: {}", chosen_transport.status().ToString());
    return 2;
  }
  options.transport = *chosen_transport;
  if (int n = joule::worker::ShmProcessGroup::SweepStaleSegments(); n > 0) {
    spdlog::info("removed {} shared-memory segment(s) left by workers that were killed", n);
  }
  options.trainer.default_threads = threads;
  options.collective_timeout = std::chrono::milliseconds(collective_timeout_ms);
  options.energy_period = std::chrono::milliseconds(energy_period_ms);
  options.energy.use_nvml = *kind == joule::v1::DEVICE_KIND_GPU;
  auto join = joule::LoadToken(join_token_file, "JOULE_JOIN_TOKEN");
  if (!join.ok()) {
    spdlog::error("{}", join.status().ToString());
    return 2;
  }
  options.join_token = *join;
  // Peers reach this host off loopback: so must Prometheus, unless told otherwise.
  if (app.count("--metrics-address") == 0 && options.gloo_hostname != "127.0.0.1" &&
      options.gloo_hostname != "localhost") {
    options.metrics_address = "0.0.0.0:0";
  }
  if (absl::Status s = options.Validate(); !s.ok()) {
    spdlog::error("{}", s.ToString());
    return 2;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto agent = joule::worker::Agent::Create(options);
  if (!agent.ok()) {
    spdlog::error("cannot start: {}", agent.status().ToString());
    return 1;
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("signal {}: stopping", sig);
    (*agent)->Stop();
  });
  (*agent)->Run();
  waiter.detach();
  spdlog::info("stopped");
  return 0;
}
