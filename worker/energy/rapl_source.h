#ifndef JOULE_WORKER_ENERGY_RAPL_SOURCE_H_
#define JOULE_WORKER_ENERGY_RAPL_SOURCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/energy/power_source.h"

namespace joule::worker {

// RAPL energy counters through the Linux powercap interface (Documentation/power/powercap):
// zones ROOT/intel-rapl:P (name "package-P") and their subzones ROOT/intel-rapl:P:S (name
// "dram"), each with energy_uj (a counter in microjoules that wraps at
// max_energy_range_uj) and, where the kernel has it, constraint_N_max_power_uw and
// constraint_N_power_limit_uw.
//
// Counting rules (see shared/reference/energy.md for the failures they avoid):
//  - package and dram zones are counted; core and uncore subzones are parts of the
//    package and are not added to it;
//  - a zone whose name repeats an earlier one (intel-rapl-mmio:P mirrors intel-rapl:P) is
//    counted once; so are die zones of one package (package-P-die-D) that read the same
//    non-zero counter twice in a row (multi-die AMD parts mirror the socket counter on
//    every die), together with their dram subzones;
//  - two zones of one kind (package with package, dram with dram) that read the same
//    advancing counter on kMirrorReads reads are one counter shown twice (AMD hosts show
//    one socket's counter under two package zones: codecarbon #1274, amd_energy #5): the
//    later zone is counted no more from then on (its channel reads 0 J) and a note says
//    so. While two zones still look alike, the later one's energy is held back; when they
//    part (or after kMirrorMaxReads reads without proof) it is reported in full, so zones
//    that merely coincide lose nothing. Readings a few ms of power apart (one read
//    straddled a counter update) neither prove nor disprove a mirror;
//  - psys (the whole platform) is counted only where no package zone exists, never
//    beside one;
//  - a counter lower than its previous reading wrapped once: delta = range - prev + cur.
//    If the time between two reads exceeds the shortest wrap period (range / max power),
//    it may have wrapped more than once unseen: Read says so (DATA_LOSS) and the delta
//    is a lower bound;
//  - a delta is at most what the zone can use in the interval:
//    kPowerHeadroom x max power x (elapsed + kReadSlackSeconds). A larger one (a counter
//    that reset, which read as a wrap is a whole range: 262 kJ on Intel; a jump) is not
//    energy: the interval is dropped for that zone, counting resumes from the new
//    reading, and Read says so (DATA_LOSS, a lower bound);
//  - a reading above max_energy_range_uj is no counter value: it is ignored and the
//    interval's energy is counted by the zone's next valid reading (Read says so). Open
//    refuses a zone that reads above its range (DATA_LOSS).
// Max power is the largest constraint_{0,1,2}_{max_power,power_limit}_uw that reads as a
// number in (0, kMaxCredibleLimitWatts]; kDefaultMaxZoneWatts where none does.
// Package and dram are shared devices (EnergyChannel::shared).
//
// Not thread-safe (the EnergyMeter calls it from one thread).
class RaplSource final : public PowerSource {
 public:
  // Power assumed where no constraint file gives one: above any CPU package sold today
  // (the largest server parts are rated 500 W: AMD EPYC 9005, Intel Xeon 6900P), so the
  // wrap and plausibility checks err towards accepting energy.
  static constexpr double kDefaultMaxZoneWatts = 1000.0;
  // A limit above this is garbage, not a limit: the RAPL power-limit field is 15 bits in
  // power units (1/8 W by default), so it holds at most 4095.875 W, which firmware writes
  // to mean "unlimited".
  static constexpr double kMaxCredibleLimitWatts = 10000.0;
  // A power limit is an average over a time window that power may exceed for a while
  // (Intel PL2 and PL4 above PL1), and only PL1 may be readable: generous on purpose,
  // since the failures caught are orders of magnitude off (a reset read as a wrap is a
  // whole range; an unsigned underflow is 1.8e13 J).
  static constexpr double kPowerHeadroom = 4.0;
  // Allowance for the time between our clock reading and the counter's (scheduling,
  // the counter's ~1 ms update period).
  static constexpr double kReadSlackSeconds = 0.1;
  // Advancing reads with identical counters that prove two zones are one counter.
  static constexpr int kMirrorReads = 3;
  // Reads after which zones that looked alike without proof are counted as distinct.
  static constexpr int kMirrorMaxReads = 10;
  // Readings of a mirrored pair may differ by what max power adds in this time (a read
  // that straddled a counter update).
  static constexpr double kMirrorSkewSeconds = 0.005;

