#ifndef JOULE_CLIENT_SWEEP_H_
#define JOULE_CLIENT_SWEEP_H_

// Scaling sweeps: a base job and grids over its fields, expanded into the cells a study
// runs (workers x global batch x ..., with repeats), and the table and fit of their results.
// The studies are those of Huber et al., arXiv 2508.07706 (strong scaling at constant local
// or global batch, weak scaling with the data growing with the workers; energy close to
// linear in device-hours). Pure functions: no RPC, no clock; thread-compatible.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace joule::client {

// The families of the paper, as presets that check (and for weak scaling, set) the cells.
enum class SweepPreset {
  kNone,
  // strong-local: the local batch is fixed (base.local_batch_size), the global batch grows
  // with the workers (GBS = LBS x N). The grid has `workers` and no batch axis.
  kStrongLocal,
  // strong-global: the global batch is fixed (base.global_batch_size), each worker's share
  // shrinks (LBS = GBS / N). The grid has `workers` and no batch axis.
  kStrongGlobal,
  // weak: the data grows with the workers: N workers train on N / N_max of the training
  // set (dataset_fraction = N_max / N, so N_max must be a multiple of every N), as the
  // paper's subset factors (1 GPU on 1/256 of ImageNet, 256 GPUs on all of it).
  kWeak,
};

// One axis of the grid: a JobSpec field (as in a job file: `workers`, `global_batch_size`,
// `hidden_sizes`, `optimizer.lr`, `sync.period`, ...) and the values it takes, each a YAML
// scalar or list as the job file would hold it. A zipped axis names several fields,
// comma-separated (`workers,ga.population`), and each of its values is a list with one
// value per field, taken together ([[1, 64], [2, 32]]: 1 worker with 64, 2 with 32).
struct SweepAxis {
  std::string field;                // as written in the grid
  std::vector<std::string> fields;  // {field}, or a zipped axis's fields
  std::vector<YAML::Node> values;   // as written (a quoted "1" stays a string)
  std::vector<std::string> texts;   // each value as flow YAML ("2", "[512, 256]"), for keys
};

struct SweepDefinition {
  std::string name;             // [A-Za-z0-9._-], at most 64 bytes: names its jobs
  YAML::Node base;              // the base job (a job file's mapping)
  std::vector<SweepAxis> axes;  // in the file's order; the first varies slowest
  int repeats = 1;              // 1..100
  SweepPreset preset = SweepPreset::kNone;
  // Jobs of the sweep pending or running at once (`concurrency: 1`: one after another, as
  // a timing comparison on one host needs); 0: all submitted at once, the coordinator
  // running as many as its workers allow.
  int concurrency = 0;
};

// One job of a sweep: the cell's axis values, the repeat, and the full spec.
struct SweepCell {
  int index = 0;                              // 0-based, in expansion order
  std::string key;                            // "workers=2,global_batch_size=128"
  // The key without the axes that hold workers or intra_op_threads (zipped partners
  // included): the cells of one scaling series share it ("global_batch_size=128").
  std::string series;
  std::map<std::string, std::string> values;  // field -> value (YAML text)
  int repeat = 0;                             // 0-based
  v1::JobSpec spec;                           // labels sweep, cell, repeat added
  std::string request_id;  // "sweep/NAME/DIGEST/rREPEAT", DIGEST of the spec: idempotent
};
// (The spec's labels: sweep, cell (the key), series, repeat, and sweep_preset=weak.)

// Parses a sweep file (YAML):
//   name: mlp-scaling
//   preset: strong-global            # optional: strong-local, strong-global, weak
//   repeats: 2                       # optional, default 1
//   concurrency: 1                   # optional: jobs at once (default: all)
//   base: {model: mlp, epochs: 1, global_batch_size: 256}
//   grid:
//     workers: [1, 2, 4]
//     global_batch_size: [128, 256, 512]
//     "intra_op_threads,optimizer.lr": [[1, 0.1], [2, 0.05]]   # a zipped axis
// Errors (INVALID_ARGUMENT, one line, naming the key, prefixed with `name`): not a mapping,
// an unknown key, a missing name/base/grid, an empty or non-list axis, a zipped value that
// is not a list of one value per field, a field in two axes, more than 1000 jobs
// (the coordinator's default --max-active-jobs-per-client), text over 1 MiB or past the
// job file's YAML limits (client/spec_file.h).
absl::StatusOr<SweepDefinition> ParseSweepText(const std::string& text, const std::string& name);
// Reads a sweep file with the job file's rules (a regular file of at most 1 MiB).
absl::StatusOr<SweepDefinition> LoadSweepFile(const std::string& path);

// Every cell x repeat, each spec parsed and checked as a job file would be and as the
// coordinator will (so a bad value names its cell before anything is submitted), with the
// preset's rules applied (labels sweep, cell, repeat and sweep_preset added). Two cells
// that are the same job (workers: [2, 2]) are refused. Errors: INVALID_ARGUMENT.
absl::StatusOr<std::vector<SweepCell>> ExpandSweep(const SweepDefinition& sweep);

