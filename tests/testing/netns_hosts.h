#ifndef JOULE_TESTS_TESTING_NETNS_HOSTS_H_
#define JOULE_TESTS_TESTING_NETNS_HOSTS_H_

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/testing/process.h"

namespace joule::testing {

// Test hosts: scripts/netns-hosts.sh `up` run as a child of the test, which holds N network
// namespaces on one bridge (host i at NET.i, where NET is the run's own /24 of
// 198.18.0.0/15, so that tests running at the same time do not meet; the test itself, in the
// root namespace, reaches them through the bridge's NET.254). Destruction stops the script (SIGTERM:
// its trap removes every namespace, veth and the bridge, killing what still runs inside),
// then runs `down RUN` in case it could not. Were the test killed, the script notices its
// parent gone and cleans up itself. Not thread-safe.
class NetnsHosts {
 public:
  // Starts `n` hosts with the script's extra `up` flags (--rate R, --loss P), its output
  // appended to `log`. Check skip_reason() (the script exited 77: not root, no iproute2)
  // and ready() after construction.
  NetnsHosts(int n, const std::filesystem::path& log, const std::vector<std::string>& flags = {});
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  bool ready() const { return !run_.empty(); }
  // Why the hosts could not be made because of this machine; empty otherwise.
  const std::string& skip_reason() const { return skip_reason_; }
  // The script's output so far (for failure messages).
  std::string log() const;

  // Host `i`'s address (1..n), e.g. "198.18.0.2" (once ready()).
  std::string Address(int i) const;
  // The argv prefix that runs a program in host `i` (the script's `exec`, which keeps the
  // program's pid: ip netns exec execs it).
  std::vector<std::string> Prefix(int i) const;
  // Faults (the script's `link`, `partition` and `heal`; an error carries its output):
  // SetLink takes host `i`'s link down (a pulled cable: the bridge end of its veth, so
  // nothing inside the host is told) or back up. Partition drops every packet between host
  // `i` and the other hosts, while the caller (the root namespace) still reaches it; Heal
  // undoes it.
  absl::Status SetLink(int i, bool up) const;
  absl::Status Partition(int i) const;
  absl::Status Heal(int i) const;
  // Shapes both directions of host `i`'s link to `rate` (a tc rate: "100mbit"), or
  // removes the shaping ("off").
  absl::Status SetRate(int i, const std::string& rate) const;

  // The network namespaces and links whose names carry this run's id, as `ip` lists them
  // (empty once they are removed).
  static std::string Leftovers(const std::string& run);
  const std::string& run() const { return run_; }

  // The harness script's path in the source tree.
  static std::string Script();

 private:
  absl::Status Run(const std::vector<std::string>& args) const;

  std::filesystem::path log_;
  std::unique_ptr<ChildProcess> up_;
  std::string run_, net_, skip_reason_;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_NETNS_HOSTS_H_
