#ifndef JOULE_CLIENT_CLUSTER_STATE_H_
#define JOULE_CLIENT_CLUSTER_STATE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace joule::client {

// What `joule cluster up` records of each process it starts, so that `joule cluster down`
// signals only those: a bare PID names another process once ours has exited (after a reboot
// any process, perhaps root's). The start time tells a reused PID apart; the executable
// guards the start time. Plain data.
struct ProcessIdentity {
  pid_t pid = 0;
  uint64_t start_ticks = 0;  // /proc/PID/stat field 22: start, in clock ticks after boot
  std::string exe;           // /proc/PID/exe, without the " (deleted)" of a replaced file

  bool operator==(const ProcessIdentity&) const = default;
};

// The identity of the live process `pid`, read from `proc_root` ("/proc"; tests give a fake
// tree). Errors: NOT_FOUND when there is no such process or it is a zombie (it has exited);
// PERMISSION_DENIED when its executable cannot be read (another user's process);
// INTERNAL for a stat line that cannot be parsed.
absl::StatusOr<ProcessIdentity> IdentifyProcess(pid_t pid, const std::string& proc_root = "/proc");

// Whether the process a state file recorded is still running.
enum class Ownership {
  kOurs,     // the same PID, start time and executable: the process `cluster up` started
  kGone,     // no process has the PID any more (or only a zombie)
  kNotOurs,  // another process holds the PID now, or one we may not inspect
};
// `why`, when not null, receives for kNotOurs what differs (or why the process could not be
// inspected), for a note to the user.
Ownership CheckProcess(const ProcessIdentity& recorded, std::string* why = nullptr,
                       const std::string& proc_root = "/proc");

// STATE_DIR/pids. Version 2, written by this joule:
//   # joule cluster pids v2: PID START_TICKS EXE
//   4242 1234567 /usr/local/bin/joule-coordinator
//   4250 1234570 /usr/local/bin/joule-worker
// one line per process in start order (the coordinator first); EXE runs to the line's end.
// An older joule wrote bare PIDs, one per line, with nothing to check them by: those are
// returned as `legacy_pids`, for the caller to refuse to signal.
struct PidsFile {
  std::vector<ProcessIdentity> processes;
  std::vector<pid_t> legacy_pids;
};
std::string FormatPidsFile(const std::vector<ProcessIdentity>& processes);
// Errors: INVALID_ARGUMENT naming `path` and the line for anything else.
absl::StatusOr<PidsFile> ParsePidsFile(const std::string& text, const std::string& path);

}  // namespace joule::client

#endif  // JOULE_CLIENT_CLUSTER_STATE_H_
