#include "worker/data/csv.h"

#include <csv.h>
#include <unistd.h>

#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace joule::worker {
namespace {

// Collects rows of fields from libcsv's callbacks. Rows are parsed into numbers as they
// complete, so memory holds one row of text at a time.
struct Collector {
  const std::string* path;
  const CsvLimits* limits;
  int64_t line = 0;                 // 1-based line of the row being read
  std::vector<std::string> fields;  // of the row being read
  bool header_checked = false;
  std::vector<std::string> header;
  int64_t columns = -1;
  int64_t label_column = -1;
  std::vector<float> features;  // row-major, columns - 1 per row
  std::vector<int64_t> labels;
  absl::Status error;

  void Fail(absl::Status s) {
    if (error.ok()) error = std::move(s);
  }

  void EndRow() {
    ++line;
    if (!error.ok()) return;
    std::vector<std::string> row = std::move(fields);
    fields.clear();
    if (row.size() == 1 && absl::StripAsciiWhitespace(row[0]).empty()) return;  // blank line
    if (!header_checked) {
      header_checked = true;
      bool numeric = true;
      for (const auto& f : row) {
        double v;
        numeric = numeric && absl::SimpleAtod(absl::StripAsciiWhitespace(f), &v);
      }
      columns = static_cast<int64_t>(row.size());
      if (columns > limits->max_columns) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(
            *path, ": ", columns, " columns, more than ", limits->max_columns)));
      }
      label_column = columns - 1;
      if (!numeric) {
        header = row;
        for (int64_t c = 0; c < columns; ++c) {
          if (absl::StripAsciiWhitespace(row[c]) == "label") label_column = c;
        }
        return;
      }
    }
    if (static_cast<int64_t>(row.size()) != columns) {
      return Fail(absl::DataLossError(absl::StrCat(*path, ":", line, ": ", row.size(),
                                                   " fields, the first row has ", columns)));
    }
    if (static_cast<int64_t>(labels.size()) >= limits->max_rows ||
        static_cast<int64_t>(features.size()) + columns > limits->max_cells) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          *path, ": more than ", limits->max_rows, " rows or ", limits->max_cells, " cells")));
    }
    for (int64_t c = 0; c < columns; ++c) {
      double v;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(row[c]), &v) || !std::isfinite(v)) {
        return Fail(absl::DataLossError(absl::StrCat(*path, ":", line, ": column ", c + 1,
                                                     " \"", SanitizeUtf8(row[c], 40),
                                                     "\" is not a finite number")));
      }
      if (c == label_column) {
        if (v < 0 || v != std::floor(v) || v >= limits->max_classes) {
          return Fail(absl::DataLossError(absl::StrCat(
              *path, ":", line, ": label ", SanitizeUtf8(row[c], 40),
              " is not an integer in [0, ", limits->max_classes, ")")));
        }
        labels.push_back(static_cast<int64_t>(v));
      } else {
        features.push_back(static_cast<float>(v));
      }
    }
  }
};

void OnField(void* data, size_t len, void* user) {
  auto* c = static_cast<Collector*>(user);
  if (c->fields.size() > static_cast<size_t>(c->limits->max_columns)) return;  // reported at row end
  c->fields.emplace_back(static_cast<const char*>(data), len);
}

void OnRow(int, void* user) { static_cast<Collector*>(user)->EndRow(); }

}  // namespace

absl::StatusOr<std::pair<ImageDataset, ImageDataset>> LoadCsvDataset(const std::string& path,
                                                                     int64_t max_train,
                                                                     int64_t max_test,
                                                                     const CsvLimits& limits,
                                                                     const FileOpener& open) {
  absl::StatusOr<int> fd = open(path);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<FILE, int (*)(FILE*)> file(fdopen(*fd, "rb"), &std::fclose);
  if (!file) {
    const int err = errno;
    close(*fd);
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(err)));
  }
  csv_parser parser;
  if (csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL) != 0) {
    return absl::ResourceExhaustedError("csv_init failed");
  }
  std::unique_ptr<csv_parser, void (*)(csv_parser*)> guard(&parser, &csv_free);
  Collector c;
  c.path = &path;
  c.limits = &limits;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), file.get())) > 0 && c.error.ok()) {
    if (csv_parse(&parser, buf, n, &OnField, &OnRow, &c) != n) {
      return absl::DataLossError(absl::StrCat(path, ": malformed CSV near line ", c.line + 1,
                                              ": ", csv_strerror(csv_error(&parser))));
    }
  }
  if (std::ferror(file.get())) {
    return absl::DataLossError(absl::StrCat("reading ", path, ": ", std::strerror(errno)));
  }
  if (c.error.ok() && csv_fini(&parser, &OnField, &OnRow, &c) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": malformed CSV at the end (line ", c.line + 1,
                                            "): ", csv_strerror(csv_error(&parser))));
  }
  if (!c.error.ok()) return c.error;
  if (c.columns < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": needs a label column and at least one feature column"));
  }
  const int64_t rows = static_cast<int64_t>(c.labels.size());
  if (rows < 2) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", rows, " data rows; need 2 or more"));
  }
  const int64_t f = c.columns - 1;
  int64_t classes = 2;
  for (int64_t l : c.labels) classes = std::max(classes, l + 1);
  std::pair<ImageDataset, ImageDataset> out;
  for (ImageDataset* d : {&out.first, &out.second}) {
    d->channels = 1;
    d->height = 1;
    d->width = static_cast<int>(f);
    d->classes = static_cast<int>(classes);
  }
  for (int64_t r = 0; r < rows; ++r) {
    ImageDataset& d = r % 10 == 9 ? out.second : out.first;
    const int64_t cap = &d == &out.first ? max_train : max_test;
    if (cap > 0 && d.size >= cap) continue;
    d.images.insert(d.images.end(), c.features.begin() + r * f, c.features.begin() + (r + 1) * f);
    d.labels.push_back(c.labels[r]);
    ++d.size;
  }
  return out;
}

}  // namespace joule::worker
