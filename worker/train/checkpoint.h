#ifndef JOULE_WORKER_TRAIN_CHECKPOINT_H_
#define JOULE_WORKER_TRAIN_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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
//
// Protobuf serializes and parses at most 2 GiB - 1 (INT_MAX) bytes in one call. A larger
// payload is still one serialized Checkpoint, the same bytes protobuf would write (its
// top-level fields in field-number order; a message's encoding is the concatenation of
// its fields' encodings), but it is written and read a run of whole top-level fields at a
// time (kMaxPayloadPiece bytes at most). So no one field (one tensor) may exceed that.

// Hash of the spec fields that shape the model, the optimizer's state and the data order
// (model, hidden sizes, dataset, subset sizes, global batch, workers, seed; the
// optimizer's name unless sgd; for a ga job also its population, fitness batch and
// generations): a checkpoint
// from a different job shape is never resumed.
uint64_t SpecHash(const v1::JobSpec& spec);

// The directory of a job's checkpoints under a worker's checkpoint root: ROOT/job-<id>,
// or ROOT/job-<id>-<uid> when the job has a uid (a new database reuses ids); "" (no
// checkpoints) when `root` is empty. The workers write there, `joule export` reads there.
std::string CheckpointDirectory(const std::string& root, int64_t job_id,
                                const std::string& job_uid);

// Writes `checkpoint` into `dir` (created if needed), then deletes all but the keep-1
// newest files with a lower step (files with a higher step are left alone).
// Errors: UNAVAILABLE naming the path on any I/O error; OUT_OF_RANGE naming the field when
// one field serializes to more than kMaxPayloadPiece bytes (nothing is written). The
// previous checkpoints stay.
absl::Status WriteCheckpoint(const std::string& dir, const v1::Checkpoint& checkpoint, int keep);

// Reads and verifies one checkpoint file. Errors: NOT_FOUND, DATA_LOSS naming the file and
// what is wrong (magic, length, checksum, payload, a field too large to parse).
absl::StatusOr<v1::Checkpoint> ReadCheckpoint(const std::string& path);

// The payload codec that WriteCheckpoint and ReadCheckpoint use, with the piece limit a
// parameter so that tests reach the multi-piece path without 2 GiB of data.
inline constexpr size_t kMaxPayloadPiece = 2147483647;  // INT_MAX: protobuf's limit

// Appends `checkpoint` serialized to `out`: in one piece when it fits in `max_piece`
// bytes, else top-level field by field. Errors: OUT_OF_RANGE naming a field (with its
// tag and length) or a run of scalar fields larger than `max_piece`.
absl::Status AppendCheckpointPayload(const v1::Checkpoint& checkpoint, size_t max_piece,
                                     std::string* out);

// Parses a serialized Checkpoint of any length into `*out`, handing protobuf the pieces
// SplitCheckpointPayload gives. Errors: DATA_LOSS saying where the payload is malformed,
// or which field (number, offset, length) is larger than `max_piece`.
absl::Status ParseCheckpointPayload(absl::string_view payload, size_t max_piece,
                                    v1::Checkpoint* out);

// The pieces, [begin, end) byte ranges that tile `payload`, each at most `max_piece` bytes
// and made of whole top-level fields: the whole payload where it fits. Checks the wire
// format only as far as finding field boundaries needs. Errors as ParseCheckpointPayload.
absl::StatusOr<std::vector<std::pair<size_t, size_t>>> SplitCheckpointPayload(
    absl::string_view payload, size_t max_piece);

// The newest checkpoint in `dir` that verifies and matches `spec_hash`; files that do not
// are skipped, each with its reason appended to `*skipped`. NOT_FOUND when none is usable
// (including no directory).
// `accept` (may be empty) may refuse a checkpoint that verifies (returning why, which is
// appended to `*skipped`; "" accepts): the search goes on to older files.
absl::StatusOr<v1::Checkpoint> LoadNewestCheckpoint(
    const std::string& dir, uint64_t spec_hash, std::vector<std::string>* skipped,
    const std::function<std::string(const v1::Checkpoint&)>& accept = nullptr);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_CHECKPOINT_H_
