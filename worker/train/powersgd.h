#ifndef JOULE_WORKER_TRAIN_POWERSGD_H_
#define JOULE_WORKER_TRAIN_POWERSGD_H_

// Includes LibTorch: only worker/train .cc files and tests include this header.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "joule/v1/checkpoint.pb.h"
#include "worker/comm/process_group.h"

namespace joule::worker {

// Where PowerSGD's two flat buffers live and how a rank averages them with the others:
// ProcessGroup memory on the CPU (GroupFlatAverager), device memory under NCCL. Not
// thread-safe; one thread issues the collectives, as ProcessGroup's rules say.
class FlatAverager {
 public:
  virtual ~FlatAverager() = default;
  // A zeroed float32 buffer of `n` elements, shape [n], for repeated Average calls.
  // Collective: every rank calls it in the same order with the same `n`.
  virtual torch::Tensor NewBuffer(int64_t n) = 0;
  // Replaces `buffer` (one NewBuffer made) with its element-wise mean over the ranks.
  // Collective. Errors: the group's (DEADLINE_EXCEEDED, UNAVAILABLE, ABORTED).
  virtual absl::Status Average(const torch::Tensor& buffer) = 0;
  // The group whose host collectives move checkpoint state (Allgather, Broadcast).
  virtual ProcessGroup& group() = 0;
};

// Buffers from ProcessGroup::NewBuffer (copy-free on the shared-memory group), averaged
// with AllreduceAsync the first time and AllreduceAgreedAsync after (a fixed cycle of
// checked calls: one round trip less per call on Gloo). `pg` must outlive it.
class GroupFlatAverager final : public FlatAverager {
 public:
  explicit GroupFlatAverager(ProcessGroup& pg) : pg_(pg) {}
  torch::Tensor NewBuffer(int64_t n) override;
  absl::Status Average(const torch::Tensor& buffer) override;
  ProcessGroup& group() override { return pg_; }

 private:
  struct Entry {
    SharedBuffer buffer;
    bool agreed = false;
  };
  ProcessGroup& pg_;
  std::vector<Entry> buffers_;
};

// PowerSGD gradient compression (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical
// Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019, Algorithm 1
// with error feedback and warm start), as PyTorch's DDP powerSGD_hook does it
// (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py):
//   - a gradient of two or more dimensions is a matrix M of rows = size(0) and
//     columns = numel / rows; it is compressed when (rows + columns) x R x 2 < rows x
//     columns (the hook's min_compression_rate 2), others (biases, norms, small or thin
//     matrices) are averaged exactly;
//   - M += error (this rank's error feedback); P = M Q; P is averaged over ranks, together
//     with the exact gradients in one collective, and orthogonalised column by column
//     (Gram-Schmidt; a zero column stays zero); Q = M^T P is averaged (the second
//     collective); the gradient becomes P Q^T, the same on every rank, and
//     error = M - P Q^T;
//   - Q is warm-started: each step starts from the previous step's averaged Q,
//     orthogonalised again; the first comes from a standard normal draw seeded by `seed`
//     (the same on every rank), orthogonalised.
// Unlike the hook, gradients averaged exactly carry no error feedback (theirs is
// the rank's deviation from the mean, which sums to zero over ranks): the same
// trajectory up to float rounding, not bit for bit.
// Two collectives a step whatever the model, of (exact + sum of rows x R) and
// (sum of columns x R) floats.
//
// Shapes: parameters of any shape, float32, all on one device. Not thread-safe: the
// training thread calls everything; collectives must be issued in the same order on every
// rank.
class PowerSgdCompressor {
 public:
  // `names`: the parameters' names, same order (used by the checkpoint state). `rank` >= 1.
  // Collective (two NewBuffer calls). `averager` must outlive it.
  PowerSgdCompressor(std::vector<torch::Tensor> params, std::vector<std::string> names, int rank,
                     uint64_t seed, FlatAverager& averager);

  // Replaces every parameter's .grad() (undefined counts as zeros) with the compressed
  // average over ranks, and updates this rank's error feedback. Errors: the averager's;
  // then the gradients and the state are partly updated (the attempt ends).
  absl::Status Reduce();

  // Float32 values this rank sends into the two averages per step.
  int64_t floats_per_step() const { return first_.numel() + q_flat_.numel(); }
  // Parameters compressed (the others are averaged exactly).
  int compressed_count() const { return static_cast<int>(matrices_.size()); }
  // Whether a step has run (the state exists).
  bool started() const { return started_; }

  // Collective: every rank's error feedback and the common Q, gathered into *out on
  // `root` (*out is left untouched elsewhere, and cleared on root before a first step).
  // Moves world x (its error floats) through an Allgather: checkpoints only. Errors: the
  // group's.
  absl::Status GatherState(int root, v1::PowerSgdState* out);
  // Collective: `root`'s *state (read on root only; null: none) becomes every rank's (its
  // Q, and each rank its own error feedback). A state that does not fit (another rank R,
  // world size, parameter name or size) is not restored: root logs why and every rank
  // starts afresh, as does every rank when there is none. Errors: the group's.
  absl::Status RestoreState(int root, const v1::PowerSgdState* state);

 private:
  struct Matrix {
    size_t param;  // index into params_
    int64_t rows = 0, columns = 0;
    torch::Tensor p, q;   // views into first_ ([rows, R]) and q_flat_ ([columns, R])
    torch::Tensor error;  // view into error_flat_, [rows, columns]
  };
  struct Exact {
    size_t param;
    torch::Tensor view;  // into first_, [numel]
  };
  // The parameter's gradient as a contiguous tensor it owns (zeros if undefined).
  torch::Tensor& GradientOf(size_t param);
  void InitialiseQ();
  // Why `state` does not fit this compressor, or "" when it does.
  std::string Misfit(const v1::PowerSgdState& state, int world) const;

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  int rank_;
  uint64_t seed_;
  FlatAverager& averager_;
  std::vector<Matrix> matrices_;
  std::vector<Exact> exact_;
  torch::Tensor first_;       // [exact gradients | P of each matrix]
  torch::Tensor q_flat_;      // Q of each matrix
  torch::Tensor error_flat_;  // this rank's error feedback of each matrix
  bool started_ = false;
};

// Gram-Schmidt on the columns of `m` ([rows, R], float32), in place: each column
// normalised after the earlier ones' components are removed; a column of norm 0 stays 0.
void OrthogonaliseColumns(torch::Tensor& m);

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_POWERSGD_H_
