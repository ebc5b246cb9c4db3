#ifndef JOULE_WORKER_ENERGY_RAPL_SOURCE_H_
#define JOULE_WORKER_ENERGY_RAPL_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/energy/power_source.h"

namespace joule::worker {

// RAPL energy counters through the Linux powercap interface (Documentation/power/powercap):
// zones ROOT/intel-rapl:P (name "package-P") and their subzones ROOT/intel-rapl:P:S (name
// "dram"), each with energy_uj (a counter in microjoules that wraps at
// max_energy_range_uj) and, where the kernel has it, constraint_0_max_power_uw.
//
// Counting rules (see shared/reference/energy.md for the failures they avoid):
//  - package and dram zones are counted; core and uncore subzones are parts of the
//    package and are not added to it;
//  - a zone whose name repeats an earlier one (intel-rapl-mmio:P mirrors intel-rapl:P) is
//    counted once; so are die zones of one package (package-P-die-D) that read the same
//    non-zero counter twice in a row (multi-die AMD parts mirror the socket counter on
//    every die), together with their dram subzones;
//  - psys (the whole platform) is counted only where no package zone exists, never
//    beside one;
//  - a counter lower than its previous reading wrapped once: delta = range - prev + cur.
//    If the time between two reads exceeds the shortest wrap period (range / max power),
//    it may have wrapped more than once unseen: Read says so (DATA_LOSS) and the delta
//    is a lower bound.
// Package and dram are shared devices (EnergyChannel::shared).
class RaplSource final : public PowerSource {
 public:
  // Power assumed for the wrap check where no constraint_N_{max_power,power_limit}_uw
  // can be read (otherwise the largest of them is used).
  static constexpr double kDefaultMaxZoneWatts = 1000.0;

  // Opens the zones under `root` (normally /sys/class/powercap). Errors: NOT_FOUND when
  // there is no RAPL zone; PERMISSION_DENIED or UNAVAILABLE, naming the file, when an
  // energy_uj or max_energy_range_uj file cannot be read (kernels since 5.10 make
  // energy_uj root-only); the caller falls back to another source.
  static absl::StatusOr<std::unique_ptr<RaplSource>> Open(const std::string& root,
                                                          Clock::TimePoint now);

  const std::vector<EnergyChannel>& channels() const override { return channels_; }
  absl::Status Read(Clock::TimePoint now, std::vector<double>* joules) override;

 private:
  struct Zone {
    std::string energy_path;
    uint64_t range_uj = 0;
    double max_watts = kDefaultMaxZoneWatts;
    uint64_t last_uj = 0;
  };
  RaplSource() = default;
  std::vector<EnergyChannel> channels_;
  std::vector<Zone> zones_;
  Clock::TimePoint last_read_;
};

// Reads a whole small sysfs file holding one unsigned integer. Errors: PERMISSION_DENIED
// or NOT_FOUND naming the path; DATA_LOSS for contents that are not a number.
absl::StatusOr<uint64_t> ReadUintFile(const std::string& path);

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_RAPL_SOURCE_H_
