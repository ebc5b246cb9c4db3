#ifndef JOULE_WORKER_TRAIN_SGD_LOOP_H_
#define JOULE_WORKER_TRAIN_SGD_LOOP_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/image_batches.h"
#include "worker/data/prefetcher.h"
#include "worker/models/models.h"
#include "worker/train/attempt_context.h"
#include "worker/train/evaluation.h"
#include "worker/train/gradient_sync.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/model_state.h"
#include "worker/train/optimizer.h"
#include "worker/train/progress_reporter.h"
#include "worker/train/regression_loss.h"
#include "worker/train/splits.h"

namespace joule::worker {

// Synchronous data-parallel SGD (RunTraining's contract, trainer.h), one rank's attempt
// once its data, group and model are ready: start from rank 0's state (resumed from a
// checkpoint if there is one), train the epochs, compare the final parameters. Holds the
// state the steps share; `ctx`, `splits` and `model` outlive it. Not thread-safe (the
// training thread).
class TrainingLoop {
 public:
  TrainingLoop(const AttemptContext& ctx, Splits& splits, Model& model, const torch::Device& device);
  // Fills the result's success fields (but wall_seconds) when it returns OK.
  absl::Status Run();

 private:
  struct StepOutcome {
    double loss;
    bool ranks_equal;  // every rank holds the same parameters after the step
    double wait_seconds = 0;  // blocked at the gradient allreduce after backward
  };
  // The attempt's mean step and allreduce wait, and the links probed, into the result.
  void FillTiming();
  static constexpr int64_t kPrefetchDepth = 2;  // steps whose examples are gathered ahead

  absl::Status StartFromRankZero();
  absl::Status TrainEpoch(int epoch);
  absl::StatusOr<StepOutcome> Step(const torch::Tensor& batch_x, const torch::Tensor& batch_y);
  absl::Status EndEpoch(int epoch);
  // Evaluates the test split, or the training split (`train`), however it is held.
  absl::StatusOr<EvalResult> EvaluateSplit(bool train);
  absl::Status AverageParameters();
  // `written`, if given: whether the file was written (a failed write is only logged).
  absl::Status SaveStepCheckpoint(int epoch, int64_t next_step_in_epoch,
                                  bool* written = nullptr);
  // Collective: the sync's checkpoint state (PowerSGD's), gathered on rank 0 into
  // sync_state_ for the next SaveCheckpoint; nothing for syncs without state.
  absl::Status GatherSyncState();
  absl::Status SaveCheckpoint(int next_epoch, int64_t next_step_in_epoch,
                              const std::vector<torch::Tensor>& statistics);
  absl::Status CompareFinalParameters();
  absl::StatusOr<bool> StopAgreed(bool last_of_epoch);
  absl::Status StopWithCheckpoint(int epoch, int64_t next_step_in_epoch, bool ranks_equal);
  void Enter(Phase phase) { ctx_.Enter(phase); }
  // Seconds from `t` to now, by the attempt's clock.
  double Since(joule::Clock::TimePoint t) const { return joule::Seconds(ctx_.clock.Now() - t); }

  const AttemptContext& ctx_;
  const v1::Assignment& a_;
  const v1::JobSpec& spec_;
  const TrainerOptions& options_;
  const TrainHooks& hooks_;
  ProcessGroup& pg_;
  Model& model_;
  const torch::Device device_;
  v1::RankResult& result_;

  ModelTensors tensors_;
  Optimizer optimizer_;
  ParameterExchange exchange_;
  const std::string& ckpt_dir_;
  const uint64_t spec_hash_;
  torch::Tensor train_x_, train_y_, test_x_, test_y_;  // train_x_, test_x_: in memory only
  // File-backed splits (imagefolder:): their decoders; null for splits in memory.
  std::unique_ptr<ImageBatchLoader> train_images_, test_images_;
  EpochSharder sharder_;
  const bool sharded_;  // every rank holds only its shard of each split (hdf5:)
  BatchPrefetcher prefetch_;
  LrSchedule lr_;
  // A regression's loss (float labels); its error, if any, fails Run before training.
  absl::StatusOr<RegressionLoss> regression_loss_;
  const LocalSgdSchedule schedule_;
  std::unique_ptr<GradientSync> sync_;        // null for one rank
  // Rank 0: the sync's state as restored from a checkpoint (before the first step) or
  // gathered for the next one to be written.
  v1::PowerSgdState sync_state_;
  std::optional<ProgressReporter> reporter_;  // from the start of the loop

  int start_epoch_ = 0;
  int64_t start_step_in_epoch_ = 0;
  int64_t step_ = 0;        // global steps done
  int64_t first_step_ = 0;  // where this attempt started
  double resumed_accuracy_ = -1;
  double train_seconds_ = 0;    // in the loop so far, evaluation excluded
  // Sums over the attempt's steps: whole steps and their allreduce waits, seconds.
  double step_seconds_sum_ = 0, wait_seconds_sum_ = 0;
  int64_t timed_steps_ = 0;
  bool checkpoint_due_ = false;  // a step checkpoint is due at the next equal-ranks step
  double epoch_loss_sum_ = 0;    // this epoch's steps on this rank, for history
  int64_t epoch_loss_steps_ = 0;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_SGD_LOOP_H_
