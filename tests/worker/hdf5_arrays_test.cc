#include "worker/data/hdf5_arrays.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

struct ScopedHdf5Dir {
  fs::path path;
  ScopedHdf5Dir() : path(fs::temp_directory_path() / absl::StrCat("joule-hdf5-", getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScopedHdf5Dir() { fs::remove_all(path); }
};

// Writes `dims` values of `type` (H5T_NATIVE_FLOAT, _DOUBLE or _INT) named `name` into
// `file` (created if `create`), value i = f(i).
void WriteArray(const fs::path& file, bool create, const std::string& name,
                std::vector<hsize_t> dims, hid_t type, double (*f)(int64_t)) {
  hid_t fid = create ? H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)
                     : H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(fid, 0);
  int64_t n = 1;
  for (hsize_t d : dims) n *= static_cast<int64_t>(d);
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t set = H5Dcreate2(fid, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(set, 0);
  if (type == H5T_NATIVE_DOUBLE) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = f(i);
    H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  } else if (type == H5T_NATIVE_INT) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int>(f(i));
    H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  } else {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(f(i));
    H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  }
  H5Dclose(set);
  H5Sclose(space);
  H5Fclose(fid);
}

double Identity(int64_t i) { return static_cast<double>(i); }
double Negated(int64_t i) { return -static_cast<double>(i); }

TEST(Hdf5ArraysTest, ShardsAreDisjointCompleteAndReadInChunks) {
  // 3000 rows (past kHdf5ChunkRows), inputs [3000, 2, 3] float32, targets [3000] float64:
  // train rows 0..2699, test 2700..2999 (the last tenth); every world size's shards
  // together hold each row exactly once, in order, with its own values.
  ScopedHdf5Dir dir;
  const fs::path file = dir.path / "a.h5";
  WriteArray(file, true, "/x", {3000, 2, 3}, H5T_NATIVE_FLOAT, Identity);
  WriteArray(file, false, "/y", {3000}, H5T_NATIVE_DOUBLE, Negated);
  for (int world : {1, 2, 3, 4, 7}) {
    std::set<int64_t> train_rows, test_rows;
    for (int rank = 0; rank < world; ++rank) {
      absl::StatusOr<Hdf5Splits> s = ReadHdf5Shards(file.string(), "/x", "/y", 0, rank, world, OpenPlain);
      ASSERT_TRUE(s.ok()) << s.status();
      for (auto [d, rows, total] : {std::tuple{&s->train, &train_rows, 2700},
                                    std::tuple{&s->test, &test_rows, 300}}) {
        EXPECT_TRUE(d->sharded);
        EXPECT_EQ(d->total, total);
        EXPECT_EQ(d->min_shard, total / world);
        EXPECT_EQ(d->sample_shape, (std::vector<int64_t>{2, 3}));
        EXPECT_EQ(d->target_shape, (std::vector<int64_t>{1}));
        ASSERT_EQ(d->images.size(), static_cast<size_t>(d->size) * 6);
        ASSERT_EQ(d->targets.size(), static_cast<size_t>(d->size));
        for (int64_t i = 0; i < d->size; ++i) {
          const int64_t row = static_cast<int64_t>(d->images[i * 6]) / 6;
          EXPECT_EQ(d->images[i * 6 + 5], static_cast<float>(row * 6 + 5));
          EXPECT_EQ(d->targets[i], -static_cast<float>(row));
          EXPECT_TRUE(rows->insert(row).second) << "row " << row << " twice, world " << world;
        }
      }
    }
    EXPECT_EQ(train_rows.size(), 2700u) << world;
    EXPECT_EQ(*train_rows.rbegin(), 2699) << world;
    EXPECT_EQ(test_rows.size(), 300u) << world;
    EXPECT_EQ(*test_rows.begin(), 2700) << world;
  }
  // max_train_samples keeps the first rows; the hold-out is the last tenth of those.
  absl::StatusOr<Hdf5Splits> small = ReadHdf5Shards(file.string(), "/x", "/y", 100, 0, 1, OpenPlain);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->train.size, 90);
  EXPECT_EQ(small->test.size, 10);
  EXPECT_EQ(small->test.targets[0], -90.0f);
}

