#include "tests/testing/next_field_data.h"

#include <hdf5.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace joule::testing {

bool WriteNextFieldData(const std::filesystem::path& file) {
  constexpr int64_t kRows = 600, kValues = 2 * 8 * 8;
  std::mt19937 rng(11);
  std::normal_distribution<float> noise;
  std::vector<float> x(kRows * kValues), y(kRows * kValues);
  for (float& v : x) v = noise(rng);
  for (int64_t n = 0; n < kRows; ++n) {
    for (int c = 0; c < 2; ++c) {
      for (int h = 0; h < 8; ++h) {
        for (int w = 0; w < 8; ++w) {
          const auto at = [&](int cc, int ww) { return n * kValues + (cc * 8 + h) * 8 + ww; };
          y[at(c, w)] = 0.5f * x[at(c, w)] + (w > 0 ? 0.25f * x[at(1 - c, w - 1)] : 0.0f);
        }
      }
    }
  }
  hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return false;
  const hsize_t dims[4] = {kRows, 2, 8, 8};
  bool ok = true;
  for (auto [name, values] : {std::pair{"/field", &x}, std::pair{"/next", &y}}) {
    hid_t space = H5Screate_simple(4, dims, nullptr);
    hid_t set = H5Dcreate2(f, name, H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ok = ok && set >= 0 &&
         H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values->data()) >= 0;
    if (set >= 0) H5Dclose(set);
    H5Sclose(space);
  }
  return H5Fclose(f) >= 0 && ok;
}

bool WriteNextFieldModel(const std::filesystem::path& file) {
  const std::string cmd =
      "/usr/bin/python3 -c 'import torch; torch.manual_seed(0); "
      "torch.jit.script(torch.nn.Conv2d(2, 2, 3, padding=1)).save(\"" +
      file.string() + "\")' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

}  // namespace joule::testing
