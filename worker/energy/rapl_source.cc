#include "worker/energy/rapl_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat(path, ": permission denied"));
    }
    return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  char buf[64];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  const int err = errno;
  close(fd);
  if (n < 0) {
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat(path, ": permission denied"));
    }
    return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  return std::string(absl::StripAsciiWhitespace(absl::string_view(buf, n)));
}

struct Candidate {
  fs::path dir;
  std::string name;
  int package = -1;  // package index, for dram subzones
  bool mmio = false;
};

}  // namespace

absl::StatusOr<uint64_t> ReadUintFile(const std::string& path) {
  absl::StatusOr<std::string> s = ReadSmallFile(path);
  if (!s.ok()) return s.status();
  uint64_t v;
  if (!absl::SimpleAtoi(*s, &v)) {
    return absl::DataLossError(absl::StrCat(path, ": \"", *s, "\" is not a number"));
  }
  return v;
}

namespace {

// "package-0" -> "0", "package-0-die-1" -> "0-die-1"; empty for other names.
std::string PackageSuffix(const std::string& name) {
  return absl::StartsWith(name, "package-") ? name.substr(8) : "";
}
// "0-die-1" -> "0".
std::string PackageOf(const std::string& suffix) { return suffix.substr(0, suffix.find('-')); }

// The highest power any constraint of the zone allows, in W; the default where none can
// be read. PL2 (constraint_1) exceeds PL1, and the wrap check must assume the fastest
// the counter can run.
double MaxZoneWatts(const fs::path& dir) {
  double watts = 0;
  for (int i = 0; i < 3; ++i) {
    for (const char* kind : {"max_power_uw", "power_limit_uw"}) {
      auto uw = ReadUintFile((dir / absl::StrCat("constraint_", i, "_", kind)).string());
      if (uw.ok()) watts = std::max(watts, *uw / 1e6);
    }
  }
  return watts > 0 ? watts : RaplSource::kDefaultMaxZoneWatts;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RaplSource>> RaplSource::Open(const std::string& root,
                                                             Clock::TimePoint now) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat(root, ": no powercap directory"));
  }
  // Top-level zones first, in name order (intel-rapl before intel-rapl-mmio), so the
  // MSR zone wins over its MMIO mirror.
  std::vector<Candidate> top;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::string base = entry.path().filename().string();
    bool msr = absl::StartsWith(base, "intel-rapl:");
    bool mmio = absl::StartsWith(base, "intel-rapl-mmio:");
    if (!msr && !mmio) continue;
    std::string rest = base.substr(base.find(':') + 1);
    if (rest.find(':') != std::string::npos) continue;  // a subzone listed at the top
    absl::StatusOr<std::string> name = ReadSmallFile((entry.path() / "name").string());
    if (!name.ok()) continue;
    top.push_back({entry.path(), *name, -1, mmio});
  }
  std::sort(top.begin(), top.end(), [](const Candidate& a, const Candidate& b) {
    if (a.mmio != b.mmio) return !a.mmio;
    return a.dir.filename() < b.dir.filename();
  });
  struct Chosen {
    fs::path dir;
    std::string device;   // cpu-package-0[-die-1], dram-0[-die-1], psys
    std::string name;     // the zone's name file
    std::string package;  // "0" for package-0 and its dies and drams; "" for psys
    std::string parent;   // for dram: the package zone's device
  };
  std::vector<Chosen> chosen;
  std::set<std::string> seen;
  bool any_package = false;
  for (const Candidate& c : top) {
    if (!PackageSuffix(c.name).empty()) any_package = true;
  }
  for (const Candidate& c : top) {
    if (!seen.insert(c.name).second) continue;  // an MMIO mirror of a zone already counted
    const std::string suffix = PackageSuffix(c.name);
    if (c.name == "psys") {
      if (!any_package) chosen.push_back({c.dir, "psys", c.name, "", ""});
      continue;
    }
    if (suffix.empty()) continue;
    const std::string device = "cpu-" + c.name;
    chosen.push_back({c.dir, device, c.name, PackageOf(suffix), ""});
    // Subzones: dram only (core and uncore are parts of the package).
    std::vector<fs::path> subs;
    for (const auto& sub : fs::directory_iterator(c.dir, ec)) {
      if (sub.is_directory() &&
          absl::StartsWith(sub.path().filename().string(), c.dir.filename().string() + ":")) {
        subs.push_back(sub.path());
      }
    }
    std::sort(subs.begin(), subs.end());
    for (const fs::path& sub : subs) {
      absl::StatusOr<std::string> name = ReadSmallFile((sub / "name").string());
      if (!name.ok() || *name != "dram") continue;
      const std::string dram = "dram-" + suffix;
      if (!seen.insert(dram).second) continue;
      chosen.push_back({sub, dram, "dram", PackageOf(suffix), device});
      break;
    }
  }
  if (chosen.empty()) {
    return absl::NotFoundError(absl::StrCat(root, ": no RAPL package, dram or psys zone"));
  }

  // Read every zone twice a moment apart. On multi-die AMD parts (Zen 1/2) every die's
  // zone reports the same socket counter (codecarbon #1274): dies of one package whose two
  // readings are identical and non-zero are one counter, counted once, with their DRAM.
  std::vector<uint64_t> first(chosen.size()), second(chosen.size());
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < chosen.size(); ++i) {
      absl::StatusOr<uint64_t> v = ReadUintFile((chosen[i].dir / "energy_uj").string());
      if (!v.ok()) return v.status();
      (pass == 0 ? first : second)[i] = *v;
    }
    bool dies = false;
    for (const Chosen& c : chosen) dies |= c.name.find("-die-") != std::string::npos;
    if (pass == 0 && !dies) {
      second = first;
      break;
    }
    if (pass == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  std::set<std::string> mirrors;
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (chosen[i].name.find("-die-") == std::string::npos || mirrors.contains(chosen[i].device)) {
      continue;
    }
    for (size_t j = i + 1; j < chosen.size(); ++j) {
      if (chosen[j].name.find("-die-") != std::string::npos &&
          chosen[j].package == chosen[i].package && first[j] == first[i] && first[i] != 0 &&
          second[j] == second[i]) {
        mirrors.insert(chosen[j].device);
      }
    }
  }

  std::unique_ptr<RaplSource> source(new RaplSource());
  for (size_t i = 0; i < chosen.size(); ++i) {
    const Chosen& c = chosen[i];
    if (mirrors.contains(c.device) || mirrors.contains(c.parent)) continue;
    Zone z;
    z.energy_path = (c.dir / "energy_uj").string();
    absl::StatusOr<uint64_t> range = ReadUintFile((c.dir / "max_energy_range_uj").string());
    if (!range.ok()) return range.status();
    if (*range == 0) {
      return absl::DataLossError(absl::StrCat((c.dir / "max_energy_range_uj").string(), " is 0"));
    }
    z.range_uj = *range;
    z.max_watts = MaxZoneWatts(c.dir);
    z.last_uj = second[i];
    EnergyChannel ch;
    ch.device = c.device;
    ch.source = "rapl";
    ch.shared = true;
    ch.name = c.name;
    source->channels_.push_back(ch);
    source->zones_.push_back(z);
  }
  source->last_read_ = now;
  return source;
}

