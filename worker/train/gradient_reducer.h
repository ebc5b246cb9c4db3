#ifndef JOULE_WORKER_TRAIN_GRADIENT_REDUCER_H_
#define JOULE_WORKER_TRAIN_GRADIENT_REDUCER_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/process_group.h"
#include "worker/energy/phase_clock.h"

namespace joule::worker {

// Bytes of a gradient bucket when the spec leaves sync.bucket_bytes at 0: PyTorch DDP's
// bucket_cap_mb default (25 MiB).
inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;
// The first bucket (the last parameters, whose gradients are ready first) is capped at
// this, so that communication starts early in the backward pass: DDP's
// _DEFAULT_FIRST_BUCKET_BYTES (1 MiB).
inline constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;

// Gradient averaging overlapped with the backward pass, the design of PyTorch's
// DistributedDataParallel (Li et al., "PyTorch Distributed: Experiences on Accelerating
// Data Parallel Training", VLDB 2020):
//   - parameters are packed, in reverse order (the order backward produces their
//     gradients), into buckets of at most `bucket_bytes` (the first one of at most
//     kFirstBucketBytes); a parameter larger than the cap gets a bucket of its own;
//   - each parameter's .grad() is a view into its bucket, so backward accumulates straight
//     into the buffer that is reduced (DDP's gradient_as_bucket_view);
//   - a post-hook on each parameter's gradient accumulator counts the bucket's gradients;
//     when a bucket is complete, and every bucket before it has been launched, its
//     allreduce (average) starts on the process group's communication thread while
//     backward goes on with the next layers.
// Buckets are launched in the same order on every rank whatever order hooks fire in, so
// the collectives line up; the first step checks each bucket's call on every rank, later
// steps skip that check (ProcessGroup::AllreduceAgreedAsync). The result equals one flat
// allreduce of all gradients up to float rounding (a sum of the same terms, possibly
// chunked differently).
//
// Float32 CPU parameters only. Not thread-safe: Prepare, backward and Finish run on one
// thread (LibTorch runs CPU backward on the calling thread).
class GradientReducer {
 public:
  // `params`: the leaves that need gradients, in model order (shapes [any], float32, CPU).
  // `bucket_bytes` > 0. The group must outlive the reducer.
  GradientReducer(std::vector<torch::Tensor> params, int64_t bucket_bytes, ProcessGroup& pg);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the hooks: during the next backward() buckets are reduced as they fill. Call
  // before the backward of the last micro-batch of a step; backward passes while disarmed
  // only accumulate.
  void Prepare();
  // Launches the buckets that did not fill (parameters without a gradient in this step
  // count as zeros), waits for all of them, and leaves every parameter's .grad() holding
  // the average over ranks. Errors: those of the process group (a dead peer, a timeout,
  // ABORTED), naming the bucket.
  absl::Status Finish();

  // Bucket allreduces launched from backward are timed as communication on `phases`
  // (may be null).
  void set_phases(PhaseClock* phases) { phases_ = phases; }
  // kFloat16: buckets travel as half precision (fp16 compression); default kFloat32.
  // Before the first step only (the wire is part of the calls the first step checks).
  void set_wire_precision(Precision wire) { wire_ = wire; }

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Bytes of gradient reduced per step (all buckets).
  int64_t total_bytes() const { return total_bytes_; }
  // The parameter indices of bucket `b`, in the order they were packed.
  const std::vector<size_t>& bucket_parameters(int b) const { return buckets_[b].params; }

 private:
  struct Bucket {
    SharedBuffer buffer;
    std::vector<size_t> params;  // indices into params_
    int pending = 0;             // gradients not yet ready in this step
    std::shared_ptr<Work> work;  // set once launched
  };
  void OnGradientReady(size_t param);
  void LaunchReady();
  // Points every parameter's .grad() at its slice of its bucket (keeping any value).
  void BindGradients();

  std::vector<torch::Tensor> params_;
  std::vector<int> bucket_of_;     // param -> bucket
  std::vector<int64_t> offset_of_; // param -> float offset in its bucket
  std::vector<torch::Tensor> views_;
  std::vector<bool> ready_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  ProcessGroup& pg_;
  PhaseClock* phases_ = nullptr;
  Precision wire_ = Precision::kFloat32;
  int64_t total_bytes_ = 0;
  int next_launch_ = 0;
  bool armed_ = false;
  // Every bucket's call was checked on every rank by a completed step: later steps use
  // AllreduceAgreedAsync.
  bool agreed_ = false;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_GRADIENT_REDUCER_H_
