#ifndef JOULE_TESTS_TESTING_FILE_KV_H_
#define JOULE_TESTS_TESTING_FILE_KV_H_

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "worker/comm/kv_client.h"

namespace joule::testing {

// A KvClient over files in one directory, for ranks that are forked processes (an
// in-memory store is not shared across fork). Set writes a temporary file and renames it,
// so readers never see half a value; Get polls every millisecond.
class FileKv final : public worker::KvClient {
 public:
  explicit FileKv(std::filesystem::path dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    const auto path = Path(key);
    const auto tmp = path.string() + ".tmp" + std::to_string(::getpid());
    std::ofstream(tmp, std::ios::binary) << value;
    std::filesystem::rename(tmp, path);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!std::filesystem::exists(Path(key))) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("key ", key, " not set"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ifstream in(Path(key), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override {
    for (const auto& k : keys) {
      absl::StatusOr<std::string> v = Get(k, timeout);
      if (!v.ok()) return v.status();
    }
    return absl::OkStatus();
  }

 private:
  std::filesystem::path Path(const std::string& key) const {
    return dir_ / absl::StrReplaceAll(key, {{"/", "_"}});
  }
  std::filesystem::path dir_;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FILE_KV_H_