absl::Status RaplSource::Read(Clock::TimePoint now, std::vector<double>* joules) {
  joules->clear();
  // Read every zone before updating any, so a failed read loses nothing.
  std::vector<uint64_t> current(zones_.size());
  for (size_t i = 0; i < zones_.size(); ++i) {
    absl::StatusOr<uint64_t> cur = ReadUintFile(zones_[i].energy_path);
    if (!cur.ok()) return cur.status();
    current[i] = *cur;
  }
  const double elapsed = Seconds(now - last_read_);
  absl::Status status;
  joules->assign(zones_.size(), 0.0);
  for (size_t i = 0; i < zones_.size(); ++i) {
    Zone& z = zones_[i];
    const uint64_t cur = current[i];
    const uint64_t delta_uj = cur >= z.last_uj ? cur - z.last_uj : z.range_uj - z.last_uj + cur;
    // The counter cannot gain `range` faster than max power allows; a longer gap may hide
    // whole wraps that no reading can recover.
    const double wrap_seconds = (z.range_uj / 1e6) / z.max_watts;
    if (elapsed >= wrap_seconds) {
      status = absl::DataLossError(absl::StrFormat(
          "rapl %s: %.3f s between reads is longer than the shortest wrap period %.3f s "
          "(range %d uJ at %.0f W): the counter may have wrapped more than once; this "
          "interval's energy is a lower bound",
          channels_[i].device, elapsed, wrap_seconds, z.range_uj, z.max_watts));
    }
    z.last_uj = cur;
    (*joules)[i] = delta_uj / 1e6;
  }
  last_read_ = now;
  return status;
}

}  // namespace joule::worker
