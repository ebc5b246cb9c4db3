#ifndef JOULE_WORKER_TRAIN_TRAINER_H_
#define JOULE_WORKER_TRAIN_TRAINER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "worker/comm/process_group.h"
#include "worker/energy/phase_clock.h"

namespace joule::worker {

struct TrainerOptions {
  // Root under which named datasets ("fashion-mnist") are found.
  std::string data_root = "/usr/share/datasets";
  // Intra-op threads when the spec leaves intra_op_threads at 0.
  int default_threads = 1;
  // How often on_progress is called, at most.
  double progress_period_seconds = 1.0;
};

struct TrainHooks {
  // Builds the gang's process group (the rendezvous). Called once, after the data loaded.
  std::function<absl::StatusOr<std::unique_ptr<ProcessGroup>>()> connect;
  // Called on the training thread about every progress_period_seconds and after each
  // evaluation. May be empty.
  std::function<void(const v1::JobProgress&)> on_progress;
  // Polled before every step; true stops the attempt (result: cancelled).
  std::function<bool()> cancelled;
  // Stamped with the phase the training thread is in (data, forward, backward,
  // communication, optimizer, evaluation, idle). May be null.
  PhaseClock* phases = nullptr;
  // After every step: local samples, wall seconds of the step, its loss. May be empty.
  std::function<void(int64_t samples, double seconds, double loss)> on_step;
  // After every collective: its name ("allreduce", "broadcast"), bytes of this rank's
  // buffer, wall seconds. May be empty.
  std::function<void(const char* op, int64_t bytes, double seconds)> on_collective;
};

// Runs one rank's share of a job attempt, synchronous data-parallel SGD:
//   load the train/test splits; rendezvous; build the model from `spec.seed` and
//   broadcast rank 0's parameters; then every step: forward and backward on this rank's
//   local batch, allreduce (sum, then divide by world size) of all gradients in one flat
//   float32 buffer, optimizer step. After each epoch every rank evaluates its shard of the
//   test split and the sums are allreduced, so all ranks report the same accuracy.
//
// Never throws: every failure (data, rendezvous, a dead peer, LibTorch) ends up in the
// returned RankResult with ok=false and an error naming what failed.
v1::RankResult RunTraining(const v1::Assignment& assignment, const TrainerOptions& options,
                           const TrainHooks& hooks);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_TRAINER_H_
