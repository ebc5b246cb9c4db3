#include "worker/data/hdf5_arrays.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

// Closes an HDF5 identifier with its own closer.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

absl::Status Bad(const std::string& file, const std::string& why) {
  return absl::DataLossError(absl::StrCat(file, ": ", why));
}

// One dataset of the file: its row count and the shape of a row.
struct Array {
  std::vector<int64_t> row_shape;
  int64_t rows = 0;
  int64_t row_values = 1;
};

absl::StatusOr<Array> Describe(hid_t file_id, const std::string& file, const std::string& name) {
  if (H5Lexists(file_id, name.c_str(), H5P_DEFAULT) <= 0) {
    return Bad(file, absl::StrCat("has no dataset \"", name, "\""));
  }
  Handle set(H5Dopen2(file_id, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!set.ok()) return Bad(file, absl::StrCat("\"", name, "\" is not a dataset"));
  Handle type(H5Dget_type(set.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_FLOAT) {
    return Bad(file, absl::StrCat("dataset \"", name, "\" is not of a float type"));
  }
  Handle space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 1 || rank > 8) {
    return Bad(file, absl::StrCat("dataset \"", name, "\" has ", rank, " dimensions (want 1..8)"));
  }
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  Array a;
  // Every product bounded before it is formed: a hostile header cannot overflow it.
  if (dims[0] > static_cast<hsize_t>(kMaxHdf5Rows)) {
    return Bad(file, absl::StrCat("dataset \"", name, "\" has ", dims[0], " rows, more than ",
                                  kMaxHdf5Rows));
  }
  a.rows = static_cast<int64_t>(dims[0]);
  for (int d = 1; d < rank; ++d) {
    if (dims[d] == 0 || dims[d] > static_cast<hsize_t>(kMaxHdf5Values / a.row_values)) {
      return Bad(file, absl::StrCat("dataset \"", name, "\" has rows of dimension ", dims[d],
                                    " (want 1.. and at most ", kMaxHdf5Values,
                                    " values a row)"));
    }
    a.row_shape.push_back(static_cast<int64_t>(dims[d]));
    a.row_values *= static_cast<int64_t>(dims[d]);
  }
  return a;
}

// Rows [begin, end) of dataset `name` as float32, read kHdf5ChunkRows at a time.
absl::Status ReadRows(hid_t file_id, const std::string& file, const std::string& name,
                      const Array& a, int64_t begin, int64_t end, std::vector<float>& out) {
  if (end - begin > kMaxHdf5Values / a.row_values) {
    return Bad(file, absl::StrCat("a shard of \"", name, "\" holds ", end - begin, " rows of ",
                                  a.row_values, " values, more than ", kMaxHdf5Values));
  }
  out.resize(static_cast<size_t>((end - begin) * a.row_values));
  Handle set(H5Dopen2(file_id, name.c_str(), H5P_DEFAULT), H5Dclose);
  Handle space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  for (int64_t at = begin; at < end; at += kHdf5ChunkRows) {
    const int64_t n = std::min(kHdf5ChunkRows, end - at);
    std::vector<hsize_t> start(static_cast<size_t>(rank), 0), count = dims;
    start[0] = static_cast<hsize_t>(at);
    count[0] = static_cast<hsize_t>(n);
    if (H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                            nullptr) < 0) {
      return Bad(file, absl::StrCat("cannot select rows of \"", name, "\""));
    }
    Handle memory(H5Screate_simple(rank, count.data(), nullptr), H5Sclose);
    float* dst = out.data() + (at - begin) * a.row_values;
    if (H5Dread(set.get(), H5T_NATIVE_FLOAT, memory.get(), space.get(), H5P_DEFAULT, dst) < 0) {
      return Bad(file, absl::StrCat("reading rows ", at, "..", at + n, " of \"", name,
                                    "\" failed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Hdf5Splits> ReadHdf5Shards(const std::string& file, const std::string& inputs,
                                          const std::string& targets, int64_t max_rows,
                                          int rank, int world, const FileOpener& open) {
  // libhdf5 is thread-safe only when built so (Debian's is; a default build is not), and
  // H5Eset_auto2 below is process-wide: ranks run as threads of one process (tests,
  // benchmarks) take turns.
  static std::mutex hdf5_mu;
  std::lock_guard<std::mutex> lock(hdf5_mu);
  absl::StatusOr<int> fd = open(file);
  if (!fd.ok()) return fd.status();
  const ScopedFd closer(*fd);
  // HDF5 prints its error stack to stderr by default; the errors become statuses here.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string via = absl::StrCat("/proc/self/fd/", *fd);
  Handle f(H5Fopen(via.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.ok()) return Bad(file, "not an HDF5 file HDF5 can read");
  absl::StatusOr<Array> x = Describe(f.get(), file, inputs);
  if (!x.ok()) return x.status();
  absl::StatusOr<Array> y = Describe(f.get(), file, targets);
  if (!y.ok()) return y.status();
  if (x->rows != y->rows) {
    return Bad(file, absl::StrCat("\"", inputs, "\" has ", x->rows, " rows, \"", targets, "\" ",
                                  y->rows));
  }
  const int64_t rows = max_rows > 0 ? std::min(max_rows, x->rows) : x->rows;
  if (rows < 2) return Bad(file, absl::StrCat("has ", rows, " rows, fewer than 2"));
  const int64_t test_rows = std::max<int64_t>(1, rows / 10);
  const int64_t train_rows = rows - test_rows;
  Hdf5Splits out;
  for (auto [d, first, n] : {std::tuple{&out.train, int64_t{0}, train_rows},
                             std::tuple{&out.test, train_rows, test_rows}}) {
    const int64_t begin = first + n * rank / world, end = first + n * (rank + 1) / world;
    if (absl::Status s = ReadRows(f.get(), file, inputs, *x, begin, end, d->images); !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadRows(f.get(), file, targets, *y, begin, end, d->targets); !s.ok()) {
      return s;
    }
    d->size = end - begin;
    // A row of one value is a vector of one, so that outputs [batch, 1] meet [batch, 1].
    d->sample_shape = x->row_shape.empty() ? std::vector<int64_t>{1} : x->row_shape;
    d->target_shape = y->row_shape.empty() ? std::vector<int64_t>{1} : y->row_shape;
    d->sharded = true;
    d->total = n;
    d->min_shard = n / world;
    d->classes = 0;
  }
  return out;
}

}  // namespace joule::worker
