#ifndef JOULE_CLIENT_TUNE_PLAN_H_
#define JOULE_CLIENT_TUNE_PLAN_H_

// `joule tune`'s first rung, planned with the estimator (client/estimate.h): the cells in
// the order they are submitted, cheapest first, and those skipped because the estimator
// predicts, with confidence (ConfidentlyAbove: the 95% interval wholly above the limit, or
// the estimate over twice it), that they break a constraint:
//   max_wall_time   a cell's time to the target includes at least its first epoch (test
//                   accuracy is measured at epoch ends), so one whose first epoch alone,
//                   start-up included, is confidently over max_wall_time cannot meet it;
//   search_budget   a cell whose first rung (min_epochs) alone is confidently over the
//                   whole search's budget.
// max_slowdown is judged on measured times only: before the first rung nobody's time to the
// target is known, and an epoch's time says little of it (a larger global batch needs more
// epochs to the same accuracy). A cell without an estimate (a family without history) is
// never skipped; it runs after the estimated ones, in grid order. Pure; thread-safe.

#include <map>
#include <string>
#include <vector>

#include "common/tune_search.h"

namespace joule::client {

// What the estimator predicts for one cell (seconds wall, joules all ranks; ci95: the 95%
// prediction half-width, 0 when unknown).
struct TuneCellForecast {
  std::string key;
  bool known = false;  // false: no estimate (`unknown_why` says why)
  std::string unknown_why;
  double first_epoch_seconds = 0, first_epoch_seconds_ci95 = 0;  // a job of one epoch
  double first_rung_seconds = 0;                                 // of min_epochs
  double first_rung_joules = 0, first_rung_joules_ci95 = 0;
  double full_joules = 0;  // of max_epochs: the grid's cost where the cell never ran
};

struct TuneFirstRungPlan {
  std::vector<std::string> order;              // to run, in this order
  std::map<std::string, std::string> skipped;  // key -> why, in words
};

// `cells` in grid order; `search_budget_joules` 0: none.
TuneFirstRungPlan PlanFirstTuneRung(const std::vector<TuneCellForecast>& cells,
                                    const TuneOptions& options, double search_budget_joules);

}  // namespace joule::client

#endif  // JOULE_CLIENT_TUNE_PLAN_H_
