#include "client/tune_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "client/estimate.h"

namespace joule::client {

TuneFirstRungPlan PlanFirstTuneRung(const std::vector<TuneCellForecast>& cells,
                                    const TuneOptions& options, double search_budget_joules) {
  TuneFirstRungPlan plan;
  std::vector<const TuneCellForecast*> estimated, unknown;
  for (const TuneCellForecast& c : cells) {
    if (!c.known) {
      unknown.push_back(&c);
      continue;
    }
    if (options.max_wall_time_seconds > 0 &&
        ConfidentlyAbove(c.first_epoch_seconds, c.first_epoch_seconds_ci95,
                         options.max_wall_time_seconds)) {
      plan.skipped[c.key] = absl::StrFormat(
          "its first epoch alone is estimated at %.3g s (+-%.2g), over max_wall_time %.3g s",
          c.first_epoch_seconds, c.first_epoch_seconds_ci95, options.max_wall_time_seconds);
      continue;
    }
    if (search_budget_joules > 0 &&
        ConfidentlyAbove(c.first_rung_joules, c.first_rung_joules_ci95, search_budget_joules)) {
      plan.skipped[c.key] = absl::StrFormat(
          "its first rung (%d epochs) alone is estimated at %.4g J (+-%.2g), over the search "
          "budget of %.4g J",
          options.min_epochs, c.first_rung_joules, c.first_rung_joules_ci95, search_budget_joules);
      continue;
    }
    estimated.push_back(&c);
  }
  const bool by_time = options.objective == TuneObjective::kTimeToAccuracy;
  std::stable_sort(estimated.begin(), estimated.end(),
                   [by_time](const TuneCellForecast* a, const TuneCellForecast* b) {
                     return by_time ? a->first_rung_seconds < b->first_rung_seconds
                                    : a->first_rung_joules < b->first_rung_joules;
                   });
  for (const TuneCellForecast* c : estimated) plan.order.push_back(c->key);
  for (const TuneCellForecast* c : unknown) plan.order.push_back(c->key);
  return plan;
}

}  // namespace joule::client
