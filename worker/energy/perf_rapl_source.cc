#include "worker/energy/perf_rapl_source.h"

#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace joule::worker {
namespace {

namespace fs = std::filesystem;

// `text` quoted for a one-line message: escaped, at most 64 bytes of it.
std::string Quote(absl::string_view text) {
  std::string q = absl::CEscape(text.substr(0, 64));
  return absl::StrCat("\"", q, text.size() > 64 ? "...\"" : "\"");
}

// A small sysfs file's text, whitespace trimmed. Errors: NOT_FOUND naming it.
absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot be read"));
  std::string s(4097, '\0');  // sysfs files are a page at most: never read more
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(in.gcount()));
  if (s.size() > 4096) return absl::DataLossError(absl::StrCat(path.string(), ": too long"));
  return std::string(absl::StripAsciiWhitespace(s));
}

// "0", "0,28", "0-3,8": the CPUs, ascending; empty on a malformed list.
std::vector<int> ParseCpuList(absl::string_view text) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> range = absl::StrSplit(part, '-');
    int lo = 0, hi = 0;
    if (range.size() == 1 && absl::SimpleAtoi(range[0], &lo)) {
      hi = lo;
    } else if (range.size() != 2 || !absl::SimpleAtoi(range[0], &lo) ||
               !absl::SimpleAtoi(range[1], &hi)) {
      return {};
    }
    if (lo < 0 || hi < lo || hi > (1 << 20)) return {};  // no machine has a million CPUs
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

class SystemReader final : public PerfCounterReader {
 public:
  ~SystemReader() override {
    for (int fd : fds_) close(fd);
  }
  absl::StatusOr<int> Open(uint32_t type, uint64_t config, int cpu) override {
    perf_event_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.size = sizeof(attr);
    attr.type = type;
    attr.config = config;
    // pid -1 with a CPU: every process on that CPU's package (the PMU is system-wide).
    const long fd =
        syscall(SYS_perf_event_open, &attr, /*pid=*/-1, cpu, /*group_fd=*/-1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EACCES || err == EPERM) {
        std::string paranoid = "?";
        if (std::ifstream in("/proc/sys/kernel/perf_event_paranoid"); in) in >> paranoid;
        return absl::PermissionDeniedError(
            absl::StrCat("perf_event_open on cpu ", cpu,
                         ": permission denied (a system-wide counter needs "
                         "kernel.perf_event_paranoid <= 0, now ",
                         paranoid, ", or CAP_PERFMON)"));
      }
      return absl::UnavailableError(
          absl::StrCat("perf_event_open on cpu ", cpu, ": ", std::strerror(err)));
    }
    fds_.push_back(static_cast<int>(fd));
    return static_cast<int>(fd);
  }
  absl::StatusOr<uint64_t> Read(int handle) override {
    uint64_t count = 0;
    const ssize_t n = read(handle, &count, sizeof(count));
    if (n != static_cast<ssize_t>(sizeof(count))) {
      return absl::UnavailableError(
          absl::StrCat("perf counter read: ", n < 0 ? std::strerror(errno) : "short read"));
    }
    return count;
  }

 private:
  std::vector<int> fds_;
};

}  // namespace

absl::StatusOr<PerfPowerPmu> ReadPerfPowerPmu(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no perf power PMU"));
  }
  PerfPowerPmu pmu;
  absl::StatusOr<std::string> type = ReadText(root / "type");
  if (!type.ok()) return type.status();
  if (!absl::SimpleAtoi(*type, &pmu.type)) {
    return absl::DataLossError(absl::StrCat(dir, "/type: ", Quote(*type), " is not a number"));
  }
  absl::StatusOr<std::string> mask = ReadText(root / "cpumask");
  if (!mask.ok()) return mask.status();
  pmu.cpus = ParseCpuList(*mask);
  if (pmu.cpus.empty()) {
    return absl::DataLossError(absl::StrCat(dir, "/cpumask: ", Quote(*mask), " names no CPU"));
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(root / "events", ec)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    const std::string name = f.filename().string();
    if (!absl::StartsWith(name, "energy-") || name.find('.') != std::string::npos) continue;
    absl::StatusOr<std::string> event = ReadText(f);
    if (!event.ok()) return event.status();
    PerfPowerEvent e;
    e.name = name;
    // "event=0x02" (the power PMU's only format field: config:0-7).
    absl::string_view v = *event;
    if (!absl::ConsumePrefix(&v, "event=") || !absl::ConsumePrefix(&v, "0x") ||
        !absl::SimpleHexAtoi(v, &e.config)) {
      return absl::DataLossError(
          absl::StrCat(f.string(), ": ", Quote(*event), " is not event=0x<hex>"));
    }
    absl::StatusOr<std::string> scale = ReadText(f.string() + ".scale");
    if (!scale.ok()) return scale.status();
    if (!absl::SimpleAtod(*scale, &e.scale) || !(e.scale > 0) || !std::isfinite(e.scale)) {
      return absl::DataLossError(
          absl::StrCat(f.string(), ".scale: ", Quote(*scale), " is not a positive number"));
    }
    absl::StatusOr<std::string> unit = ReadText(f.string() + ".unit");
    if (unit.ok() && *unit != "Joules") {
      return absl::DataLossError(absl::StrCat(f.string(), ".unit: ", Quote(*unit), ", not Joules"));
    }
    pmu.events.push_back(e);
  }
  return pmu;
}

