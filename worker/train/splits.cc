#include "worker/train/splits.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "worker/data/csv.h"
#include "worker/data/hdf5_arrays.h"
#include "worker/data/image_folder.h"

namespace joule::worker {

absl::StatusOr<Splits> LoadSplits(const v1::JobSpec& spec, const std::string& data_root,
                                  const FileOpener& open, int rank, int world) {
  std::string dir;
  if (absl::Status s = ResolveDataset(spec.dataset(), data_root, &dir); !s.ok()) return s;
  absl::StatusOr<ImageDataset> train, test;
  if (dir.empty()) {  // synthetic
    absl::StatusOr<SyntheticSpec> syn = ParseSynthetic(spec.dataset());
    if (!syn.ok()) return syn.status();
    train = MakeSyntheticDataset(*syn, Split::kTrain);
    test = MakeSyntheticDataset(*syn, Split::kTest);
  } else if (absl::StartsWith(spec.dataset(), "hdf5:")) {
    absl::StatusOr<Hdf5Dataset> h = ParseHdf5Dataset(spec.dataset());
    if (!h.ok()) return h.status();
    absl::StatusOr<Hdf5Splits> shards =
        ReadHdf5Shards(h->file, h->inputs, h->targets, spec.max_train_samples(), rank, world, open);
    if (!shards.ok()) return shards.status();
    const int64_t total = shards->train.total;
    return Splits{std::move(shards->train), std::move(shards->test), total};
  } else if (absl::StartsWith(spec.dataset(), "imagefolder:")) {
    const int side = spec.augment().size() > 0 ? spec.augment().size() : 224;
    absl::StatusOr<ImageFolderSplits> folder =
        ScanImageFolder(dir, side, spec.max_train_samples(), spec.max_test_samples());
    if (!folder.ok()) return folder.status();
    train = std::move(folder->train);
    test = std::move(folder->test);
  } else if (absl::StartsWith(spec.dataset(), "csv:")) {
    auto both = LoadCsvDataset(dir, spec.max_train_samples(), spec.max_test_samples(),
                               CsvLimits{}, open);
    if (!both.ok()) return both.status();
    train = std::move(both->first);
    test = std::move(both->second);
  } else {
    // Named datasets ("fashion-mnist") lie under the worker's own data root.
    const FileOpener& idx_open = absl::StartsWith(spec.dataset(), "idx:") ? open : OpenPlain;
    train = LoadIdxDataset(dir, Split::kTrain, spec.max_train_samples(), idx_open);
    if (!train.ok()) return train.status();
    test = LoadIdxDataset(dir, Split::kTest, spec.max_test_samples(), idx_open);
  }
  if (!test.ok()) return test.status();
  const int64_t before_fraction = train->size;
  KeepStratifiedFraction(*train, spec.dataset_fraction());
  if (test->height != train->height || test->width != train->width) {
    return absl::DataLossError(absl::StrCat(dir, ": test images are ", test->height, "x",
                                            test->width, ", train images ", train->height, "x",
                                            train->width));
  }
  return Splits{*std::move(train), *std::move(test), before_fraction};
}

absl::Status CheckBatchTiling(const v1::JobSpec& spec, int world, int64_t train_size) {
  const int64_t gbs = spec.global_batch_size();
  const int64_t micro_per_step = std::max(1, spec.accumulation_steps());
  if (world < 1 || spec.local_batch_size() <= 0 ||
      gbs != int64_t{world} * spec.local_batch_size() * micro_per_step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global_batch_size ", gbs, " is not workers ", world, " x local_batch_size ",
        spec.local_batch_size(), " x accumulation_steps ", micro_per_step));
  }
  if (train_size < gbs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training split has ", train_size, " examples, fewer than one global batch (",
        gbs, ")"));
  }
  return absl::OkStatus();
}

}  // namespace joule::worker
