#ifndef JOULE_WORKER_TRAIN_TRAINER_H_
#define JOULE_WORKER_TRAIN_TRAINER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "worker/train/train_options.h"

namespace joule::worker {

// A job with an energy budget checks every this many global steps (and at each epoch's
// last step) whether any rank was asked to stop gracefully (a one-float allreduce of the ranks' stop_requested, so that all stop
// at the same step); then rank 0 writes a checkpoint there and every rank ends with
// cancelled = true and error "stopped at step S: ...". Jobs without a budget never check
// (no collective added); a stop that is not agreed within the collective timeout ends
// the way a cancel does. (kStopCheckInterval: common/job_spec.h, which the coordinator
// shares.)
using ::joule::kStopCheckInterval;

// Runs one rank's share of a job attempt, synchronous data-parallel SGD (each piece's
// contract is in the header named):
//   load the train/test splits (splits.h; INVALID_ARGUMENT unless global batch = world x
//   local batch x accumulation steps and the training split holds one global batch);
//   rendezvous; build the model from `spec.seed`; compare model fingerprints across ranks
//   (model_state.h: names, shapes and dtypes of the parameters and float buffers, world
//   size, input shape: a difference fails at once with FAILED_PRECONDITION naming the
//   rank); resume from the newest valid checkpoint of the job if there is one
//   (checkpoint_assembly.h; rank 0 reads it and broadcasts the resume point byte-exact,
//   resume_point.h); broadcast rank 0's parameters and optimizer state; then every step: forward
//   and backward on this rank's local batch, with gradients averaged over ranks
//   (gradient_sync.h: on the CPU in buckets of sync.bucket_bytes, default 25 MiB, whose
//   allreduces overlap the backward pass, GradientReducer; on a GPU in one NCCL
//   allreduce), the optimizer's step (optimizer.h: sgd, adamw or lars, PyTorch's rules). With
//   sync.strategy LOCAL_SGD, gradients are averaged only for the first warmup_steps; then
//   parameters (and optimizer state, if average_momentum) are averaged every `period` steps and
//   at every epoch end, so all ranks evaluate and finish with equal parameters. Rank 0 writes
//   checkpoints every `checkpoint_every_steps` steps and every `checkpoint_every_epochs`
//   epochs; taking one never changes the trajectory (BatchNorm statistics are averaged
//   into copies for it). Under local SGD a step checkpoint waits for the first step at
//   or after the multiple of checkpoint_every_steps at which the ranks' parameters are
//   equal (a warm-up step or an averaging): resuming from it continues the uninterrupted
//   run (up to float rounding of BatchNorm statistics) when average_momentum is set or
//   momentum is 0; otherwise the ranks' momenta differ there, and a resumed run starts
//   every rank from rank 0's.
//   After each epoch every rank evaluates its strided shard of the test split (evaluation.h;
//   empty when the split has fewer examples than ranks) and the sums are allreduced, so
//   all ranks report the same accuracy; progress goes to on_progress (progress_reporter.h).
//   Each epoch's end is recorded in result.history (step, samples, elapsed wall seconds,
//   the epoch's mean training loss, test accuracy and loss, hooks.energy_joules()).
//   At the end the ranks compare parameter hashes (CompareParameterHashes, model_state.h):
//   a job whose ranks differ never succeeds.
//
// Never throws: every failure (data, rendezvous, a dead peer, LibTorch) ends up in the
// returned RankResult with ok=false, an error naming what failed and its error_code
// (google.rpc.Code: DATA_LOSS, INVALID_ARGUMENT, FAILED_PRECONDITION are not worth a
// retry; UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED are).
v1::RankResult RunTraining(const v1::Assignment& assignment, const TrainerOptions& options,
                           const TrainHooks& hooks);

// Sets this process's intra-op threads: LibTorch's and, where the BLAS under it is
// OpenBLAS (Debian's LibTorch calls the system libblas.so.3), OpenBLAS's own pool too.
// `n` >= 1. Process-wide; call it between, not during, tensor operations.
void SetIntraOpThreads(int n);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_TRAINER_H_
