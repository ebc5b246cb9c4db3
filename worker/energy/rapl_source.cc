#include "worker/energy/rapl_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
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
#include "absl/strings/str_join.h"

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
// "cpu-package-0-die-1" -> "package", "dram-0" -> "dram", "psys" -> "psys".
std::string KindOf(const std::string& device) {
  if (absl::StartsWith(device, "cpu-package")) return "package";
  return device.substr(0, device.find('-'));
}
uint64_t AbsDiff(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

// The highest power any constraint of the zone allows, in W; the default where none can
// be read as a credible number. PL2 (constraint_1) exceeds PL1, and the wrap check must
// assume the fastest the counter can run.
double MaxZoneWatts(const fs::path& dir) {
  double watts = 0;
  for (int i = 0; i < 3; ++i) {
    for (const char* kind : {"max_power_uw", "power_limit_uw"}) {
      auto uw = ReadUintFile((dir / absl::StrCat("constraint_", i, "_", kind)).string());
      if (uw.ok() && *uw / 1e6 <= RaplSource::kMaxCredibleLimitWatts) {
        watts = std::max(watts, *uw / 1e6);
      }
    }
  }
  return watts > 0 ? watts : RaplSource::kDefaultMaxZoneWatts;
}

}  // namespace

namespace {

// A zone Open counts.
struct Chosen {
  fs::path dir;
  std::string device;   // cpu-package-0[-die-1], dram-0[-die-1], psys
  std::string name;     // the zone's name file
  std::string package;  // "0" for package-0 and its dies and drams; "" for psys
  std::string parent;   // for dram: the package zone's device
};

// The zones to count under `root`: package zones (MSR before their MMIO mirrors), each
// package's dram subzone, and psys only where there is no package zone.
absl::StatusOr<std::vector<Chosen>> ChooseZones(const std::string& root) {
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
  return chosen;
}

// The devices of die zones that are one counter reported twice (read twice a moment
// apart: identical, non-zero readings); `*second` gets the second reading of every zone.
absl::StatusOr<std::set<std::string>> DieMirrors(const std::vector<Chosen>& chosen,
                                                 std::vector<uint64_t>& second) {
  // Read every zone twice a moment apart. On multi-die AMD parts (Zen 1/2) every die's
  // zone reports the same socket counter (codecarbon #1274): dies of one package whose two
  // readings are identical and non-zero are one counter, counted once, with their DRAM.
  std::vector<uint64_t> first(chosen.size());
  second.assign(chosen.size(), 0);
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
  return mirrors;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RaplSource>> RaplSource::Open(const std::string& root,
                                                             Clock::TimePoint now) {
  absl::StatusOr<std::vector<Chosen>> zones_or = ChooseZones(root);
  if (!zones_or.ok()) return zones_or.status();
  const std::vector<Chosen>& chosen = *zones_or;
  std::vector<uint64_t> second(chosen.size());
  absl::StatusOr<std::set<std::string>> mirrors_or = DieMirrors(chosen, second);
  if (!mirrors_or.ok()) return mirrors_or.status();
  const std::set<std::string>& mirrors = *mirrors_or;

  std::unique_ptr<RaplSource> source(new RaplSource("rapl"));
  for (size_t i = 0; i < chosen.size(); ++i) {
    const Chosen& c = chosen[i];
    if (mirrors.contains(c.device)) {
      source->notes_.push_back(absl::StrCat("rapl: ", c.device, " showed the same counter as "
                                            "another die of package ", c.package,
                                            " on two reads: counted once"));
    }
    if (mirrors.contains(c.device) || mirrors.contains(c.parent)) continue;
    Zone z;
    z.energy_path = (c.dir / "energy_uj").string();
    z.read_uj = [path = z.energy_path] { return ReadUintFile(path); };
    const std::string range_path = (c.dir / "max_energy_range_uj").string();
    absl::StatusOr<uint64_t> range = ReadUintFile(range_path);
    if (!range.ok()) return range.status();
    if (*range == 0) return absl::DataLossError(absl::StrCat(range_path, " is 0"));
    if (second[i] > *range) {
      return absl::DataLossError(absl::StrCat(z.energy_path, " reads ", second[i],
                                              " uJ, above max_energy_range_uj ", *range));
    }
    z.kind = KindOf(c.device);
    z.range_uj = *range;
    z.max_watts = MaxZoneWatts(c.dir);
    z.last_uj = second[i];
    z.last_time = now;
    EnergyChannel ch;
    ch.device = c.device;
    ch.source = "rapl";
    ch.shared = true;
    ch.name = c.name;
    source->channels_.push_back(ch);
    source->zones_.push_back(z);
  }
  source->FindMirrorCandidates();
  return source;
}

absl::StatusOr<std::unique_ptr<RaplSource>> RaplSource::OpenCounters(const std::string& name,
                                                                     std::vector<Counter> counters,
                                                                     Clock::TimePoint now,
                                                                     bool may_mirror) {
  std::unique_ptr<RaplSource> source(new RaplSource(name));
  for (Counter& c : counters) {
    absl::StatusOr<uint64_t> first = c.read_uj();
    if (!first.ok()) return first.status();
    if (c.range_uj == 0 || *first >= c.range_uj) {
      return absl::DataLossError(
          absl::StrCat(c.what, " reads ", *first, " uJ, not below its range ", c.range_uj, " uJ"));
    }
    Zone z;
    z.energy_path = c.what;
    z.read_uj = std::move(c.read_uj);
    z.kind = KindOf(c.device);
    z.range_uj = c.range_uj;
    z.max_watts = c.max_watts;
    z.last_uj = *first;
    z.last_time = now;
    EnergyChannel ch;
    ch.device = c.device;
    ch.source = name;
    ch.shared = true;
    ch.name = c.name;
    source->channels_.push_back(ch);
    source->zones_.push_back(std::move(z));
  }
  if (source->zones_.empty()) return absl::NotFoundError(absl::StrCat(name, ": no counter"));
  if (may_mirror) source->FindMirrorCandidates();
  return source;
}

void RaplSource::FindMirrorCandidates() {
  for (size_t b = 0; b < zones_.size(); ++b) {
    for (size_t a = 0; a < b; ++a) {
      if (zones_[a].kind != zones_[b].kind || zones_[a].range_uj != zones_[b].range_uj) continue;
      const uint64_t d = AbsDiff(zones_[a].last_uj, zones_[b].last_uj);
      if (std::min(d, zones_[a].range_uj - d) > MirrorToleranceUj(a, b)) continue;
      MirrorCandidate m;
      m.first = a;
      m.second = b;
      m.last_uj = zones_[a].last_uj;
      candidates_.push_back(m);
    }
  }
}

uint64_t RaplSource::MirrorToleranceUj(size_t a, size_t b) const {
  return static_cast<uint64_t>(std::max(zones_[a].max_watts, zones_[b].max_watts) *
                               kMirrorSkewSeconds * 1e6);
}

void RaplSource::AppendNotes(std::vector<std::string>* out) const {
  out->insert(out->end(), notes_.begin(), notes_.end());
}

absl::Status RaplSource::Read(Clock::TimePoint now, std::vector<double>* joules) {
  joules->clear();
  // Read every zone before updating any, so a failed read loses nothing.
  std::vector<uint64_t> current(zones_.size());
  for (size_t i = 0; i < zones_.size(); ++i) {
    if (zones_[i].mirror_of >= 0) continue;
    absl::StatusOr<uint64_t> cur = zones_[i].read_uj();
    if (!cur.ok()) return cur.status();
    current[i] = *cur;
  }
  std::vector<std::string> warnings;
  std::vector<double> out(zones_.size(), 0.0);
  for (size_t i = 0; i < zones_.size(); ++i) {
    if (zones_[i].mirror_of < 0) out[i] = Account(i, current[i], now, &warnings);
  }
  UpdateMirrors(current, &out);
  *joules = std::move(out);
  if (warnings.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrJoin(warnings, "; "));
}

double RaplSource::Account(size_t i, uint64_t cur, Clock::TimePoint now,
                           std::vector<std::string>* warnings) {
  Zone& z = zones_[i];
  const std::string& device = channels_[i].device;
  const double elapsed = std::max(0.0, Seconds(now - z.last_time));
  if (cur > z.range_uj) {
    // Not a value the counter can hold: keep the last good reading, so the next valid
    // one counts this interval too.
    warnings->push_back(
        absl::StrFormat("%s %s: %s reads %d uJ, above %s %d; reading ignored, "
                        "its energy is counted at the next valid reading",
                        source_, device, source_ == "rapl" ? "energy_uj" : z.energy_path, cur,
                        source_ == "rapl" ? "max_energy_range_uj" : "its range in uJ", z.range_uj));
    return 0;
  }
  // last_uj <= range_uj and cur <= range_uj: neither difference underflows.
  const uint64_t delta_uj = cur >= z.last_uj ? cur - z.last_uj : z.range_uj - z.last_uj + cur;
  const double bound_j = kPowerHeadroom * z.max_watts * (elapsed + kReadSlackSeconds);
  const uint64_t last_uj = z.last_uj;
  z.last_uj = cur;
  z.last_time = now;
  if (delta_uj / 1e6 > bound_j) {
    const std::string what =
        cur < last_uj ? absl::StrFormat("counter fell from %d to %d uJ", last_uj, cur)
                      : absl::StrFormat("counter rose from %d to %d uJ", last_uj, cur);
    warnings->push_back(absl::StrFormat(
        "%s %s: %s in %.3f s: %.1f J is more than the zone can use (%.0f J at %g x %.0f W); "
        "a reset or a bad reading, not energy: interval dropped",
        source_, device, what, elapsed, delta_uj / 1e6, bound_j, kPowerHeadroom, z.max_watts));
    return 0;
  }
  // The counter cannot gain `range` faster than max power allows; a longer gap may hide
  // whole wraps that no reading can recover.
  const double wrap_seconds = (z.range_uj / 1e6) / z.max_watts;
  if (elapsed >= wrap_seconds) {
    warnings->push_back(absl::StrFormat(
        "%s %s: %.3f s between reads is longer than the shortest wrap period %.3f s "
        "(range %d uJ at %.0f W): the counter may have wrapped more than once; this "
        "interval's energy is a lower bound",
        source_, device, elapsed, wrap_seconds, z.range_uj, z.max_watts));
  }
  return delta_uj / 1e6;
}

void RaplSource::UpdateMirrors(const std::vector<uint64_t>& current, std::vector<double>* joules) {
  std::vector<MirrorCandidate> live;
  for (MirrorCandidate m : candidates_) {
    // A zone merged into another (earlier in this loop) no longer takes part.
    if (zones_[m.first].mirror_of >= 0 || zones_[m.second].mirror_of >= 0) continue;
    const uint64_t a = current[m.first], b = current[m.second];
    const uint64_t d = AbsDiff(a, b);
    if (std::min(d, zones_[m.first].range_uj - d) > MirrorToleranceUj(m.first, m.second)) {
      continue;  // two counters after all
    }
    ++m.reads;
    if (a == b && a != m.last_uj) ++m.identical_reads;
    m.last_uj = a;
    if (m.identical_reads >= kMirrorReads) {
      Zone& z = zones_[m.second];
      z.mirror_of = static_cast<int>(m.first);
      z.withheld_joules = 0;
      (*joules)[m.second] = 0;
      notes_.push_back(absl::StrFormat(
          "%s: %s showed the same counter as %s on %d reads: one counter seen twice, "
          "counted once",
          source_, channels_[m.second].device, channels_[m.first].device, m.identical_reads));
      continue;
    }
    if (m.reads >= kMirrorMaxReads) continue;  // never proved: two counters
    live.push_back(m);
  }
  candidates_ = std::move(live);
  // Hold back the energy of zones that may still mirror an earlier one; release it when
  // they no longer may.
  std::vector<bool> suspect(zones_.size(), false);
  for (const MirrorCandidate& m : candidates_) suspect[m.second] = true;
  for (size_t i = 0; i < zones_.size(); ++i) {
    Zone& z = zones_[i];
    if (z.mirror_of >= 0) continue;
    if (suspect[i]) {
      z.withheld_joules += (*joules)[i];
      (*joules)[i] = 0;
    } else {
      (*joules)[i] += z.withheld_joules;
      z.withheld_joules = 0;
    }
  }
}

}  // namespace joule::worker
