#ifndef JOULE_CLIENT_SUBPROCESS_H_
#define JOULE_CLIENT_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace joule::client {

// The programs the CLI starts: `cluster up`'s coordinator and workers (Spawn) and the
// worker's TorchScript exporter (RunProgram). One fork/exec: argv[0] is looked up in
// PATH (execvp), and a failed exec is reported through a close-on-exec pipe, so the
// caller learns that the program never ran, and why, rather than a bare 127.
// Thread-safe as fork is: call them from one thread of the CLI.

// Starts `argv` in a session of its own (it outlives the CLI and ignores its terminal's
// signals), stdin from /dev/null, stdout and stderr appended to the file `log`. Returns
// its pid once exec succeeded. Errors: INVALID_ARGUMENT for an empty argv; NOT_FOUND /
// PERMISSION_DENIED / UNAVAILABLE naming the program and the OS's reason when it cannot
// be started; UNAVAILABLE when `log` cannot be opened.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log);

// Runs `argv` to its end with stdout and stderr in `*output` (at most its first MiB).
// Returns its exit status, 128 + N when signal N ended it. Errors: as Spawn's for a
// program that cannot be started.
absl::StatusOr<int> RunProgram(const std::vector<std::string>& argv, std::string* output);

}  // namespace joule::client

#endif  // JOULE_CLIENT_SUBPROCESS_H_
