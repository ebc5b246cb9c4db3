#ifndef JOULE_COMMON_SWEEP_SUMMARY_H_
#define JOULE_COMMON_SWEEP_SUMMARY_H_

// A sweep's results: its finished jobs grouped by cell into rows (means over repeats,
// energy per device-hour, speedup and efficiency along each scaling series). Pure;
// thread-safe.

#include <string>
#include <vector>

#include "common/fit.h"
#include "joule/v1/job.pb.h"

namespace joule {

// One row of the result table: the finished jobs of one cell.
struct SweepRow {
  std::string key;
  int workers = 0, jobs = 0, succeeded = 0;
  int threads = 0;                    // spec.intra_op_threads (0: the workers' default)
  std::string series;                 // the scaling series the row belongs to
  double wall_mean = 0, wall_sd = 0;  // s, over the succeeded repeats
  double accuracy_mean = 0;
  double energy_mean = 0, energy_sd = 0;  // J
  double device_hours_mean = 0;
  double joules_per_device_hour = 0;  // energy_mean / device_hours_mean
  double samples_per_device_hour = 0, updates_per_device_hour = 0;
  double samples_per_joule = 0;
  double average_watts = 0;  // mean over the succeeded of energy / wall time
  // Parallelism = workers x threads (intra_op_threads, 0 counted as 1), so that
  // 1 worker x T threads and N workers x 1 thread (the first paper's shared- and
  // distributed-memory modes) compare in one series. Against the cell with the least
  // parallelism (P0) and the same other values: speedup T0 / T; efficiency
  // speedup x P0 / P (strong scaling) or T0 / T (weak scaling, label sweep_preset=weak:
  // the work grows with N).
  double speedup = 0, efficiency = 0;
  bool weak = false;       // a weak-scaling cell: ideal speedup is 1, not P / P0
  bool estimated = false;  // some energy of the cell is `estimated`
  int global_batch = 0, local_batch = 0;
  // Zeus's time- and energy-to-accuracy for the cell's spec target: target_metric
  // reaching spec.target_accuracy (an accuracy) or spec.target_loss (a loss); both 0: none
  // set. Means over the succeeded repeats that reached it (JobResult.to_accuracy).
  std::string target_metric;
  double target_accuracy = 0, target_loss = 0;
  double target() const { return target_accuracy > 0 ? target_accuracy : target_loss; }
  int reached_target = 0;
  double tta_mean = 0, eta_mean = 0;  // s, J
};
// Groups jobs by their `cell` label (the jobs of one sweep), in the order of first
// appearance, and computes each row from the SUCCEEDED ones; a row's series is its jobs'
// `series` label, or (jobs of older sweeps) the key without workers and intra_op_threads.
std::vector<SweepRow> SummariseSweep(const std::vector<v1::Job>& jobs);

// A sweep's rows and fits, as `joule sweep`, its HTML report and the web UI give them:
// over the succeeded jobs, energy against device-hours (`fit`), and energy per device-hour
// against samples and updates per device-hour (`slope_model`); each absent where too few
// jobs (or no spread) make it undefined: then the status says why.
struct SweepAnalysis {
  std::vector<SweepRow> rows;
  absl::StatusOr<LineFit> fit = absl::UnknownError("not fitted");
  absl::StatusOr<LinearFit> slope_model = absl::UnknownError("not fitted");
  const LineFit* fit_or_null() const { return fit.ok() ? &*fit : nullptr; }
  const LinearFit* slope_model_or_null() const {
    return slope_model.ok() ? &*slope_model : nullptr;
  }
  bool estimated = false;  // some succeeded job's energy is estimated
};
SweepAnalysis AnalyseSweep(const std::vector<v1::Job>& jobs);

}  // namespace joule

#endif  // JOULE_COMMON_SWEEP_SUMMARY_H_