// A least-squares line y = slope x + intercept with 95% confidence intervals (Student t
// with n - 2 degrees of freedom; t quantiles from the standard table, e.g. NIST/SEMATECH
// e-Handbook 1.3.6.7.2, interpolated in 1/df). r2 is the coefficient of determination.
struct LineFit {
  int n = 0;
  double slope = 0, intercept = 0, r2 = 0;
  double slope_ci95 = 0, intercept_ci95 = 0;  // half-widths; 0 when n < 3
};
// Errors: FAILED_PRECONDITION with fewer than 2 points or all x equal.
absl::StatusOr<LineFit> FitLine(const std::vector<double>& x, const std::vector<double>& y);
// The energy fit as one line of text, as the CLI and the HTML report print it: "S +- D J per
// device-hour, intercept I +- E J, R^2 R (n=N, 95% intervals)"; with too few points for an
// interval (n < 3: a line through two points fits them exactly, R^2 says nothing) it says
// so in words instead of printing +- 0 and R^2 1.
std::string LineFitText(const LineFit& fit);
// Ordinary least squares y = b[0] + b[1] x1 + ... + b[k] xk for k = columns.size() (1..4)
// regressors, each column as long as y, with 95% confidence half-widths (Student t with
// n - k - 1 degrees of freedom; 0 when n <= k + 1) and R^2. Solved from the normal
// equations, equilibrated to a unit diagonal (Gauss-Jordan with partial pivoting; k is
// tiny). Errors: FAILED_PRECONDITION with n < k + 1 points, an all-zero regressor or
// collinear regressors (a pivot below 1e-12 of the equilibrated matrix).
struct LinearFit {
  int n = 0;
  std::vector<double> coefficients;  // intercept first
  std::vector<double> ci95;
  double r2 = 0;
};
absl::StatusOr<LinearFit> FitLinear(const std::vector<std::vector<double>>& columns,
                                    const std::vector<double>& y);
// The fit's terms as text, `names[i]` naming regressor i ("x samples/device-hour"), with
// their 95% half-widths and R^2, or, with no degree of freedom left (n <= k + 1), what the
// line could not say ("n=3 for 3 coefficients: an exact fit, no interval or R^2").
std::string LinearFitText(const LinearFit& fit, const std::vector<std::string>& names);
// The two-sided 95% quantile of Student's t with `df` >= 1 degrees of freedom.
double StudentT975(int df);

// Why a cell (its spec normalized) can never run on the workers registered now
// (`registered`: the workers listed, with or without a session yet, by device kind):
// "needs 8 cpu workers and only 2 are registered"; empty when it can. As `joule submit`
// warns for one job.
std::string UnrunnableReason(const v1::JobSpec& spec,
                             const std::map<v1::DeviceKind, int>& registered);

// One row of the result table: the finished jobs of one cell.
struct SweepRow {
  std::string key;
  int workers = 0, jobs = 0, succeeded = 0;
  int threads = 0;                                // spec.intra_op_threads (0: the workers' default)
  std::string series;                             // the scaling series the row belongs to
  double wall_mean = 0, wall_sd = 0;              // s, over the succeeded repeats
  double accuracy_mean = 0;
  double energy_mean = 0, energy_sd = 0;          // J
  double device_hours_mean = 0;
  double joules_per_device_hour = 0;              // energy_mean / device_hours_mean
  double samples_per_device_hour = 0, updates_per_device_hour = 0;
  double samples_per_joule = 0;
  double average_watts = 0;                       // mean over the succeeded of energy / wall time
  // Parallelism = workers x threads (intra_op_threads, 0 counted as 1), so that
  // 1 worker x T threads and N workers x 1 thread (the first paper's shared- and
  // distributed-memory modes) compare in one series. Against the cell with the least
  // parallelism (P0) and the same other values: speedup T0 / T; efficiency
  // speedup x P0 / P (strong scaling) or T0 / T (weak scaling, label sweep_preset=weak:
  // the work grows with N).
  double speedup = 0, efficiency = 0;
  bool estimated = false;              // some energy of the cell is `estimated`
  int global_batch = 0, local_batch = 0;
  // Zeus's time- and energy-to-accuracy for the cell's spec.target_accuracy (0: none
  // set): means over the succeeded repeats that reached it (JobResult.to_accuracy).
  double target_accuracy = 0;
  int reached_target = 0;
  double tta_mean = 0, eta_mean = 0;   // s, J
};
// Groups jobs by their `cell` label (the jobs of one sweep), in the order of first
// appearance, and computes each row from the SUCCEEDED ones; a row's series is its jobs'
// `series` label, or (jobs of older sweeps) the key without workers and intra_op_threads.
std::vector<SweepRow> SummariseSweep(const std::vector<v1::Job>& jobs);

// Renders rows as an aligned text table, CSV (a header, then one line a row) or JSON (an
// array of objects; numbers as numbers).
std::string SweepTable(const std::vector<SweepRow>& rows);
std::string SweepCsv(const std::vector<SweepRow>& rows);
// `slope_model`: the regression of energy per device-hour on samples and updates per
// device-hour (may be null, as `fit`).
std::string SweepJson(const std::vector<SweepRow>& rows, const LineFit* fit,
                      const LinearFit* slope_model = nullptr);

}  // namespace joule::client

#endif  // JOULE_CLIENT_SWEEP_H_
