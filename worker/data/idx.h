#ifndef JOULE_WORKER_DATA_IDX_H_
#define JOULE_WORKER_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "worker/data/open_beneath.h"
#include <vector>

#include "absl/status/statusor.h"

namespace joule::worker {

// An IDX array of unsigned bytes (the format of MNIST and Fashion-MNIST, LeCun et al.):
// a 4-byte magic {0, 0, 0x08, ndim}, ndim big-endian uint32 dimensions, then the data in
// row-major order.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;  // product(dims) bytes
};

// Parses an IDX file's bytes. `name` only labels errors. Errors: DATA_LOSS naming the
// file for a bad magic, a type other than unsigned byte, 0 or more than 4 dimensions,
// a zero dimension, fewer data bytes than the header promises ("truncated") or more.
absl::StatusOr<IdxArray> ParseIdx(std::string_view bytes, const std::string& name);

// Reads and parses an IDX file, gzip-compressed or raw (zlib reads both).
// Errors: NOT_FOUND when the file does not exist; DATA_LOSS for a corrupt gzip stream or
// a bad IDX body; RESOURCE_EXHAUSTED for a file over 1 GiB uncompressed; those of `open`
// (e.g. PERMISSION_DENIED outside the data roots).
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, const FileOpener& open = OpenPlain);

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_IDX_H_
