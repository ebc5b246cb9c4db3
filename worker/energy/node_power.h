#ifndef JOULE_WORKER_ENERGY_NODE_POWER_H_
#define JOULE_WORKER_ENERGY_NODE_POWER_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace joule::worker {

// Whole-node power from the node's BMC: what the wall socket feeds the node (fans, PSU
// losses, NICs and disks included), which RAPL and NVML do not see. MLPerf Power measures
// training there (>= 1 Hz); Kepler reads it over Redfish.
class NodePowerReader {
 public:
  virtual ~NodePowerReader() = default;
  // The node's power now, in watts (finite, >= 0). Errors: UNAVAILABLE (no answer within
  // the timeout, refused), DATA_LOSS (an answer that holds no reading), PERMISSION_DENIED
  // (credentials refused), NOT_FOUND (another HTTP status); one line each. Not
  // thread-safe: one poller calls it.
  virtual absl::StatusOr<double> ReadWatts() = 0;
  // What is read, e.g. "redfish https://bmc/redfish/v1/Chassis/1/EnvironmentMetrics".
  virtual std::string Describe() const = 0;
};

// Redfish (DMTF DSP0266; resources from the schema bundle DSP8010).
struct RedfishOptions {
  // The BMC: "https://bmc.example[:port]" (or http:// where the BMC serves plain HTTP).
  std::string url;
  // The chassis id under /redfish/v1/Chassis; empty: the collection's first member.
  std::string chassis;
  // "user:password" on the file's first line (a secret's file); empty: no authentication.
  std::string credentials_file;
  // PEM CA bundle the BMC's certificate is verified against; empty: the system's.
  std::string ca_file;
  // Do not verify the BMC's certificate (BMCs ship self-signed ones): the log says so.
  bool insecure_tls = false;
  // Each request's limit, connect to last byte.
  std::chrono::milliseconds timeout{2000};
};

// Reads PowerWatts.Reading of Chassis/{id}/EnvironmentMetrics (Redfish 2020.4 and later),
// else PowerControl[0].PowerConsumedWatts of Chassis/{id}/Power (deprecated in 2020.4,
// what most BMCs still serve); Open finds which one answers and keeps to it. Answers over
// kMaxBodyBytes are refused. Errors: INVALID_ARGUMENT (a URL that is not http(s)://host,
// an unreadable or malformed credentials file: the message never holds the password),
// and the first reading's. Not thread-safe.
absl::StatusOr<std::unique_ptr<NodePowerReader>> OpenRedfish(const RedfishOptions& options);
inline constexpr size_t kMaxRedfishBodyBytes = 1 << 20;
// IPMI DCMI (DCMI 1.5 "Get Power Reading") through ipmitool, where the BMC has no Redfish:
// `ipmitool [-I lanplus -H HOST -U USER -E] -N SECONDS -R 1 dcmi power reading`, its
// "Instantaneous power reading: N Watts" line. The password goes to ipmitool in its
// environment (IPMI_PASSWORD, -E), never on its command line.
struct IpmiOptions {
  std::string ipmitool = "ipmitool";  // the program (PATH is searched)
  // The BMC over the network (lanplus); empty: this host's own BMC (/dev/ipmi0).
  std::string host;
  std::string credentials_file;             // "user:password" on its first line; with `host`
  std::chrono::milliseconds timeout{3000};  // each reading, ipmitool's run included
};
// Errors: INVALID_ARGUMENT (credentials file), and the first reading's: UNAVAILABLE
// (ipmitool missing, failing, or past the timeout: killed), DATA_LOSS (no reading in its
// output, or the BMC's power reading deactivated); one line, with ipmitool's own message.
absl::StatusOr<std::unique_ptr<NodePowerReader>> OpenIpmiDcmi(const IpmiOptions& options);

// NodeEnergyPoller::SetShared's default: /tmp/joule-node-power-EUID (this user's workers).
std::string DefaultNodePowerDir();

// A node drawing more than this is not a reading (the largest 8-GPU servers draw ~10 kW).
inline constexpr double kMaxNodeWatts = 100000.0;

