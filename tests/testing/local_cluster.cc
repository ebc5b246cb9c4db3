#include "tests/testing/local_cluster.h"

#include "common/names.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "common/security.h"
#include "tests/testing/scratch_dir.h"

namespace joule::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string ProgramPath(const std::string& program) {
  return std::string(JOULE_BIN_DIR) + "/" + program;
}

LocalCluster::LocalCluster(fs::path dir, LocalClusterOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {}

LocalCluster::~LocalCluster() {
  workers_.clear();
  coordinator_.reset();
}

bool MakeSelfSignedCertificate(const std::string& key, const std::string& cert,
                               const std::vector<std::string>& ips, std::string* out) {
  std::string names = "subjectAltName=IP:127.0.0.1,DNS:localhost";
  for (const std::string& ip : ips) names += ",IP:" + ip;
  return RunCommand({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                     key, "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext", names},
                    out) == 0;
}

void LocalCluster::MakeCertificate() {
  std::string out;
  ASSERT_TRUE(MakeSelfSignedCertificate((dir_ / "key.pem").string(), ca_file(),
                                        options_.certificate_ips, &out))
      << out;
  certificate_made_ = true;
}

void LocalCluster::StartCoordinator(const std::string& listen) {
  if (options_.tls && !certificate_made_) {
    ASSERT_NO_FATAL_FAILURE(MakeCertificate());
  }
  const fs::path address_file = dir_ / "addr";
  fs::remove(address_file);
  address_.clear();
  metrics_address_.clear();
  std::vector<std::string> argv = options_.coordinator_prefix;
  argv.insert(argv.end(), {ProgramPath("joule-coordinator"),
                                   "--listen",
                                   listen,
                                   "--db",
                                   (dir_ / "jobs.db").string(),
                                   "--address-file",
                                   address_file.string()});
  if (options_.tls) {
    argv.insert(argv.end(), {"--tls-cert", ca_file(), "--tls-key", (dir_ / "key.pem").string()});
  } else {
    argv.push_back("--insecure");
  }
  if (options_.heartbeat_timeout.count() > 0) {
    argv.insert(argv.end(),
                {"--heartbeat-timeout-ms", std::to_string(options_.heartbeat_timeout.count())});
  }
  if (!options_.metrics_listen.empty()) {
    argv.insert(argv.end(), {"--metrics-listen", options_.metrics_listen});
  }
  for (const std::string& root : options_.data_roots) {
    argv.insert(argv.end(), {"--data-root", root});
  }
  argv.insert(argv.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  coordinator_ = std::make_unique<ChildProcess>(argv, coordinator_log().string());

  // The address file is written (by a rename) once the coordinator serves: line 1 the
  // gRPC address, line 2 the metrics address.
  PollUntil(
      [&] {
        std::ifstream f(address_file);
        std::getline(f, address_);
        std::getline(f, metrics_address_);
        return !address_.empty() || !coordinator_->running();
      },
      kStartTimeout, 20ms);
  ASSERT_FALSE(address_.empty()) << "the coordinator did not start; its log:\n"
                                 << Slurp(coordinator_log());

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options_.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Slurp(ca_file());
    credentials = grpc::SslCredentials(ssl);
  }
  stub_ = v1::JobService::NewStub(grpc::CreateChannel(address_, credentials));
}

void LocalCluster::StartWorkers(int n, const std::vector<std::string>& extra,
                                const std::vector<std::string>& prefix) {
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> argv = prefix;
    argv.insert(argv.end(),
                {ProgramPath("joule-worker"), "--coordinator", address_, "--threads", "1"});
    if (options_.tls) {
      argv.insert(argv.end(), {"--tls-ca", ca_file()});
    } else {
      argv.push_back("--insecure");
    }
    if (options_.collective_timeout.count() > 0) {
      argv.insert(argv.end(),
                  {"--collective-timeout-ms", std::to_string(options_.collective_timeout.count())});
    }
    if (!options_.checkpoint_root.empty()) {
      argv.insert(argv.end(), {"--checkpoint-root", options_.checkpoint_root});
    }
    argv.insert(argv.end(), options_.worker_flags.begin(), options_.worker_flags.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    const int index = static_cast<int>(workers_.size());
    workers_.push_back(std::make_unique<ChildProcess>(argv, worker_log(index).string()));
  }
}

fs::path LocalCluster::worker_log(int index) const {
  return dir_ / ("worker-" + std::to_string(index) + ".log");
}

ChildProcess* LocalCluster::WorkerRunning(int64_t job, int rank) {
  for (const auto& w : Workers()) {
    if (w.state() == v1::WORKER_STATE_BUSY && w.job_id() == job && w.rank() == rank) {
      for (auto& p : workers_) {
        if (p->pid() == w.pid()) return p.get();
      }
    }
  }
  return nullptr;
}

int64_t LocalCluster::Submit(const v1::JobSpec& spec, const std::string& request_id,
                             bool* existing) {
  grpc::ClientContext ctx;
  AddBearer(&ctx, options_.client_token);
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  req.set_request_id(request_id);
  v1::SubmitJobResponse resp;
  grpc::Status s = stub_->SubmitJob(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (existing) *existing = resp.existing();
  return resp.job_id();
}

v1::Job LocalCluster::Get(int64_t id) {
  grpc::ClientContext ctx;
  AddBearer(&ctx, options_.client_token);
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  grpc::Status s = stub_->GetJob(&ctx, req, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job;
}

std::vector<v1::WorkerInfo> LocalCluster::Workers() {
  grpc::ClientContext ctx;
  AddBearer(&ctx, options_.client_token);
  v1::ListWorkersResponse resp;
  grpc::Status s = stub_->ListWorkers(&ctx, {}, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return {resp.workers().begin(), resp.workers().end()};
}

v1::Job LocalCluster::WaitFor(int64_t id, const std::function<bool(const v1::Job&)>& done,
                              std::chrono::milliseconds timeout) {
  v1::Job job;
  PollUntil(
      [&] {
        job = Get(id);
        return done(job);
      },
      timeout);
  return job;
}

v1::Job LocalCluster::WaitDone(int64_t id, std::chrono::milliseconds timeout) {
  return WaitFor(
      id,
      [](const v1::Job& j) { return IsTerminal(j.state()); },
      timeout);
}

bool LocalCluster::WaitIdleWorkers(size_t n, std::chrono::milliseconds timeout) {
  return PollUntil(
      [&] {
        size_t idle = 0;
        for (const auto& w : Workers()) idle += w.state() == v1::WORKER_STATE_IDLE;
        return idle == n;
      },
      timeout);
}

fs::path LocalCluster::WaitForCheckpoint(std::chrono::milliseconds timeout) {
  fs::path found;
  PollUntil(
      [&] {
        std::error_code ec;
        for (fs::recursive_directory_iterator it(options_.checkpoint_root, ec), end;
             !ec && it != end; it.increment(ec)) {
          const std::string name = it->path().filename().string();
          if (name.starts_with("ckpt-") && name.ends_with(".jck")) {
            found = it->path();
            return true;
          }
        }
        return false;
      },
      timeout, 10ms);
  return found;
}

int LocalCluster::Cli(const std::vector<std::string>& args, std::string* out) {
  if (options_.tls) return CliWith({"--tls-ca", ca_file()}, args, out);
  return CliWith({"--insecure"}, args, out);
}

int LocalCluster::CliWith(const std::vector<std::string>& global,
                          const std::vector<std::string>& args, std::string* out) {
  std::vector<std::string> argv = {ProgramPath("joule"), "--coordinator", address_};
  argv.insert(argv.end(), global.begin(), global.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, out);
}

}  // namespace joule::testing
