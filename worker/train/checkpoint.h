#ifndef JOULE_WORKER_TRAIN_CHECKPOINT_H_
#define JOULE_WORKER_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "joule/v1/checkpoint.pb.h"
#include "joule/v1/job.pb.h"

namespace joule::worker {

// Checkpoint files: DIR/ckpt-<global step, 12 digits>.jck, each
//   8 bytes  magic "JOULECK1"
//   8 bytes  payload length, little-endian
//   payload  a serialized joule.v1.Checkpoint
//   4 bytes  CRC-32 (zlib) of the payload, little-endian
// written atomically: a temporary file in DIR, fsync, rename, fsync of DIR. A reader that
// finds a torn, truncated or corrupt file sees a bad magic, length or checksum.

// Hash of the spec fields that shape the model, the optimizer's state and the data order
// (model, hidden sizes, dataset, subset sizes, global batch, workers, seed): a checkpoint
// from a different job shape is never resumed.
uint64_t SpecHash(const v1::JobSpec& spec);

// Writes `checkpoint` into `dir` (created if needed), then deletes all but the keep-1
// newest files with a lower step (files with a higher step are left alone).
// Errors: UNAVAILABLE naming the path on any I/O error (the previous checkpoints stay).
absl::Status WriteCheckpoint(const std::string& dir, const v1::Checkpoint& checkpoint, int keep);

// Reads and verifies one checkpoint file. Errors: NOT_FOUND, DATA_LOSS naming the file and
// what is wrong (magic, length, checksum, payload).
absl::StatusOr<v1::Checkpoint> ReadCheckpoint(const std::string& path);

// The newest checkpoint in `dir` that verifies and matches `spec_hash`; files that do not
// are skipped, each with its reason appended to `*skipped`. NOT_FOUND when none is usable
// (including no directory).
absl::StatusOr<v1::Checkpoint> LoadNewestCheckpoint(const std::string& dir, uint64_t spec_hash,
                                                    std::vector<std::string>* skipped);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_CHECKPOINT_H_
