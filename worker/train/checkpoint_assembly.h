#ifndef JOULE_WORKER_TRAIN_CHECKPOINT_ASSEMBLY_H_
#define JOULE_WORKER_TRAIN_CHECKPOINT_ASSEMBLY_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "joule/v1/checkpoint.pb.h"
#include "joule/v1/worker.pb.h"
#include "worker/train/model_state.h"
#include "worker/train/resume_point.h"
#include "worker/train/optimizer.h"

namespace joule::worker {

// Between a training attempt and its checkpoints (the file format: checkpoint.h).

// The directory of the assignment's job's checkpoints (CheckpointDirectory of checkpoint.h).
std::string CheckpointDirectory(const std::string& root, const v1::Assignment& assignment);

// Where the loop stands when it saves: the position to resume at and the last evaluation.
struct CheckpointPosition {
  int next_epoch = 0;
  int64_t next_step_in_epoch = 0;
  int64_t global_step = 0;
  double test_accuracy = -1;  // -1: no evaluation yet
  double test_loss = 0;
  // A plateau learning-rate schedule's state after the last finished epoch; none for
  // other schedules.
  std::optional<PlateauState> plateau;
};

// A format-1 checkpoint of the attempt `assignment` (job id, attempt) with `spec_hash`:
// the parameters under their names, the optimizer's state (momentum, second_moment) only
// once `optimizer` has started,
// `statistics` (the values to save, e.g. the ranks' average, in statistic_names order),
// and the gradient sync's state when it has any (`sync_state` of a PowerSGD job, moved
// into the checkpoint and left empty; null or world_size 0: none). Tensors are copied to
// the host; all must be float32.
v1::Checkpoint AssembleCheckpoint(const v1::Assignment& assignment, uint64_t spec_hash,
                                  const CheckpointPosition& position, const ModelTensors& model,
                                  const Optimizer& optimizer,
                                  const std::vector<torch::Tensor>& statistics,
                                  v1::PowerSgdState* sync_state = nullptr);

// The resume point a checkpoint describes.
ResumePoint ResumePointOf(const v1::Checkpoint& checkpoint);

// Copies a checkpoint's parameters into model.parameters, its optimizer state (if any)
// into optimizer.state() and its statistics (if any) into model.statistics, checking
// every name and size first for parameters and optimizer state, in order for statistics.
// DATA_LOSS naming the tensor that does not fit, or when the checkpoint's state slots are
// not the optimizer's (then the tensors may be partly written). Leaves
// optimizer.steps() alone (the resume point carries it to every rank).
absl::Status RestoreCheckpoint(const v1::Checkpoint& checkpoint, ModelTensors& model,
                               Optimizer& optimizer);

// Rank 0's half of resuming: restores the newest checkpoint in `dir` that verifies and
// matches `spec_hash` (LoadNewestCheckpoint) and returns where it resumes; nullopt when
// `dir` is empty or holds none. `sync_state`, if given, receives the checkpoint's PowerSGD
// state (cleared when it has none; the gradient sync checks it fits). Files skipped are
// logged as warnings for `job_id`. Errors: those of RestoreCheckpoint.
absl::StatusOr<std::optional<ResumePoint>> RestoreNewestCheckpoint(
    const std::string& dir, uint64_t spec_hash, int64_t job_id, ModelTensors& model,
    Optimizer& optimizer, v1::PowerSgdState* sync_state = nullptr);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_CHECKPOINT_ASSEMBLY_H_
