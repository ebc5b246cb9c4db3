#ifndef JOULE_CLIENT_CARBON_FLAGS_H_
#define JOULE_CLIENT_CARBON_FLAGS_H_
// The carbon-aware flags of joule submit, sweep run and tune run (issue 31):
// --carbon-aware --start-before TIME | --finish-by TIME [--expected-duration D], the same
// for a job and for every cell of a sweep or a search.

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "joule/v1/job.pb.h"

namespace joule::client {

struct CarbonFlags {
  bool carbon_aware = false;
  std::string start_before, finish_by, expected_duration;
};

// Adds the flags to `cmd`; `whom` names what they apply to ("the job", "every cell").
void AddCarbonFlags(CLI::App* cmd, CarbonFlags* f, const std::string& whom);

// A deadline: RFC 3339 (2026-12-06T04:00:00Z, an offset, or no seconds) or "+DURATION"
// from `now` (+6h, +1h30m, under a year); Unix ms. INVALID_ARGUMENT naming `flag`.
absl::StatusOr<int64_t> ParseDeadline(absl::string_view flag, absl::string_view text,
                                      absl::Time now = absl::Now());

// Sets `spec`'s carbon fields from the flags `cmd` was given (those not given leave the
// file's); +DURATION deadlines count from `now` (one instant for every cell of a sweep).
// INVALID_ARGUMENT naming the flag for a time or duration that does not parse.
absl::Status ApplyCarbonFlags(const CarbonFlags& f, const CLI::App& cmd, v1::JobSpec* spec,
                              absl::Time now = absl::Now());

// The run a carbon-aware `spec` without expected_run_seconds plans for: the estimate's
// upper bound from `history` (its 95% interval added, else half as long again), so that
// the deadline holds when the estimate is short. Nothing to do for other specs.
// INVALID_ARGUMENT where finish_by needs a length and there is no estimate (it names
// --expected-duration and joule estimate --calibrate). A spec that is not valid is left
// as it is (the coordinator refuses it, naming why).
absl::Status FillCarbonRun(const absl::StatusOr<std::vector<v1::Job>>& history, v1::JobSpec* spec);

// For a job of a sweep or search submitted after its shared deadline has passed (a later
// rung, a cell held back by the concurrency limit): clears the carbon-aware fields, so it
// is submitted as a job that starts when it can (the coordinator refuses a carbon-aware
// job whose deadline has passed). True when it did. `now_ms`: Unix ms.
bool DropPassedCarbonDeadline(int64_t now_ms, v1::JobSpec* spec);

}  // namespace joule::client

#endif  // JOULE_CLIENT_CARBON_FLAGS_H_