// Polls a NodePowerReader on its own thread every `period` (>= 1 Hz is MLPerf Power's
// rule) and integrates the readings with the trapezoid rule (as perun does):
// E += (W_prev + W_now) / 2 x dt. A failed reading is skipped; the next good one closes
// the gap, unless it is longer than `max_gap`: then the gap is not integrated (its energy
// is lost, counted in lost_seconds) and the warning says so. Thread-safe, but Poll is the
// thread's: call it yourself only without Start's thread (period 0).
//
// One poller per host (SetShared): the workers of a host that read one BMC share a lock
// file and a state file in a directory they all reach, DIR/node-KEY.{lock,state} (KEY from
// the BMC's description). The process holding the lock (flock, released by the kernel when
// it exits) reads the BMC and writes the node's cumulative energy to the state file each
// period; the others read that file instead of the BMC and try the lock each period, so
// one of them takes over when the poller's process ends, continuing from the total it
// left (the readings missed meanwhile are a gap). totals().joules only grows.
class NodeEnergyPoller {
 public:
  struct Totals {
    double joules = 0;        // integrated since Start (shared: the host's, from this
                              // process's first look at it)
    double watts = 0;         // the last reading
    double lost_seconds = 0;  // of gaps not integrated
    int64_t readings = 0, failures = 0;
    std::string last_error;  // the last failed reading's, "" once one succeeds
  };
  // `clock`: steady time for the integration; the state file's freshness is checked by
  // its modification time against the system clock.
  NodeEnergyPoller(std::unique_ptr<NodePowerReader> reader, const Clock* clock,
                   std::chrono::milliseconds period, std::chrono::milliseconds max_gap);
  ~NodeEnergyPoller();
  // Shares the BMC with the other workers of this host through `dir` (created if needed);
  // before Start. Errors: UNAVAILABLE naming the directory or file it cannot create.
  absl::Status SetShared(const std::string& dir);
  // Whether this process reads the BMC now (always, unless shared).
  bool polling() const;
  // Reads once now (the integration's start) and starts the thread.
  void Start();
  void Stop();
  // Takes one reading now (the thread's step; tests call it with no thread).
  void Poll();
  Totals totals() const;
  std::string Describe() const { return reader_->Describe(); }
  // The other side of splitting the node's energy by component energy: what the host's
  // other workers' own devices (their GPUs; channels not shared by the host's workers)
  // used. Publishes this worker's cumulative own-device energy (`own_devices_joules`, J)
  // in the shared directory (node-KEY.devices.TOKEN, removed at destruction) and returns
  // the others' since this worker's last call (J), from the files published within the
  // last minute, or five of the BMC's periods if longer (a new one counts from its first
  // sight; one ten times older is removed). 0 when unshared (SetShared not
  // called or failed). Thread-safe; call it at most a few times a second (it lists the
  // directory).
  double ExchangeDeviceJoules(double own_devices_joules);

 private:
  std::unique_ptr<NodePowerReader> reader_;
  const Clock* clock_;
  const std::chrono::milliseconds period_, max_gap_;
  mutable std::mutex mu_;
  Totals totals_;
  bool have_last_ = false;
  Clock::TimePoint last_time_;
  double last_watts_ = 0;
  bool stopping_ = false;
  std::condition_variable cv_;
  std::thread thread_;
  // Shared polling: the lock's descriptor (-1 unshared), whether it is held, the state file.
  int lock_fd_ = -1;
  bool holds_lock_ = false;
  std::string state_path_;
  bool have_base_ = false;
  double shared_base_ = 0;  // the host's total when totals_.joules was 0
  // ExchangeDeviceJoules: its own file (named by a random token, 16 hex digits, made by
  // SetShared), the others' last totals by file name.
  std::mutex exchange_mu_;
  std::string devices_token_, own_devices_path_;
  std::map<std::string, double> others_devices_;
  bool exchange_warned_ = false;
  // Poll's halves: this process reads the BMC, or the state file another one writes.
  void PollBmc();
  void ReadShared();
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_NODE_POWER_H_
