#ifndef JOULE_WORKER_DATA_STAGING_H_
#define JOULE_WORKER_DATA_STAGING_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/open_beneath.h"

namespace joule::worker {

// A job's data copied to node-local scratch before its first epoch (`stage: local`), as the
// second paper stages ImageNet to $TMPDIR: training then reads the local copy, not the
// shared file system.
struct StagedData {
  std::string path;   // the copy: what the job's dataset names, under the staging directory
  bool copied = false;  // false: an earlier rank or attempt on this host had staged it
  int64_t files = 0;    // in the copy
  int64_t bytes = 0;
};

// Copies `source` (a directory: an image folder's train/, val/ or test/ and classes.txt;
// or one file: an HDF5 file) into `dir` (created; e.g. SCRATCH/joule-stage/job-7-UID),
// every source file opened with `open` (beneath the worker's roots). Ranks and attempts
// of the job on one host share the copy: an exclusive lock on `dir`.lock makes one copy
// while the others wait, and a marker written last (dir/.joule-staged) tells them it is
// whole; a copy left half-made by a crash is removed and made again.
// Errors: the opener's (naming the file); UNAVAILABLE naming the path when the copy cannot
// be written (a full or missing scratch disk).
absl::StatusOr<StagedData> StageLocal(const std::string& source, const std::string& dir,
                                      const FileOpener& open);

// Removes a staged copy (the job's attempt ended well: nothing on this host reads it any
// more), under the same lock. Errors are ignored (a copy left behind is only space).
void RemoveStaged(const std::string& dir);

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_STAGING_H_
