#ifndef JOULE_WORKER_TRAIN_ATTEMPT_CONTEXT_H_
#define JOULE_WORKER_TRAIN_ATTEMPT_CONTEXT_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "worker/comm/process_group.h"
#include "worker/data/dataset.h"
#include "worker/train/train_options.h"

namespace joule::worker {

// One rank's attempt once its data is loaded and its gang's process group is up: what every
// training algorithm runs from (sgd_loop.h, ga.h). Built by Train (trainer.cc), which owns
// what it refers to and outlives the algorithm. Not thread-safe: the training thread's.
struct AttemptContext {
  const v1::Assignment& assignment;
  const TrainerOptions& options;
  const TrainHooks& hooks;
  ProcessGroup& pg;
  // Where the job's checkpoints are (CheckpointDirectory, checkpoint.h); "" for none.
  const std::string checkpoint_dir;
  // options.clock; the attempt started at wall_start (its steady time).
  const joule::Clock& clock;
  const joule::Clock::TimePoint wall_start;
  // The rank's result, filled by the algorithm (Train stamps wall_seconds last).
  v1::RankResult& result;

  const v1::JobSpec& spec() const { return assignment.spec(); }
  // Seconds since wall_start, by `clock`.
  double Elapsed() const { return joule::Seconds(clock.Now() - wall_start); }
  // Phase bookkeeping (hooks.phases may be null).
  void Enter(Phase phase) const {
    if (hooks.phases) hooks.phases->Enter(phase);
  }
};

// A dataset's images [size, channels, height, width] (or [size, sample_shape...]) and
// labels [size] int64 (or a regression's targets [size, target_shape...] float32) as
// tensors over its own memory (no copy; the dataset outlives them). Images: undefined for
// a file-backed split (its images are decoded as drawn: image_batches.h).
torch::Tensor ImagesTensor(ImageDataset& d);
torch::Tensor LabelsTensor(ImageDataset& d);

// Whether any rank was asked to stop gracefully (hooks.stop_requested: the job's energy
// budget is spent), agreed with a one-float allreduce, so that every rank stops at the same
// step. Collective: every rank calls it at the same point. Errors: the allreduce's.
absl::StatusOr<bool> AgreeToStop(const AttemptContext& ctx);

// One split's evaluation after an epoch, as the history keeps it; -1 = not measured.
struct SplitEvaluation {
  double accuracy = -1, loss = -1, top_k_accuracy = -1, rmse = -1;
};

// Appends an epoch's end to result.history: `epoch` (1-based), the global `step` and
// `samples` reached, the time since wall_start, the epoch's mean training loss (-1: none
// measured), hooks.energy_joules(), the attempt, the learning rate of the epoch's last
// step (0: the algorithm has none, the GA), the test split's evaluation and the training
// split's (all -1: not asked for; its rmse is not kept).
void RecordEpoch(const AttemptContext& ctx, int32_t epoch, int64_t step, int64_t samples,
                 double train_loss, double lr, const SplitEvaluation& test,
                 const SplitEvaluation& train = SplitEvaluation{});

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_ATTEMPT_CONTEXT_H_
