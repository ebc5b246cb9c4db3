#ifndef JOULE_WORKER_TRAIN_SPLITS_H_
#define JOULE_WORKER_TRAIN_SPLITS_H_

#include <string>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"
#include "worker/data/dataset.h"
#include "worker/data/open_beneath.h"

namespace joule::worker {

// The two splits an attempt trains and evaluates on, whole on every rank (each rank
// takes its shard per step, EpochSharder).
struct Splits {
  ImageDataset train;
  ImageDataset test;
  // The training split's size before the stratified 1/dataset_fraction was kept (after
  // max_train_samples): the dataset's size when max_train_samples is 0.
  int64_t train_examples_before_fraction = 0;
};

// Loads `spec.dataset`:
//   "synthetic:CxHxW:classes:size"  generated (MakeSyntheticDataset);
//   "csv:FILE"                      a CSV file split into train and test (LoadCsvDataset);
//   "idx:DIR"                       an MNIST-layout IDX directory;
//   a name ("fashion-mnist")        the IDX directory `data_root`/name.
// keeping at most spec.max_train_samples / max_test_samples examples (0: all) and then a
// stratified 1/spec.dataset_fraction of the training split. Files of csv: and idx:
// datasets are opened with `open` (beneath the worker's allowed roots); named datasets
// lie under the worker's own data root and are opened plainly.
// Errors: those of the loaders (NOT_FOUND, DATA_LOSS naming the file,
// PERMISSION_DENIED outside the roots, INVALID_ARGUMENT for a malformed name); DATA_LOSS
// when the test images' height and width differ from the training images'.
// "hdf5:FILE:INPUTS:TARGETS" reads only rank `rank` of `world`'s shard of each split
// (ReadHdf5Shards); the other datasets are whole on every rank.
absl::StatusOr<Splits> LoadSplits(const v1::JobSpec& spec, const std::string& data_root,
                                  const FileOpener& open, int rank = 0, int world = 1);

// INVALID_ARGUMENT unless spec.local_batch_size > 0, global batch = `world` x local batch
// x max(1, accumulation_steps), and the training split holds at least one global batch
// (`train_size` examples): each rank's share of a step then tiles exactly into
// micro-batches. (The coordinator normalises specs; a worker still refuses batch sizes
// that do not tile, which would otherwise index past its share of a step.)
absl::Status CheckBatchTiling(const v1::JobSpec& spec, int world, int64_t train_size);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_SPLITS_H_
