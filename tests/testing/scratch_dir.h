#ifndef JOULE_TESTS_TESTING_SCRATCH_DIR_H_
#define JOULE_TESTS_TESTING_SCRATCH_DIR_H_

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace joule::testing {

// A scratch directory for the running GoogleTest test:
// TMPDIR/joule_<prefix>_<pid>_<test suite>.<test name> (a parameterised name's '/' as '_'),
// made empty at construction, and removed at destruction unless the test has failed (then
// it is kept, with the logs of the processes it ran, and its path printed to stderr).
// Construct and destroy it inside a test (a fixture member is). Not thread-safe.
class ScratchDir {
 public:
  explicit ScratchDir(std::string_view prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// The whole contents of a file; empty when it cannot be read.
std::string Slurp(const std::filesystem::path& path);

// Calls `done` every `period` until it returns true or `timeout` has passed; returns its
// last answer (so a false means the deadline passed without the evidence).
bool PollUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout,
               std::chrono::milliseconds period = std::chrono::milliseconds(50));

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_SCRATCH_DIR_H_
