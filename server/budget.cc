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
  d.joules_to_come = watts * d.stop_seconds;
  if (in.joules_so_far + d.joules_to_come < in.budget_joules) return d;
  d.stop = true;
  d.warning = true;  // stopped by its budget: warned, whatever the share
  d.reason = absl::StrFormat(
      "energy budget reached: %.1f J spent of %.0f J, and about %.1f J more while the ranks "
      "stop (%.1f W for %.1f s); the ranks stop after a checkpoint",
      in.joules_so_far, in.budget_joules, d.joules_to_come, watts, d.stop_seconds);
  return d;
}

}  // namespace joule::server