  // Opens the zones under `root` (normally /sys/class/powercap). Errors: NOT_FOUND when
  // there is no RAPL zone; PERMISSION_DENIED or UNAVAILABLE, naming the file, when an
  // energy_uj or max_energy_range_uj file cannot be read (kernels since 5.10 make
  // energy_uj root-only); DATA_LOSS naming the file for a value that is not a number, a
  // range of 0, or a counter above its range. The caller falls back to another source.
  static absl::StatusOr<std::unique_ptr<RaplSource>> Open(const std::string& root,
                                                          Clock::TimePoint now);

  // One counter of another interface to the same RAPL hardware (the perf power PMU:
  // perf_rapl_source.h), counted by the rules above.
  struct Counter {
    std::string device;     // "cpu-package-0", "dram-0", "psys"
    std::string name;       // what the interface calls it ("energy-pkg")
    std::string what;       // where it is read, for messages ("power/energy-pkg/ on cpu 0")
    uint64_t range_uj = 0;  // it wraps from range_uj - 1 ... to 0 (> 0)
    double max_watts = kDefaultMaxZoneWatts;
    // The counter now, in uJ below range_uj; errors as ReadUintFile's.
    std::function<absl::StatusOr<uint64_t>()> read_uj;
  };
  // A source named `source` (the channels' source) over `counters`, read once now;
  // `may_mirror`: counters of one kind may be one counter shown twice (watched as above);
  // false where the interface gives distinct counters by construction (perf: one event
  // per package). Errors: the first read's; DATA_LOSS for a reading at or above its range.
  static absl::StatusOr<std::unique_ptr<RaplSource>> OpenCounters(const std::string& source,
                                                                  std::vector<Counter> counters,
                                                                  Clock::TimePoint now,
                                                                  bool may_mirror);

  const std::vector<EnergyChannel>& channels() const override { return channels_; }
  absl::Status Read(Clock::TimePoint now, std::vector<double>* joules) override;
  void AppendNotes(std::vector<std::string>* out) const override;

 private:
  struct Zone {
    std::string energy_path;  // what is read, for messages: the file, or Counter::what
    std::function<absl::StatusOr<uint64_t>()> read_uj;
    std::string kind;  // "package", "dram" or "psys": only zones of one kind can mirror
    uint64_t range_uj = 0;
    double max_watts = kDefaultMaxZoneWatts;
    uint64_t last_uj = 0;        // the last accepted reading, at most range_uj
    Clock::TimePoint last_time;  // when it was taken
    int mirror_of = -1;          // the zone this one mirrors: not read, not counted
    double withheld_joules = 0;  // held back while it may mirror an earlier zone
  };
  // Zones `first` < `second` whose counters have looked alike at every read so far.
  struct MirrorCandidate {
    size_t first = 0, second = 0;
    int reads = 0;
    int identical_reads = 0;  // reads where both counters were equal and had advanced
    uint64_t last_uj = 0;
  };
  explicit RaplSource(std::string source) : source_(std::move(source)) {}
  // Watches zones of one kind whose counters agree now: they may be one counter.
  void FindMirrorCandidates();
  // The energy zone i used since its last accepted reading, in J; appends a warning for
  // an impossible reading or delta.
  double Account(size_t i, uint64_t cur, Clock::TimePoint now, std::vector<std::string>* warnings);
  // Advances the mirror candidates on this read's counters, holding back, releasing or
  // discarding the later zones' `joules`.
  void UpdateMirrors(const std::vector<uint64_t>& current, std::vector<double>* joules);
  uint64_t MirrorToleranceUj(size_t a, size_t b) const;

  const std::string source_;  // "rapl" or "perf_rapl": the channels' source
  std::vector<EnergyChannel> channels_;
  std::vector<Zone> zones_;
  std::vector<MirrorCandidate> candidates_;
  std::vector<std::string> notes_;
};

// Reads a whole small sysfs file holding one unsigned integer. Errors: PERMISSION_DENIED
// or NOT_FOUND naming the path; DATA_LOSS for contents that are not a number.
absl::StatusOr<uint64_t> ReadUintFile(const std::string& path);

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_RAPL_SOURCE_H_
