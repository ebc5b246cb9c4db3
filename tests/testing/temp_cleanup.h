#ifndef JOULE_TESTS_TESTING_TEMP_CLEANUP_H_
#define JOULE_TESTS_TESTING_TEMP_CLEANUP_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace joule::testing {

// Removes, when the test program ends, every entry of the temporary directory named
// `prefix` + this process's pid + anything: the scratch directories a test file made.
// Register once per test file:
//   const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(
//       new joule::testing::TempCleanup("joule_store_"));
class TempCleanup final : public ::testing::Environment {
 public:
  explicit TempCleanup(std::string prefix)
      : prefix_(std::move(prefix) + std::to_string(getpid())) {}
  void TearDown() override {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(
             std::filesystem::temp_directory_path(), ec)) {
      if (e.path().filename().string().rfind(prefix_, 0) == 0) {
        std::filesystem::remove_all(e.path(), ec);
      }
    }
  }

 private:
  std::string prefix_;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_TEMP_CLEANUP_H_