std::unique_ptr<PerfCounterReader> SystemPerfCounterReader() {
  return std::make_unique<SystemReader>();
}

absl::StatusOr<std::unique_ptr<RaplSource>> OpenPerfRaplSource(
    const std::string& dir, std::shared_ptr<PerfCounterReader> reader, Clock::TimePoint now) {
  absl::StatusOr<PerfPowerPmu> pmu = ReadPerfPowerPmu(dir);
  if (!pmu.ok()) return pmu.status();
  std::map<std::string, PerfPowerEvent> events;
  for (const PerfPowerEvent& e : pmu->events) events[e.name] = e;
  // What is opened: (event, device, cpu).
  struct Wanted {
    const PerfPowerEvent* event;
    std::string device;
    int cpu;
  };
  std::vector<Wanted> wanted;
  const auto pkg = events.find("energy-pkg");
  const auto ram = events.find("energy-ram");
  for (size_t p = 0; p < pmu->cpus.size(); ++p) {
    if (pkg != events.end())
      wanted.push_back({&pkg->second, absl::StrCat("cpu-package-", p), pmu->cpus[p]});
    if (ram != events.end())
      wanted.push_back({&ram->second, absl::StrCat("dram-", p), pmu->cpus[p]});
  }
  // psys is the whole platform, one counter whichever CPU opens it; never beside pkg.
  if (const auto psys = events.find("energy-psys"); psys != events.end() && pkg == events.end()) {
    wanted.push_back({&psys->second, "psys", pmu->cpus.front()});
  }
  if (wanted.empty()) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no energy-pkg, energy-ram or energy-psys event"));
  }
  std::vector<RaplSource::Counter> counters;
  for (const Wanted& w : wanted) {
    absl::StatusOr<int> handle = reader->Open(pmu->type, w.event->config, w.cpu);
    if (!handle.ok()) {
      return absl::Status(handle.status().code(),
                          absl::StrCat("power/", w.event->name, "/: ", handle.status().message()));
    }
    RaplSource::Counter c;
    c.device = w.device;
    c.name = w.event->name;
    c.what = absl::StrCat("power/", w.event->name, "/ on cpu ", w.cpu);
    // 2^64 counts in uJ must stay below 2^53 (9.0e15, exact in a double): scales up to
    // about 4.9e-10 J per count (2^-32 = 2.3e-10 J is what Intel and AMD give).
    const double uj_per_count = w.event->scale * 1e6;
    const double range = std::ldexp(uj_per_count, 64);
    if (!(range >= 1) || range > 9.0e15) {
      return absl::DataLossError(absl::StrCat(dir, "/events/", w.event->name,
                                              ".scale: ", w.event->scale,
                                              " J per count is outside what is counted here"));
    }
    c.range_uj = static_cast<uint64_t>(range);
    c.read_uj = [reader, h = *handle, uj_per_count, what = c.what,
                 range = c.range_uj]() -> absl::StatusOr<uint64_t> {
      absl::StatusOr<uint64_t> count = reader->Read(h);
      if (!count.ok()) {
        return absl::Status(count.status().code(),
                            absl::StrCat(what, ": ", count.status().message()));
      }
      const double uj = std::floor(static_cast<double>(*count) * uj_per_count);
      return std::min(static_cast<uint64_t>(uj), range - 1);
    };
    counters.push_back(std::move(c));
  }
  // Each package's event is opened on its own CPU of the cpumask: distinct counters (perf
  // counts all start at 0, so they would look alike at first), never mirrors.
  return RaplSource::OpenCounters("perf_rapl", std::move(counters), now, /*may_mirror=*/false);
}

}  // namespace joule::worker
