#ifndef JOULE_WORKER_DATA_HDF5_ARRAYS_H_
#define JOULE_WORKER_DATA_HDF5_ARRAYS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/open_beneath.h"

namespace joule::worker {

// A regression dataset in one HDF5 file (Debian's libhdf5): two datasets of the same
// number of rows N (dimension 0), `inputs` [N, d1, ...] and `targets` [N, e1, ...], float32
// or float64 (read as float32), e.g. an ERA5 field at time t and at t + 6 h. The last
// max(1, N / 10) rows (after keeping the first max_rows, if > 0) are the test split, the
// rest the training split: a contiguous hold-out, as a time series wants.
//
// Each rank reads only its shard of each split, in chunks of at most kHdf5ChunkRows rows
// (HDF5 hyperslabs): rank r of w takes rows [r n / w, (r + 1) n / w) of a split of n rows,
// so the shards are disjoint and together complete. The returned datasets are sharded
// (dataset.h): `images` holds the rank's inputs, `targets` its targets, `total` the
// split's n and `min_shard` floor(n / w) (every rank trains that many per epoch).
//
// The file is opened with `open` (beneath the worker's roots) and read through
// /proc/self/fd, so HDF5 sees exactly the file the opener checked.
// Errors: the opener's; DATA_LOSS naming the file for one HDF5 cannot read, a missing
// dataset, a non-float type, row counts that differ, fewer than 2 rows or more than
// kMaxHdf5Rows, a zero-size dimension, or more than kMaxHdf5Values values in a shard.
// Thread-safe (calls are serialised: not every libhdf5 build is).
inline constexpr int64_t kHdf5ChunkRows = 1024;
inline constexpr int64_t kMaxHdf5Values = int64_t{1} << 32;  // 16 GiB of float32 per shard
inline constexpr int64_t kMaxHdf5Rows = int64_t{1} << 31;    // rows of a dataset

struct Hdf5Splits {
  ImageDataset train;
  ImageDataset test;
};
absl::StatusOr<Hdf5Splits> ReadHdf5Shards(const std::string& file, const std::string& inputs,
                                          const std::string& targets, int64_t max_rows,
                                          int rank, int world, const FileOpener& open);

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_HDF5_ARRAYS_H_
