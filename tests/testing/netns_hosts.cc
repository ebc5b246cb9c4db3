#include "tests/testing/netns_hosts.h"

#include <signal.h>

#include <chrono>
#include <sstream>

#include "tests/testing/scratch_dir.h"

namespace joule::testing {

using namespace std::chrono_literals;

std::string NetnsHosts::Script() {
  return std::string(JOULE_SOURCE_DIR) + "/scripts/netns-hosts.sh";
}

NetnsHosts::NetnsHosts(int n, const std::filesystem::path& log,
                       const std::vector<std::string>& flags)
    : log_(log) {
  std::vector<std::string> argv = {"/bin/bash", Script(), "up", std::to_string(n)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  up_ = std::make_unique<ChildProcess>(argv, log_.string());
  PollUntil(
      [&] {
        std::istringstream in(Slurp(log_));
        for (std::string line; std::getline(in, line);) {
          // "ready RUN NET"
          std::istringstream words(line);
          std::string ready, run, net;
          if (words >> ready >> run >> net && ready == "ready") {
            run_ = run;
            net_ = net;
            return true;
          }
        }
        return !up_->running();
      },
      30s, 20ms);
  // The script's exit 77 comes with this one line (ChildProcess keeps no exit status).
  if (const std::string out = Slurp(log_); run_.empty() && out.find("skipped:") != std::string::npos) {
    skip_reason_ = out;
    while (!skip_reason_.empty() && skip_reason_.back() == '\n') skip_reason_.pop_back();
  }
}

NetnsHosts::~NetnsHosts() {
  if (up_ && up_->running()) {
    up_->Signal(SIGTERM);
    up_->Wait(20s);
  }
  if (!run_.empty()) {
    std::string out;
    RunCommand({"/bin/bash", Script(), "down", run_}, &out);
  }
}

std::string NetnsHosts::log() const { return Slurp(log_); }

std::string NetnsHosts::Address(int i) const { return net_ + "." + std::to_string(i); }

std::vector<std::string> NetnsHosts::Prefix(int i) const {
  return {"/usr/bin/env", "JNH_RUN=" + run_, "/bin/bash", Script(), "exec", std::to_string(i)};
}

absl::Status NetnsHosts::Run(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"/usr/bin/env", "JNH_RUN=" + run_, "/bin/bash", Script()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  if (const int rc = RunCommand(argv, &out); rc != 0) {
    return absl::InternalError("netns-hosts.sh " + args.front() + " exited " +
                               std::to_string(rc) + ": " + out);
  }
  return absl::OkStatus();
}

absl::Status NetnsHosts::SetLink(int i, bool up) const {
  return Run({"link", std::to_string(i), up ? "up" : "down"});
}

absl::Status NetnsHosts::Partition(int i) const { return Run({"partition", std::to_string(i)}); }

absl::Status NetnsHosts::Heal(int i) const { return Run({"heal", std::to_string(i)}); }

absl::Status NetnsHosts::SetRate(int i, const std::string& rate) const {
  return Run({"rate", std::to_string(i), rate});
}

std::string NetnsHosts::Leftovers(const std::string& run) {
  std::string netns, links;
  RunCommand({"/bin/sh", "-c", "ip netns list | grep 'jnh-" + run + "-' || true"}, &netns);
  RunCommand({"/bin/sh", "-c", "ip -o link show | grep 'jnh" + run + "' || true"}, &links);
  return netns + links;
}

}  // namespace joule::testing
