#ifndef JOULE_COMMON_ATOMIC_FILE_H_
#define JOULE_COMMON_ATOMIC_FILE_H_
// Every file Joule writes for a user (exported models, HTML reports, sweep tables, the
// local cluster's state) is written whole or not at all, and never through a symlink:
//   1. a fresh temporary file is created beside the target, in its directory, named
//      ".NAME.XXXXXX" (mkstemp: O_CREAT | O_EXCL, so it never opens what is already there,
//      a symlink included);
//   2. the bytes are written to it and flushed to disk (fsync);
//   3. it is renamed over the target. rename(2) replaces a symlink at the target itself,
//      never the file the symlink points to; a reader sees the old file or the new one.
// On any failure the temporary file is removed and the target is left as it was.
// The file's mode is 0644 less the umask (mkstemp's 0600 widened, as open(2) would make it):
// a replaced file's own mode, owner and hard links are not kept (it is a new file).
// Thread-safe (the umask is read, never set); not safe against another process writing
// the same target.
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace joule {

// Writes `bytes` to `path` as above. Errors (one line, naming `path`): INVALID_ARGUMENT for
// an empty path, "-" (standard output is not a file: the caller decides whether it writes
// there) or a path that is a directory; UNAVAILABLE with the system's reason (no such
// directory, permission, disk full).
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// The same for a writer that takes a file name (libzip, torch::jit::Module::save):
// `write(temp_path)` fills the temporary file (it exists, empty; the writer may replace it
// by renaming its own file over it), then it is flushed and renamed over `path`. A non-OK
// status from `write` is returned as it is, after the temporary file is removed.
absl::Status WriteFileAtomicallyWith(const std::string& path,
                                     const std::function<absl::Status(const std::string&)>& write);

}  // namespace joule

#endif  // JOULE_COMMON_ATOMIC_FILE_H_