TEST(Hdf5ArraysTest, EveryBadFileIsDataLossNamingIt) {
  ScopedHdf5Dir dir;
  const fs::path good = dir.path / "good.h5";
  WriteArray(good, true, "/x", {10, 4}, H5T_NATIVE_FLOAT, Identity);
  WriteArray(good, false, "/y", {10, 4}, H5T_NATIVE_FLOAT, Identity);
  WriteArray(good, false, "/labels", {10}, H5T_NATIVE_INT, Identity);
  WriteArray(good, false, "/short", {9, 4}, H5T_NATIVE_FLOAT, Identity);
  WriteArray(good, false, "/one", {1}, H5T_NATIVE_FLOAT, Identity);
  WriteArray(good, false, "/one_y", {1}, H5T_NATIVE_FLOAT, Identity);
  WriteArray(good, false, "/empty_rows", {10, 0}, H5T_NATIVE_FLOAT, Identity);
  const fs::path text = dir.path / "text.h5";
  std::ofstream(text) << "not hdf5 at all\n";
  const fs::path truncated = dir.path / "truncated.h5";
  {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  }
  struct Case {
    fs::path file;
    const char* inputs;
    const char* targets;
    const char* message;
  };
  for (const Case& c : {
           Case{text, "/x", "/y", "not an HDF5 file"},
           Case{good, "/nope", "/y", "has no dataset \"/nope\""},
           Case{good, "/x", "/labels", "\"/labels\" is not of a float type"},
           Case{good, "/x", "/short", "\"/x\" has 10 rows, \"/short\" 9"},
           Case{good, "/one", "/one_y", "has 1 rows, fewer than 2"},
           Case{good, "/x", "/empty_rows", "has rows of dimension 0"},
           Case{truncated, "/x", "/y", ""},
       }) {
    absl::StatusOr<Hdf5Splits> s = ReadHdf5Shards(c.file.string(), c.inputs, c.targets, 0, 0, 1,
                                                  OpenPlain);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << c.message << ": " << s.status();
    EXPECT_TRUE(absl::StartsWith(s.status().message(), c.file.string())) << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), c.message)) << s.status();
  }
  // Files outside the worker's roots are never opened.
  absl::StatusOr<Hdf5Splits> outside =
      ReadHdf5Shards(good.string(), "/x", "/y", 0, 0, 1, MakeFileOpener({"/usr/share"}));
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kPermissionDenied) << outside.status();
  absl::StatusOr<Hdf5Splits> missing =
      ReadHdf5Shards((dir.path / "missing.h5").string(), "/x", "/y", 0, 0, 1, OpenPlain);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
}

TEST(Hdf5ArraysTest, LocalShardersDrawFromTheRanksOwnShardOnly) {
  // Shards of 10 and 11 examples, local batch 4: both take 10 / 4 = 2 steps an epoch, of
  // distinct indices of their own shard, a different draw each epoch.
  EpochSharder a = EpochSharder::Local(10, 10, 8, 0, 2, 5);
  EpochSharder b = EpochSharder::Local(11, 10, 8, 1, 2, 5);
  EXPECT_EQ(a.steps_per_epoch(), 2);
  EXPECT_EQ(b.steps_per_epoch(), 2);
  std::vector<int64_t> first;
  for (int epoch = 0; epoch < 2; ++epoch) {
    b.StartEpoch(epoch);
    std::set<int64_t> seen;
    std::vector<int64_t> all;
    for (int64_t s = 0; s < b.steps_per_epoch(); ++s) {
      for (int64_t i : b.Batch(s)) {
        EXPECT_GE(i, 0);
        EXPECT_LT(i, 11);
        EXPECT_TRUE(seen.insert(i).second);
        all.push_back(i);
      }
    }
    EXPECT_EQ(all.size(), 8u);
    if (epoch == 0) first = all;
    if (epoch == 1) {
      EXPECT_NE(all, first);
    }
  }
}

}  // namespace
}  // namespace joule::worker
