#ifndef JOULE_CLIENT_TUNE_FILE_H_
#define JOULE_CLIENT_TUNE_FILE_H_

// `joule tune`'s file: a sweep file (client/sweep_file.h: name, base, grid, preset,
// concurrency; one run per cell) and the search's objective and constraints. Pure;
// thread-compatible.
//
//   name: mlp-tune
//   base: {model: mlp, epochs: 16, optimizer: {lr: 0.05, momentum: 0.9}}
//   grid: {workers: [1, 2], global_batch_size: [64, 128, 256, 512], intra_op_threads: [1, 2]}
//   minimize: energy_to_accuracy   # or time_to_accuracy, energy (default: energy_to_accuracy)
//   target_accuracy: 0.85           # required, in (0, 1)
//   max_wall_time: 10m              # optional: seconds, or a number with s, m or h
//   max_slowdown: 1.5               # optional, >= 1: against the fastest time to the target
//   search_budget: 200kJ            # optional: joules the whole search may spend
//   min_epochs: 2                   # optional: the first rung (default 2)
//   eta: 2                          # optional: each rung keeps 1/eta (2..8, default 2)

#include <string>

#include "absl/status/statusor.h"
#include "client/sweep_file.h"
#include "common/tune_search.h"

namespace joule::client {

struct TuneDefinition {
  SweepDefinition sweep;            // repeats 1
  TuneOptions options;              // max_epochs: the base's epochs
  double search_budget_joules = 0;  // 0: none
};

// Errors (INVALID_ARGUMENT, one line naming the key): those of ParseSweepText, a missing
// or out-of-range target_accuracy, an unknown objective, a bad duration, energy, slowdown,
// min_epochs (1 .. the base's epochs) or eta, repeats other than 1, a base without epochs.
absl::StatusOr<TuneDefinition> ParseTuneText(const std::string& text, const std::string& source);
absl::StatusOr<TuneDefinition> LoadTuneFile(const std::string& path);

// "90", "90s", "30m", "2h" as seconds; INVALID_ARGUMENT otherwise (or not above 0).
absl::StatusOr<double> ParseDurationSeconds(const std::string& text);

}  // namespace joule::client

#endif  // JOULE_CLIENT_TUNE_FILE_H_
