#ifndef JOULE_SERVER_BUDGET_H_
#define JOULE_SERVER_BUDGET_H_

#include <cstdint>
#include <string>

namespace joule::server {

// How late a rank's energy reaches the coordinator: its progress period (the workers'
// default, TrainerOptions::progress_period_seconds).
inline constexpr double kProgressPeriodSeconds = 1.0;

// What a running job's energy budget asks for at one progress report. Pure; thread-safe.
struct BudgetInput {
  double budget_joules = 0;   // spec.energy_budget_joules; <= 0: no budget
  double joules_so_far = 0;   // every attempt and rank (energy_report.h JobJoulesSoFar + live)
  bool warned = false;        // 90% was reached at an earlier report
  double watts = 0;           // the job's power now: every rank's last sample, W
  double samples_per_second = 0;  // rank 0's training throughput
  int64_t global_batch = 0;
  // The running attempt's ranks: how many, and how many have reported their energy. Those
  // not heard from yet (in the attempt's first second, or a rank slow to report) are
  // forecast to spend like the mean of those heard, so that a budget is not passed while
  // they are silent. 0: not known (no forecast).
  int32_t world_size = 0;
  int32_t ranks_heard = 0;
  double ranks_heard_joules = 0;  // what the ranks heard from spent in this attempt, J
};

struct BudgetDecision {
  double used = 0;        // joules_so_far / budget
  bool warning = false;   // show the 90% warning (kept once reached, and on a stop)
  bool warn_now = false;  // 90% reached at this report: log it, once
  bool stop = false;      // stop gracefully now (after a checkpoint)
  // The forecast behind a stop: what the ranks spend while they stop, J, and over how
  // long, s (the ranks train on up to kStopCheckInterval steps to their next agreement and
  // hear of the stop up to kProgressPeriodSeconds late; kStopCheckInterval: common/job_spec.h).
  double joules_to_come = 0, stop_seconds = 0;
  // Of joules_to_come: what the ranks not heard from yet are forecast to have spent so far.
  double silent_ranks_joules = 0;
  std::string reason;  // the job's reason when it stops, with the figures
};

// The budget rule (issue 23 item 4): warn at 90% of the budget; stop when the spend plus
// the forecast cost of stopping reaches it, so that the overshoot is bounded by the
// forecast's error rather than by the stop's whole cost. Non-finite or negative power and
// throughput count as 0 (then only the spend itself and the progress period count).
BudgetDecision DecideBudget(const BudgetInput& in);

}  // namespace joule::server

#endif  // JOULE_SERVER_BUDGET_H_
