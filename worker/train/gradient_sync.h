#ifndef JOULE_WORKER_TRAIN_GRADIENT_SYNC_H_
#define JOULE_WORKER_TRAIN_GRADIENT_SYNC_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"
#include "worker/comm/process_group.h"
#include "worker/energy/phase_clock.h"
#include "worker/train/gradient_reducer.h"
#include "worker/train/powersgd.h"

namespace joule::worker {

// Averages the parameters' gradients over the ranks of a group after a step's backward
// pass: the seam between the training loop and the transport. Implementations:
//   BucketedGradientSync  CPU parameters; buckets reduced while backward runs
//                         (GradientReducer, PyTorch DDP's design);
//   device (NCCL)         CUDA parameters; one flat allreduce of all gradients on the
//                         device after backward (MakeDeviceGradientSync);
//   PowerSgdGradientSync  sync.strategy POWERSGD, either device: low-rank compression
//                         with error feedback after an exact warm-up.
// Chosen once per attempt by MakeGradientSync. Not thread-safe: the training thread calls
// Prepare, runs backward, and calls Finish.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Before the backward pass of the last micro-batch of a step whose gradients are
  // averaged (backward passes before it only accumulate).
  virtual void Prepare() = 0;
  // After that backward: every parameter's .grad() holds the average over ranks (an
  // undefined gradient counts as zeros). Errors: the group's (a dead peer, a timeout,
  // ABORTED).
  virtual absl::Status Finish() = 0;
  // Bytes of gradient this rank sends into the reduction per step (what on_collective
  // reports for "allreduce"), for the step Finish last ran.
  virtual int64_t bytes_per_step() const = 0;

  // State a checkpoint must keep for a resume to equal the uninterrupted run (PowerSGD's
  // Q and error feedback). Syncs without any (the default) do nothing in the two calls
  // below, which the loop then need not make.
  virtual bool has_checkpoint_state() const { return false; }
  // Collective: every rank's state into *out on `root` (out may be null elsewhere); *out
  // is cleared when there is none yet. Errors: the group's.
  virtual absl::Status GatherState(int root, v1::PowerSgdState* out) {
    (void)root;
    (void)out;
    return absl::OkStatus();
  }
  // Collective, once before the first step: `root`'s *state (read on root; null: none)
  // restored on every rank, for an attempt that resumes after `global_step` steps.
  // Errors: the group's.
  virtual absl::Status RestoreState(int root, const v1::PowerSgdState* state, int64_t global_step) {
    (void)root;
    (void)state;
    (void)global_step;
    return absl::OkStatus();
  }
};

// GradientReducer behind the interface: float32 CPU parameters, buckets of
// `bucket_bytes`, exchanged as `wire` precision. `pg` must outlive it.
class BucketedGradientSync final : public GradientSync {
 public:
  BucketedGradientSync(std::vector<torch::Tensor> params, int64_t bucket_bytes, Precision wire,
                       ProcessGroup& pg, PhaseClock* phases);
  void Prepare() override { reducer_.Prepare(); }
  absl::Status Finish() override { return reducer_.Finish(); }
  int64_t bytes_per_step() const override { return reducer_.total_bytes(); }

 private:
  GradientReducer reducer_;
};

// sync.strategy POWERSGD: the first sync.warmup_steps steps average gradients exactly
// (`warmup`: the CPU's buckets or the device's flat allreduce), later ones through
// PowerSgdCompressor of rank sync.powersgd_rank (0: 1) seeded by the job's seed. Its
// checkpoint state is the compressor's. `averager` and `warmup` are owned.
class PowerSgdGradientSync final : public GradientSync {
 public:
  PowerSgdGradientSync(std::vector<torch::Tensor> params, std::vector<std::string> names,
                       const v1::SyncSpec& sync, uint64_t seed,
                       std::unique_ptr<FlatAverager> averager,
                       std::unique_ptr<GradientSync> warmup);
  void Prepare() override;
  absl::Status Finish() override;
  int64_t bytes_per_step() const override;
  bool has_checkpoint_state() const override { return true; }
  absl::Status GatherState(int root, v1::PowerSgdState* out) override;
  absl::Status RestoreState(int root, const v1::PowerSgdState* state, int64_t global_step) override;

 private:
  bool compressing() const { return steps_ >= warmup_steps_; }

  std::unique_ptr<FlatAverager> averager_;
  std::unique_ptr<GradientSync> warmup_;  // null when warmup_steps_ is 0
  PowerSgdCompressor compressor_;
  int64_t warmup_steps_;
  int64_t steps_ = 0;  // steps whose gradients were averaged (the global step)
  bool last_compressed_ = false;
};

// The flat device allreduce for float32 CUDA parameters on an NCCL group (any world size,
// one included). FAILED_PRECONDITION when `pg` is not an NCCL group or the build has no
// NCCL. `pg` must outlive the result.
absl::StatusOr<std::unique_ptr<GradientSync>> MakeDeviceGradientSync(
    std::vector<torch::Tensor> params, ProcessGroup& pg);

// The gradient averaging of an attempt: nullptr for one rank (nothing to average); for
// sync.strategy POWERSGD, PowerSgdGradientSync (`names`: the parameters' names; `seed`:
// the job's); else on the CPU, BucketedGradientSync with sync.bucket_bytes (0:
// kDefaultBucketBytes) and fp16 on the wire if sync.fp16_compression; on a CUDA device,
// MakeDeviceGradientSync. Collective on the CPU (the buffers come from
// ProcessGroup::NewBuffer). `phases` may be null.
absl::StatusOr<std::unique_ptr<GradientSync>> MakeGradientSync(
    const std::vector<torch::Tensor>& params, const std::vector<std::string>& names, uint64_t seed,
    const v1::SyncSpec& sync, ProcessGroup& pg, const torch::Device& device, PhaseClock* phases);

// Where a rank of `pg` trains: the CPU, or for DEVICE_KIND_GPU the CUDA device of the
// NCCL group (one GPU per rank, chosen by local rank when the group was built).
// FAILED_PRECONDITION for a GPU job when LibTorch has no CUDA, the group is not NCCL, or
// the build has no NCCL.
absl::StatusOr<torch::Device> SelectTrainingDevice(v1::DeviceKind kind, ProcessGroup& pg);

// Post-local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020):
// gradients are averaged for the first `warmup_steps` steps, then each rank steps alone
// and the parameters are averaged every `period` steps (and at every epoch end). With any
// other strategy, or one rank, every step averages gradients. Immutable.
class LocalSgdSchedule {
 public:
  LocalSgdSchedule(const v1::SyncSpec& sync, int world)
      : local_(sync.strategy() == v1::SYNC_STRATEGY_LOCAL_SGD && world > 1),
        period_(std::max(1, sync.period())),
        warmup_(sync.warmup_steps()) {}
  bool local() const { return local_; }
  // Whether the step after `global_step` updates averages its gradients.
  bool AveragesGradients(int64_t global_step) const { return !local_ || global_step < warmup_; }
  // Whether the parameters are averaged once `steps_done` updates are done (a local step
  // that ends a period).
  bool AveragesParametersAfter(int64_t steps_done) const {
    return local_ && steps_done > warmup_ && (steps_done - warmup_) % period_ == 0;
  }

 private:
  bool local_;
  int64_t period_;
  int64_t warmup_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_GRADIENT_SYNC_H_
