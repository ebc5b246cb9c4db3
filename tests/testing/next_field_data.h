#ifndef JOULE_TESTS_TESTING_NEXT_FIELD_DATA_H_
#define JOULE_TESTS_TESTING_NEXT_FIELD_DATA_H_

#include <filesystem>

namespace joule::testing {

// An ERA5-like regression in HDF5 (libhdf5's C API): 600 fields [2, 8, 8] of N(0, 1) noise
// in `/field` and each one's "next field" in `/next` = 0.5 x the same channel + 0.25 x the
// other channel one pixel to the west, which a 3x3 convolution represents exactly. The
// target's variance is 0.25 + 0.0625 x 7/8: a model that learned nothing scores about that.
// Returns false if the file could not be written.
bool WriteNextFieldData(const std::filesystem::path& file);

// A TorchScript Conv2d(2, 2, 3, padding=1) (seeded) saved to `file` by Debian's
// python3-torch; false when python3-torch is not installed (the caller skips).
bool WriteNextFieldModel(const std::filesystem::path& file);

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_NEXT_FIELD_DATA_H_
