#ifndef JOULE_CLIENT_ESTIMATE_H_
#define JOULE_CLIENT_ESTIMATE_H_
// Predicting a job's wall time, device-hours and energy before it runs, from the finished
// jobs of the same family (model and hidden sizes, dataset, device kind). Pure functions:
// no RPC, no clock; thread-compatible.
//
// The model (fitted by least squares over the family's succeeded jobs):
//   wall s      T = loop + rest. loop, the ranks' training loop (JobResult.train_seconds),
//               = c_u x (gradient updates) + c_s x (samples per worker), through the origin
//               (every update costs a synchronisation and an optimizer step, every sample
//               its compute; 3 or more jobs), else a + b x samples per worker (2 jobs), else
//               the nearest job's loop scaled by samples per worker; rest (start-up,
//               evaluation, teardown: the wall time less the loop) the family's mean. For
//               history without the loop's time: a + b x (samples per worker) + c x
//               (updates) on the wall time, with 2 or 3 jobs a + b x (samples per worker);
//   device-hours = T x workers / 3600;
//   energy J    E = p x device-hours + q (Huber et al., arXiv 2508.07706: energy is close
//               to linear in device-hours), with 1 or 2 jobs their mean J per device-hour.
// Uncertainties are 95% prediction half-widths from the fits' residuals (Student t), 0
// when too few jobs to tell. A job's samples come from its spec: epochs x floor(D / global
// batch) x global batch, where D is the training set after max_train_samples and
// dataset_fraction; the full size of the dataset is the largest samples per epoch (times
// k for a 1/k subset) of a family job without max_train_samples (or the spec's
// max_train_samples when no job did). A ga job (its own family) is measured in its work:
// "samples per worker" is generations x fitness batch x population / workers (the
// individual-example scores of an island) and its "updates" are its generations.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace joule::client {

struct JobEstimate {
  std::string family;       // "mlp [512,256] on fashion-mnist, cpu"
  std::string method;       // how: "least-squares over N jobs", "scaled from job K", ...
  std::vector<int64_t> job_ids;  // the finished jobs it rests on
  // The spec's, all ranks, all epochs (a ga job: examples drawn per island, generations).
  int64_t samples = 0, updates = 0;
  double wall_seconds = 0, wall_ci95 = 0;
  double device_hours = 0;
  double joules = 0, joules_ci95 = 0;
  bool energy_estimated = false;  // some of the history's energy is `estimated`
  // Non-empty when the job lies outside what the history measured (its samples per worker
  // over 1.5x the largest, or under 1/1.5 of the smallest): how far.
  std::string extrapolation;
};

// `spec` must be normalized (NormalizeAndValidateSpec). `history`: any jobs; those of
// the spec's family that SUCCEEDED are used. Errors: FAILED_PRECONDITION naming the
// family when none of its jobs has finished (run a calibration), or when the dataset's
// size is unknown (no job of the family trained on all of it, or on a 1/k subset of all
// of it, and the spec sets no max_train_samples).
absl::StatusOr<JobEstimate> EstimateJob(const v1::JobSpec& spec,
                                        const std::vector<v1::Job>& history);

// Whether `e` is confidently above an energy budget of `budget_joules` (> 0): its 95%
// interval lies wholly above the budget, or the estimate is over twice the budget (what
// decides where the interval is unknown, 0: too few jobs, or reaches zero, ci95 >= joules:
// with two jobs, one degree of freedom, a t quantile of 12.7). A submit refuses such a job.
bool ConfidentlyAboveBudget(const JobEstimate& e, double budget_joules);
// The same rule for any estimated quantity: `estimate` with its 95% half-width `ci95`
// (0: unknown) against `limit` (> 0).
bool ConfidentlyAbove(double estimate, double ci95, double limit);

// The family a spec belongs to, as shown (also the key jobs are grouped by).
std::string JobFamily(const v1::JobSpec& spec);

// How good the estimator is on this history: each of the newest `holdout` succeeded jobs
// of `spec`'s family is predicted from the family's jobs older than it, and compared.
struct HoldoutRow {
  int64_t job_id = 0;
  int jobs_used = 0;
  double actual_seconds = 0, predicted_seconds = 0;
  double actual_joules = 0, predicted_joules = 0;
  std::string error;  // why no prediction was made (too little history), else empty
};
std::vector<HoldoutRow> EvaluateHoldout(const v1::JobSpec& spec,
                                        const std::vector<v1::Job>& history, int holdout);

// The short jobs a calibration runs when a family has no history, labelled
// calibration=true, one epoch each: 8 global batches, and a 1/16 subset of the spec's
// data (dataset_fraction x16, which also tells the dataset's size). Two sizes separate the
// fixed cost (start-up, evaluation) from the per-sample cost.
std::vector<v1::JobSpec> CalibrationSpecs(const v1::JobSpec& spec);

}  // namespace joule::client

#endif  // JOULE_CLIENT_ESTIMATE_H_
