#ifndef JOULE_CLIENT_SWEEP_FILE_H_
#define JOULE_CLIENT_SWEEP_FILE_H_

// Scaling sweeps: a base job and grids over its fields, expanded into the cells a study
// runs (workers x global batch x ..., with repeats), checked before anything is submitted.
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

// Runs a sweep file shrunk without editing it: each of `sets` ("FIELD=VALUE",
// SetSpecField) replaces a field of the base; each of `grids` ("FIELD=[V1, V2]") replaces
// the values of the grid's axis FIELD (as written there). Errors: INVALID_ARGUMENT naming
// the flag for a malformed one, a --set of a field the grid varies, a --grid of an axis
// the file does not have or whose value is not a non-empty list. With any override the
// sweep is another one: its name becomes NAME-XXXXXXXX (8 hex digits of a digest of the
// overrides in a canonical form: each field's last value, by field, and the overridden
// axes' values as parsed; NAME cut to keep 64 bytes), so that `sweep status NAME` never
// mixes a shrunk run's jobs with the file's, and the same overrides in any order or
// spacing name the same sweep.
absl::Status OverrideSweep(SweepDefinition& sweep, const std::vector<std::string>& sets,
                           const std::vector<std::string>& grids);

// Every cell x repeat, each spec parsed and checked as a job file would be and as the
// coordinator will (so a bad value names its cell before anything is submitted), with the
// preset's rules applied (labels sweep, cell, repeat and sweep_preset added). Two cells
// that are the same job (workers: [2, 2]) are refused. Errors: INVALID_ARGUMENT.
absl::StatusOr<std::vector<SweepCell>> ExpandSweep(const SweepDefinition& sweep);

// Why a cell (its spec normalized) can never run on the workers registered now
// (`registered`: the workers listed, with or without a session yet, by device kind):
// "needs 8 cpu workers and only 2 are registered"; empty when it can. As `joule submit`
// warns for one job.
std::string UnrunnableReason(const v1::JobSpec& spec,
                             const std::map<v1::DeviceKind, int>& registered);

}  // namespace joule::client

#endif  // JOULE_CLIENT_SWEEP_FILE_H_
