#ifndef JOULE_TESTS_TESTING_FAKE_POWERCAP_H_
#define JOULE_TESTS_TESTING_FAKE_POWERCAP_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace joule::testing {

// A powercap tree in a temp directory with the files the kernel's intel_rapl driver
// exposes (name, energy_uj, max_energy_range_uj, constraint_0_max_power_uw), so the RAPL
// code runs against the same layout as /sys/class/powercap.
class FakePowercap {
 public:
  explicit FakePowercap(const std::string& tag)
      : root_(std::filesystem::temp_directory_path() /
              ("joule_powercap_" + std::to_string(getpid()) + "_" + tag)) {
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  ~FakePowercap() { std::filesystem::remove_all(root_); }

  // Adds zone `dir` (e.g. "intel-rapl:0" or "intel-rapl:0/intel-rapl:0:0").
  void AddZone(const std::string& dir, const std::string& name, uint64_t energy_uj,
               uint64_t range_uj, uint64_t max_power_uw = 0) {
    std::filesystem::create_directories(root_ / dir);
    Write(dir + "/name", name);
    SetEnergy(dir, energy_uj);
    Write(dir + "/max_energy_range_uj", std::to_string(range_uj));
    if (max_power_uw > 0) Write(dir + "/constraint_0_max_power_uw", std::to_string(max_power_uw));
  }
  void SetEnergy(const std::string& dir, uint64_t energy_uj) {
    Write(dir + "/energy_uj", std::to_string(energy_uj));
  }
  // Writes any text into a zone file (e.g. "intel-rapl:0/energy_uj" = "-5"), for readings
  // the kernel should never give, or constraint files AddZone does not write.
  void SetFile(const std::string& file, const std::string& text) { Write(file, text); }
  // Makes a file unreadable, as the kernel does for non-root since 5.10: mode 0 for an
  // ordinary user; root reads through mode bits, so for root the file becomes a
  // directory, whose read() fails (EISDIR).
  void MakeUnreadable(const std::string& file) {
    if (geteuid() != 0) {
      std::filesystem::permissions(root_ / file, std::filesystem::perms::none);
      return;
    }
    std::filesystem::remove(root_ / file);
    std::filesystem::create_directories(root_ / file);
  }
  std::string root() const { return root_.string(); }

 private:
  // Whole, as the kernel's files are read: a reader never sees it empty or half written.
  void Write(const std::string& file, const std::string& value) {
    const std::filesystem::path tmp = root_ / (file + ".tmp");
    std::ofstream(tmp, std::ios::trunc) << value << "\n";
    std::filesystem::rename(tmp, root_ / file);
  }
  std::filesystem::path root_;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FAKE_POWERCAP_H_
