#ifndef JOULE_SERVER_CARBON_SOURCE_H_
#define JOULE_SERVER_CARBON_SOURCE_H_
// Where the coordinator reads the grid's carbon intensity (joule-coordinator
// --carbon-intensity FILE, issue 31), and what it does with it: plan a carbon-aware job's
// start (JobSpec.carbon_aware), say why it waits, and count a job's CO2 over its run.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/carbon_intensity.h"
#include "joule/v1/job.pb.h"

namespace joule::server {

// What the source holds now. `series` is null where it failed (`error` says why) or was
// never read.
struct CarbonSnapshot {
  std::shared_ptr<const IntensitySeries> series;
  std::string name;    // "FILE (FORMAT)"
  std::string digest;  // of the file's content (FNV-1a 64, hex): equal text, equal digest
  std::string error;   // why the last read failed; empty when it did not
};

// A forecast or measured intensity file, re-read when its size or modification time
// changes (Refresh). A file that cannot be read or parsed fails the source with the
// reason (logged once per change) until a good one replaces it: carbon-aware jobs then
// start as others do, their reason says so. Thread-safe.
class CarbonIntensitySource {
 public:
  explicit CarbonIntensitySource(std::string path);
  // Stats the file and re-reads it when it changed (outside any coordinator lock: a large
  // file takes a while). True when the snapshot changed.
  bool Refresh();
  CarbonSnapshot Get() const;
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  mutable std::mutex mu_;
  CarbonSnapshot snapshot_;            // mu_
  bool read_ = false;                  // mu_: a first Refresh ran
  int64_t size_ = -1, mtime_ns_ = -1;  // mu_: what the last read saw
};

// The plan of a carbon-aware job submitted or re-planned at `now_ms`: the greenest start
// before its deadline over the run it expects (spec.expected_run_seconds, else 1 hour),
// from `snapshot`; at once (with the reason in `note`) without a usable forecast.
// `spec` must be carbon_aware and valid.
v1::CarbonPlan PlanCarbonAwareStart(const v1::JobSpec& spec, int64_t now_ms,
                                    const CarbonSnapshot& snapshot);

// Whether `job` (PENDING, carbon-aware) is held at `now_ms` by its plan.
bool HeldByCarbonPlan(const v1::Job& job, int64_t now_ms);

// Why a held job waits: "waiting for 2026-12-06 02:00 UTC, forecast 118 g/kWh against
// 341 now; starts by 04:10 UTC at the latest (forecast: FILE (FORMAT))".
std::string CarbonWaitingReason(const v1::CarbonPlan& plan);

// The job's CO2 over its run from `series`: each rank's energy between two power samples
// of each ended attempt (AttemptSummary.power) at the intensity at that interval's middle.
// Energy at a time the points do not cover is not counted (joules_covered says what was);
// grams_at_submit is the covered energy at the intensity when the job was submitted (0
// where the series does not cover that time). Pure.
v1::CarbonAccount AccountCarbon(const v1::Job& job, const IntensitySeries& series,
                                const std::string& source);

}  // namespace joule::server

#endif  // JOULE_SERVER_CARBON_SOURCE_H_
