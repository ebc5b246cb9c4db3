#ifndef JOULE_TESTS_TESTING_LOCAL_CLUSTER_H_
#define JOULE_TESTS_TESTING_LOCAL_CLUSTER_H_

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "joule/v1/job.grpc.pb.h"
#include "tests/testing/process.h"

namespace joule::testing {

// The path of one of our programs ("joule", "joule-coordinator", "joule-worker") in the
// build's binary directory.
std::string ProgramPath(const std::string& program);

// How a LocalCluster runs its programs. Paths are absolute (most lie in the cluster's
// directory, so a fixture builds these options after its ScratchDir).
struct LocalClusterOptions {
  // TLS: when false, the coordinator, the workers and the CLI run with --insecure (plain
  // text on loopback). When true, the cluster makes a self-signed certificate for
  // 127.0.0.1 (DIR/cert.pem, DIR/key.pem; with /usr/bin/openssl) that the coordinator
  // serves and the workers, the CLI and stub() trust.
  bool tls = false;
  // The bearer token stub()'s calls carry (for a coordinator with client tokens); empty:
  // none. The CLI's token is the caller's to pass (CliWith).
  std::string client_token;
  // With TLS, more IP addresses the certificate names (a coordinator off loopback).
  std::vector<std::string> certificate_ips;

  // Prepended to the coordinator's argv (e.g. NetnsHosts::Prefix: run it in a test host).
  std::vector<std::string> coordinator_prefix;

  // Coordinator. Zero or empty: the flag is not passed, so the program's default holds.
  std::chrono::milliseconds heartbeat_timeout{0};  // --heartbeat-timeout-ms
  std::string metrics_listen;                      // --metrics-listen
  std::vector<std::string> data_roots;             // one --data-root each
  std::vector<std::string> coordinator_flags;      // appended as they are

  // Workers (each also runs with --threads 1).
  std::chrono::milliseconds collective_timeout{0};  // --collective-timeout-ms
  std::string checkpoint_root;                      // --checkpoint-root
  std::vector<std::string> worker_flags;            // appended to every worker's flags
};

// A self-signed certificate (RSA 2048, one day) for 127.0.0.1, localhost and `ips`, with
// /usr/bin/openssl: its key at `key`, the certificate (also the CA clients trust) at
// `cert`. False with openssl's output in `*out` when it fails.
bool MakeSelfSignedCertificate(const std::string& key, const std::string& cert,
                               const std::vector<std::string>& ips, std::string* out);

// A coordinator and workers as real processes on loopback, in one test's directory (a
// ScratchDir's, which outlives the cluster), with a JobService stub and the `joule` CLI
// pointed at it. Files in the directory: jobs.db, addr (the coordinator's address file),
// coordinator.log, worker-<i>.log (i counts the workers started, from 0).
//
// The helpers that start processes or wait report failures through GoogleTest (ASSERT in
// the Start* functions: call them under ASSERT_NO_FATAL_FAILURE where the rest of a test
// depends on them). Destruction kills (SIGKILL) the workers, then the coordinator.
// Not thread-safe; use it from the test's thread.
class LocalCluster {
 public:
  LocalCluster(std::filesystem::path dir, LocalClusterOptions options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // How long a coordinator may take to write its address file.
  static constexpr std::chrono::seconds kStartTimeout{20};

  // Starts the coordinator on `listen` and waits (up to kStartTimeout, or until it exits)
  // for its address file; then points the stub and the CLI at it. Called again after the
  // coordinator has stopped, it restarts it on the same database: pass the old address()
  // to keep the port, so that running workers reconnect.
  void StartCoordinator(const std::string& listen = "127.0.0.1:0");
  // Starts `n` workers pointed at address(), with options.worker_flags, then `extra`;
  // `prefix` is prepended to each one's argv (e.g. to run it in a test host).
  // Does not wait for them to register (see WaitIdleWorkers).
  void StartWorkers(int n, const std::vector<std::string>& extra = {},
                    const std::vector<std::string>& prefix = {});

  const std::filesystem::path& dir() const { return dir_; }
  // host:port of the coordinator's gRPC and metrics listeners (metrics: empty when off).
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  std::filesystem::path coordinator_log() const { return dir_ / "coordinator.log"; }
  std::filesystem::path worker_log(int index) const;
  ChildProcess& coordinator() { return *coordinator_; }
  const std::vector<std::unique_ptr<ChildProcess>>& workers() const { return workers_; }
  // The worker process of ours that runs `rank` of `job` (BUSY in ListWorkers); null if none.
  ChildProcess* WorkerRunning(int64_t job, int rank);

  // JobService calls; a failed RPC fails the test (EXPECT) and returns an empty answer.
  v1::JobService::Stub& stub() { return *stub_; }
  int64_t Submit(const v1::JobSpec& spec, const std::string& request_id = "",
                 bool* existing = nullptr);
  v1::Job Get(int64_t id);
  std::vector<v1::WorkerInfo> Workers();

  // Polls (every 50 ms) until `done(job)` or `timeout`; returns the last job seen.
  v1::Job WaitFor(int64_t id, const std::function<bool(const v1::Job&)>& done,
                  std::chrono::milliseconds timeout);
  // WaitFor a final state: SUCCEEDED, FAILED or CANCELLED.
  v1::Job WaitDone(int64_t id, std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // Waits until exactly `n` workers hold sessions and are idle.
  bool WaitIdleWorkers(size_t n, std::chrono::milliseconds timeout);
  // Waits until a checkpoint file (ckpt-*.jck, see worker/train/checkpoint.h) lies under
  // options.checkpoint_root; returns its path, or an empty path at the timeout.
  std::filesystem::path WaitForCheckpoint(std::chrono::milliseconds timeout);

  // Runs `joule --coordinator ADDRESS` with --insecure (or, with TLS, --tls-ca DIR/cert.pem),
  // then `args`; captures stdout and stderr into `out`; returns the exit code.
  int Cli(const std::vector<std::string>& args, std::string* out);
  // The same with `global` in place of the transport flags.
  int CliWith(const std::vector<std::string>& global, const std::vector<std::string>& args,
              std::string* out);
  // The CA file clients trust with TLS (DIR/cert.pem).
  std::string ca_file() const { return (dir_ / "cert.pem").string(); }

 private:
  void MakeCertificate();

  const std::filesystem::path dir_;
  const LocalClusterOptions options_;
  bool certificate_made_ = false;
  std::string address_, metrics_address_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_LOCAL_CLUSTER_H_
