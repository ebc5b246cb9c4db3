// joule-worker: joins a coordinator and trains the job ranks it is assigned.
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/carbon_intensity.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/runtime.h"
#include "common/security.h"
#include "common/shutdown_signal.h"
#include "worker/agent/agent.h"
#include "worker/blas/blas_startup.h"
#include "worker/comm/shm_process_group.h"

namespace {

// The flags as given; ResolveOptions turns them into the agent's options.
struct Flags {
  joule::worker::AgentOptions options;
  std::string device_kind = "cpu";
  std::string log_level = "info";
  std::string transport = "auto";
  std::string join_token_file;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int collective_timeout_ms = static_cast<int>(options.collective_timeout.count());
  int energy_period_ms = static_cast<int>(options.energy_period.count());
  int node_period_ms = static_cast<int>(options.energy.node_period.count());
  bool metrics_address_given = false;
  std::string blas_kernel = "auto";
  bool blas_info = false;
};

// Declares the flags; the defaults that come from the environment ($JOULE_COORDINATOR,
// $JOULE_DATA_DIR) are set first, so that a flag overrides them.
void AddFlags(CLI::App& app, Flags& f) {
  app.add_option(
      "--coordinator", f.options.coordinator,
      "coordinator host:port, or several comma-separated (a leader and its standbys: the "
      "worker follows the leader) (default $JOULE_COORDINATOR or 127.0.0.1:7070)");
  app.add_option("--device-kind", f.device_kind, "cpu or gpu")->capture_default_str();
  app.add_option("--threads", f.threads,
                 "intra-op threads when the job does not set them (default: all cores; "
                 "use cores / workers when several workers share a host)")
      ->capture_default_str();
  app.add_option("--host", f.options.host, "name shown in `joule workers` (default hostname)");
  app.add_option("--region", f.options.region,
                 "the grid region this worker draws power from: its energy's CO2 is counted at "
                 "that region's carbon intensity (joule-coordinator --carbon-intensity "
                 "REGION=SOURCE), and carbon-aware jobs planned there run on its workers; "
                 "default the coordinator's --region");
  app.add_option("--gloo-host", f.options.gloo_hostname,
                 "address peers use to reach this worker's Gloo transport")
      ->capture_default_str();
  app.add_option("--cuda-device", f.options.cuda_device,
                 "GPU workers: CUDA device to train on, held for the worker's life (default: "
                 "the first device no other worker on this host holds)");
  app.add_option("--transport", f.transport,
                 "gradient transport: auto (shared memory when the whole gang is on this "
                 "host, else Gloo over TCP), gloo, or shm; GPU jobs always use NCCL")
      ->capture_default_str();
  app.add_option("--allowed-root", f.options.trainer.allowed_roots,
                 "directory that files named by jobs (idx:, csv:, torchscript:) must lie under "
                 "on this worker (repeatable; default: trust the coordinator's --data-root check)");
  app.add_option("--data-root", f.options.trainer.data_root,
                 "directory holding the named datasets")
      ->capture_default_str();
  app.add_option("--scratch-dir", f.options.trainer.scratch_dir,
                 "node-local directory jobs with `stage: local` copy their data to "
                 "(default: $TMPDIR, else /tmp)");
  app.add_option("--collective-timeout-ms", f.collective_timeout_ms,
                 "rendezvous and collective timeout; a dead peer fails the job after it")
      ->capture_default_str();
  app.add_option("--metrics-address", f.options.metrics_address,
                 "host:port to serve Prometheus /metrics on (port 0: a free port; empty: off; "
                 "default 127.0.0.1:0, or 0.0.0.0:0 when --gloo-host is not loopback)")
      ->capture_default_str();
  app.add_option("--energy-period-ms", f.energy_period_ms,
                 "energy sampling period in ms (0 turns metering off)")
      ->capture_default_str();
  app.add_option("--powercap-root", f.options.energy.powercap_root,
                 "where the RAPL powercap zones are")
      ->capture_default_str();
  app.add_option("--perf-power-pmu", f.options.energy.perf_power_pmu,
                 "where the perf power PMU is described, read where the powercap files are "
                 "not (\"\": not tried)")
      ->capture_default_str();
  app.add_option("--redfish-url", f.options.energy.redfish.url,
                 "whole-node power from this BMC over Redfish (https://bmc[:port]), reported "
                 "beside the components' energy");
  app.add_option("--redfish-chassis", f.options.energy.redfish.chassis,
                 "the Redfish chassis id (default: the first of /redfish/v1/Chassis)");
  app.add_option("--redfish-credentials-file", f.options.energy.redfish.credentials_file,
                 "file whose first line is the BMC's user:password");
  app.add_option("--redfish-ca-file", f.options.energy.redfish.ca_file,
                 "PEM CA bundle to verify the BMC's certificate against");
  app.add_flag("--redfish-insecure", f.options.energy.redfish.insecure_tls,
               "do not verify the BMC's certificate (self-signed)");
  app.add_flag("--ipmi-dcmi", f.options.energy.ipmi_dcmi,
               "whole-node power from the BMC over IPMI DCMI (ipmitool dcmi power reading), "
               "where it has no Redfish: this host's BMC, or --ipmi-host's");
  app.add_option("--ipmi-host", f.options.energy.ipmi.host,
                 "with --ipmi-dcmi: the BMC's address (lanplus); default this host's own");
  app.add_option("--ipmi-credentials-file", f.options.energy.ipmi.credentials_file,
                 "with --ipmi-host: file whose first line is user:password");
  app.add_option("--ipmitool", f.options.energy.ipmi.ipmitool, "the ipmitool program")
      ->capture_default_str();
  app.add_option("--node-power-dir", f.options.energy.node_shared_dir,
                 "directory the workers of a host share so that one of them polls the BMC "
                 "(\"\": each polls it)")
      ->capture_default_str();
  app.add_option("--redfish-period-ms", f.node_period_ms,
                 "how often the BMC's power is read, ms (at least 1 Hz is MLPerf Power's rule)")
      ->capture_default_str()
      ->check(CLI::Range(50, 60000));
  app.add_option("--nvml-library", f.options.energy.nvml_library,
                 "NVML library to load for GPU energy")
      ->capture_default_str();
  app.add_option("--watts-per-busy-core", f.options.energy.estimate.watts_per_busy_core,
                 "estimated source: watts one busy core draws (server TDP / cores)")
      ->capture_default_str();
  app.add_option("--idle-watts", f.options.energy.estimate.idle_watts,
                 "estimated source: watts charged per wall second, busy or not")
      ->capture_default_str();
  app.add_option("--checkpoint-root", f.options.trainer.checkpoint_root,
                 "where job checkpoints are written and resumed from (shared storage when "
                 "workers run on several hosts; empty: no checkpoints; default "
                 "$JOULE_DATA_DIR/checkpoints or ~/.joule/checkpoints)")
      ->capture_default_str();
  app.add_option("--tls-ca", f.options.tls.ca_file, "PEM CA that signed the coordinator's certificate");
  app.add_option("--tls-cert", f.options.tls.cert_file, "PEM client certificate of this worker");
  app.add_option("--tls-key", f.options.tls.key_file, "PEM key of the client certificate");
  app.add_flag("--insecure", f.options.tls.insecure,
               "plain text to the coordinator instead of TLS (loopback only)");
  app.add_option("--join-token-file", f.join_token_file,
                 "file holding the coordinator's join token (default: $JOULE_JOIN_TOKEN)");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error")->capture_default_str();
  app.add_option("--blas-kernel", f.blas_kernel,
                 "OpenBLAS kernel: auto (replace a generic fallback by the best this CPU "
                 "runs, checked), keep (OpenBLAS's own choice), or a core name (SKYLAKEX, "
                 "HASWELL, ...); a user's OPENBLAS_CORETYPE always wins")
      ->capture_default_str()
      ->check([](const std::string& v) {
        const bool ok = !v.empty() && v.size() <= 32 &&
                        std::all_of(v.begin(), v.end(),
                                    [](unsigned char c) { return std::isalnum(c) || c == '_'; });
        return ok ? std::string() : std::string("want auto, keep or a core name");
      });
  app.add_flag("--blas-info", f.blas_info,
               "print the BLAS library, kernel, threads and CPU features the worker would "
               "train on (after --blas-kernel), and exit");
  if (const char* env = std::getenv("JOULE_COORDINATOR")) f.options.coordinator = env;
  const char* data = std::getenv("JOULE_DATA_DIR");
  const char* home = std::getenv("HOME");
  f.options.trainer.checkpoint_root =
      std::string(data ? data : std::string(home ? home : ".") + "/.joule") + "/checkpoints";
}

// The agent's options from the flags: device kind, transport, the join token from its
// file, the metrics address off loopback when peers reach this host off it, and
// AgentOptions::Validate. Errors: INVALID_ARGUMENT naming the flag (exit 2).
absl::StatusOr<joule::worker::AgentOptions> ResolveOptions(Flags f) {
  joule::worker::AgentOptions& options = f.options;
  auto kind = joule::ParseDeviceKind(f.device_kind);
  if (!kind.ok()) return absl::InvalidArgumentError(kind.status().ToString());
#ifndef JOULE_WITH_NCCL
  if (*kind == joule::v1::DEVICE_KIND_GPU) {
    return absl::InvalidArgumentError(
        "--device-kind gpu needs a worker built with the CUDA toolkit, NCCL and a CUDA "
        "LibTorch (README: GPU builds); this build trains on CPU");
  }
#endif
  options.device_kind = *kind;
  auto transport = joule::worker::ParseTransport(f.transport);
  if (!transport.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--transport: ", transport.status().ToString()));
  }
  options.transport = *transport;
  options.trainer.default_threads = f.threads;
  options.collective_timeout = std::chrono::milliseconds(f.collective_timeout_ms);
  options.energy_period = std::chrono::milliseconds(f.energy_period_ms);
  options.energy.node_period = std::chrono::milliseconds(f.node_period_ms);
  options.energy.use_nvml = *kind == joule::v1::DEVICE_KIND_GPU;
  auto join = joule::LoadToken(f.join_token_file, "JOULE_JOIN_TOKEN");
  if (!join.ok()) return absl::InvalidArgumentError(join.status().ToString());
  options.join_token = *join;
  if (!options.region.empty()) {
    if (absl::Status s = joule::CheckRegionName("--region", options.region); !s.ok()) return s;
  }
  // Peers reach this host off loopback: so must Prometheus, unless told otherwise.
  if (!f.metrics_address_given && options.gloo_hostname != "127.0.0.1" &&
      options.gloo_hostname != "localhost") {
    options.metrics_address = "0.0.0.0:0";
  }
  if (absl::Status s = options.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(s.ToString());
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  // Training allocates and frees the same large activation buffers every step. glibc
  // serves blocks above its mmap threshold with fresh mappings and returns them on free,
  // so each step would page-fault its activations in again (seen: ~10% of a cnn step in
  // clear_page/page-fault kernel time). Keep them in the heap and do not trim it.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  CLI::App app{"joule-worker: trains the ranks of Joule jobs that the coordinator assigns"};
  Flags flags;
  AddFlags(app, flags);
  app.set_version_flag("--version", joule::VersionLine("joule-worker"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag or value exits 2, as the README says.
    return app.exit(e) == 0 ? 0 : 2;
  }
  flags.metrics_address_given = app.count("--metrics-address") > 0;
  joule::InitProcessRuntime();
  joule::InitLogging("joule-worker", flags.log_level);
  // Before anything computes: a switch of kernel re-executes this program.
  flags.options.blas = joule::worker::SettleBlasKernel(flags.blas_kernel, argv);
  if (flags.blas_info) {
    const joule::v1::BlasInfo& b = flags.options.blas;
    std::cout << "library   " << b.library() << "\nconfig    " << b.config() << "\ncore      "
              << b.core() << (b.fallback() ? " (a fallback: narrower than the CPU's vectors)" : "")
              << "\nthreads   " << b.threads() << "\ncpu       " << b.cpu_model() << "\nfeatures  "
              << absl::StrJoin(b.cpu_features(), " ") << "\nchoice    " << b.choice()
              << "\nsgemm     "
              << absl::StrFormat("%.1f GFLOP/s (64x784x512, one call), %s", b.sgemm_gflops(),
                                 b.sgemm_ok() ? "within the float error bound" : "WRONG RESULTS")
              << "\n";
    return 0;
  }
  absl::StatusOr<joule::worker::AgentOptions> options = ResolveOptions(flags);
  if (!options.ok()) {
    spdlog::error("{}", std::string(options.status().message()));
    return 2;
  }
  if (int n = joule::worker::ShmProcessGroup::SweepStaleSegments(); n > 0) {
    spdlog::info("removed {} shared-memory segment(s) left by workers that were killed", n);
  }

  if (absl::Status s = joule::InstallShutdownSignals(); !s.ok()) {
    spdlog::error("cannot start: {}", s.ToString());
    return 1;
  }
  auto agent = joule::worker::Agent::Create(*options);
  if (!agent.ok()) {
    spdlog::error("cannot start: {}", agent.status().ToString());
    return 1;
  }
  std::thread waiter([&] {
    const int sig = joule::WaitForShutdownSignal();
    spdlog::info("signal {}: stopping", sig);
    (*agent)->Stop();
  });
  (*agent)->Run();
  waiter.detach();
  spdlog::info("stopped");
  return 0;
}
