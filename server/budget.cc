#include "server/budget.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "common/job_spec.h"

namespace joule::server {

BudgetDecision DecideBudget(const BudgetInput& in) {
  BudgetDecision d;
  if (!(in.budget_joules > 0)) return d;
  d.used = in.joules_so_far / in.budget_joules;
  d.warn_now = d.used >= 0.9 && !in.warned;
  d.warning = in.warned || d.used >= 0.9;
  const double watts = std::isfinite(in.watts) && in.watts > 0 ? in.watts : 0;
  const double sps =
      std::isfinite(in.samples_per_second) && in.samples_per_second > 0 ? in.samples_per_second : 0;
  const double step_seconds = sps > 0 ? static_cast<double>(in.global_batch) / sps : 0;
  d.stop_seconds = kStopCheckInterval * step_seconds + kProgressPeriodSeconds;
  // The silent ranks spend like the mean of those heard, so far and while they stop.
  const int32_t silent =
      in.ranks_heard > 0 && in.world_size > in.ranks_heard ? in.world_size - in.ranks_heard : 0;
  const double heard_joules =
      std::isfinite(in.ranks_heard_joules) && in.ranks_heard_joules > 0 ? in.ranks_heard_joules : 0;
  const double per_rank = silent > 0 ? 1.0 / in.ranks_heard : 0;
  d.silent_ranks_joules = silent * per_rank * heard_joules;
  const double forecast_watts = watts * (1 + silent * per_rank);
  d.joules_to_come = d.silent_ranks_joules + forecast_watts * d.stop_seconds;
  if (in.joules_so_far + d.joules_to_come < in.budget_joules) return d;
  d.stop = true;
  d.warning = true;  // stopped by its budget: warned, whatever the share
  const std::string silent_note =
      silent > 0 ? absl::StrFormat(
                       " (%d of %d ranks not heard from yet: %.1f J forecast for "
                       "them so far, as the mean of the others)",
                       silent, in.world_size, d.silent_ranks_joules)
                 : "";
  d.reason = absl::StrFormat(
      "energy budget reached: %.1f J spent of %.0f J, and about %.1f J more while the ranks "
      "stop (%.1f W for %.1f s)%s; the ranks stop after a checkpoint (at once where they "
      "have not trained yet)",
      in.joules_so_far, in.budget_joules, d.joules_to_come - d.silent_ranks_joules, forecast_watts,
      d.stop_seconds, silent_note);
  return d;
}

}  // namespace joule::server
