#include "tests/testing/scratch_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace joule::testing {

namespace fs = std::filesystem;

ScratchDir::ScratchDir(std::string_view prefix) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = test == nullptr ? std::string("global")
                                     : std::string(test->test_suite_name()) + "." + test->name();
  std::replace(name.begin(), name.end(), '/', '_');
  path_ = fs::temp_directory_path() /
          ("joule_" + std::string(prefix) + "_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(path_);
  fs::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  // JOULE_KEEP_SCRATCH=1 keeps a passing test's files too (its logs, to compare timings).
  const char* keep = std::getenv("JOULE_KEEP_SCRATCH");
  if (::testing::Test::HasFailure() || (keep != nullptr && std::string_view(keep) == "1")) {
    std::cerr << "kept for the " << (::testing::Test::HasFailure() ? "failed" : "passing")
              << " test: " << path_.string() << "\n";
    return;
  }
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string Slurp(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool PollUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout,
               std::chrono::milliseconds period) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(period);
  }
  return true;
}

}  // namespace joule::testing
