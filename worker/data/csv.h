#ifndef JOULE_WORKER_DATA_CSV_H_
#define JOULE_WORKER_DATA_CSV_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "worker/data/open_beneath.h"
#include "worker/data/dataset.h"

namespace joule::worker {

// Bounds on a CSV table, so a hostile or mistaken file fails cleanly instead of
// exhausting memory.
struct CsvLimits {
  int64_t max_rows = 10'000'000;
  int64_t max_columns = 100'000;
  int64_t max_cells = 500'000'000;  // 2 GB of float32 features
  int max_classes = 100'000;
};

// Loads the dataset "csv:PATH": RFC 4180 comma-separated numbers (parsed by libcsv), one
// example per row. When the first row is not all numbers it is a header, and the label
// column is the one named "label" (else the last column); without a header the label is
// the last column. Features (every other column) become [N, 1, 1, F] "images", as given
// (no scaling). Labels are integers in [0, C); C = the largest label + 1, at least 2.
// Split: every 10th row (rows 9, 19, ... counting data rows from 0) is the test split, the
// rest the training split, the same on every rank. `max_train`/`max_test` > 0 keep the
// first that many of each.
// Errors: NOT_FOUND when the file cannot be opened; DATA_LOSS naming the file, line and
// column for malformed CSV, a ragged row, a field that is not a finite number, or a label
// that is not a non-negative integer below max_classes; INVALID_ARGUMENT for a table with
// no feature column or fewer than 2 data rows, or one over the limits.
absl::StatusOr<std::pair<ImageDataset, ImageDataset>> LoadCsvDataset(
    const std::string& path, int64_t max_train, int64_t max_test,
    const CsvLimits& limits = CsvLimits{}, const FileOpener& open = OpenPlain);

}  // namespace joule::worker

#endif  // JOULE_WORKER_DATA_CSV_H_
