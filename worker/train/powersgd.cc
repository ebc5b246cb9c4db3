#include "worker/train/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace joule::worker {
namespace {

// PyTorch's powerSGD_hook: a matrix is compressed only if its uncompressed size exceeds
// min_compression_rate (default 2) times its compressed size.
constexpr int64_t kMinCompressionRate = 2;

// Float32 host copy of `t` (any device), flattened.
std::vector<float> HostValues(const torch::Tensor& t) {
  torch::Tensor host = t.detach().to(torch::kCPU).contiguous().view(-1);
  const float* data = host.data_ptr<float>();
  return std::vector<float>(data, data + host.numel());
}

void AddTensor(v1::TensorData* out, const std::string& name, const torch::Tensor& t) {
  out->set_name(name);
  for (int64_t d : t.sizes()) out->add_shape(d);
  std::vector<float> v = HostValues(t);
  out->mutable_values()->Assign(v.begin(), v.end());
}

}  // namespace

torch::Tensor GroupFlatAverager::NewBuffer(int64_t n) {
  SharedBuffer buffer = pg_.NewBuffer(static_cast<size_t>(n));
  buffers_.push_back(Entry{buffer, false});
  return torch::from_blob(
      buffer->data(), {n}, [buffer](void*) {}, torch::kFloat32);
}

absl::Status GroupFlatAverager::Average(const torch::Tensor& t) {
  for (Entry& e : buffers_) {
    if (e.buffer->data() != t.data_ptr<float>()) continue;
    std::shared_ptr<Work> work =
        e.agreed ? pg_.AllreduceAgreedAsync(e.buffer, ReduceOp::kAverage, Precision::kFloat32)
                 : pg_.AllreduceAsync(e.buffer, ReduceOp::kAverage, Precision::kFloat32);
    absl::Status s = work->Wait();
    if (s.ok()) e.agreed = true;
    return s;
  }
  return absl::InvalidArgumentError("PowerSGD: a buffer this averager did not make");
}

void OrthogonaliseColumns(torch::Tensor& m) {
  const int64_t columns = m.size(1);
  for (int64_t i = 0; i < columns; ++i) {
    torch::Tensor col = m.narrow(1, i, 1);
    // Norm 0 (an all-zero gradient): divide by 1 so the column stays 0 instead of NaN.
    torch::Tensor norm = col.norm();
    col.div_(torch::where(norm > 0, norm, torch::ones_like(norm)));
    if (i + 1 == columns) break;
    torch::Tensor rest = m.narrow(1, i + 1, columns - i - 1);
    rest.sub_(col * torch::mm(col.t(), rest));
  }
}

PowerSgdCompressor::PowerSgdCompressor(std::vector<torch::Tensor> params,
                                       std::vector<std::string> names, int rank, uint64_t seed,
                                       FlatAverager& averager)
    : params_(std::move(params)),
      names_(std::move(names)),
      rank_(std::max(1, rank)),
      seed_(seed),
      averager_(averager) {
  int64_t exact_floats = 0, p_floats = 0, q_floats = 0, error_floats = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    const torch::Tensor& p = params_[k];
    const int64_t rows = p.dim() >= 2 ? p.size(0) : 0;
    const int64_t columns = rows > 0 ? p.numel() / rows : 0;
    if (rows > 0 && (rows + columns) * rank_ * kMinCompressionRate < rows * columns) {
      matrices_.push_back(Matrix{k, rows, columns, {}, {}, {}});
      p_floats += rows * rank_;
      q_floats += columns * rank_;
      error_floats += rows * columns;
    } else {
      exact_.push_back(Exact{k, {}});
      exact_floats += p.numel();
    }
  }
  const torch::Device device = params_.empty() ? torch::Device(torch::kCPU) : params_[0].device();
  first_ = averager_.NewBuffer(exact_floats + p_floats);
  q_flat_ = averager_.NewBuffer(q_floats);
  error_flat_ =
      torch::zeros({error_floats}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  int64_t at = 0;
  for (Exact& e : exact_) {
    e.view = first_.narrow(0, at, params_[e.param].numel());
    at += params_[e.param].numel();
  }
  int64_t q_at = 0, error_at = 0;
  for (Matrix& m : matrices_) {
    m.p = first_.narrow(0, at, m.rows * rank_).view({m.rows, rank_});
    m.q = q_flat_.narrow(0, q_at, m.columns * rank_).view({m.columns, rank_});
    m.error = error_flat_.narrow(0, error_at, m.rows * m.columns).view({m.rows, m.columns});
    at += m.rows * rank_;
    q_at += m.columns * rank_;
    error_at += m.rows * m.columns;
  }
}

torch::Tensor& PowerSgdCompressor::GradientOf(size_t param) {
  torch::Tensor& grad = params_[param].mutable_grad();
  if (!grad.defined()) {
    grad = torch::zeros_like(params_[param]);
  } else if (!grad.is_contiguous()) {
    grad = grad.contiguous();
  }
  return grad;
}

void PowerSgdCompressor::InitialiseQ() {
  // One generator for every matrix, drawn in model order on the CPU: the same Q on every
  // rank and every device.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_);
  for (Matrix& m : matrices_) {
    torch::Tensor q = torch::randn({m.columns, rank_}, gen);
    OrthogonaliseColumns(q);
    m.q.copy_(q);
  }
}

absl::Status PowerSgdCompressor::Reduce() {
  torch::NoGradGuard no_grad;
  if (!started_) {
    InitialiseQ();
    started_ = true;
  } else {
    // Warm start: last step's averaged Q, orthogonalised again as powerSGD_hook does (its
    // columns scale with M's singular values; P = M Q would be ill-conditioned otherwise).
    for (Matrix& m : matrices_) OrthogonaliseColumns(m.q);
  }
  for (Exact& e : exact_) e.view.copy_(GradientOf(e.param).view(-1));
  for (Matrix& m : matrices_) {
    torch::Tensor mat = GradientOf(m.param).view({m.rows, m.columns});
    mat.add_(m.error);  // M = gradient + error feedback
    torch::mm_out(m.p, mat, m.q);
  }
  if (absl::Status s = averager_.Average(first_); !s.ok()) return s;
  for (Matrix& m : matrices_) {
    OrthogonaliseColumns(m.p);
    torch::mm_out(m.q, GradientOf(m.param).view({m.rows, m.columns}).t(), m.p);
  }
  if (!matrices_.empty()) {
    if (absl::Status s = averager_.Average(q_flat_); !s.ok()) return s;
  }
  for (Exact& e : exact_) GradientOf(e.param).view(-1).copy_(e.view);
  for (Matrix& m : matrices_) {
    torch::Tensor mat = GradientOf(m.param).view({m.rows, m.columns});
    m.error.copy_(mat);
    torch::mm_out(mat, m.p, m.q.t());  // the gradient: P Q^T, the same on every rank
    m.error.sub_(mat);                 // error = M - P Q^T
  }
  return absl::OkStatus();
}

absl::Status PowerSgdCompressor::GatherState(int root, v1::PowerSgdState* out) {
  ProcessGroup& pg = averager_.group();
  if (pg.rank() == root) out->Clear();
  // started_ is every rank's alike (the same steps ran): nothing to move before a step.
  if (!started_) return absl::OkStatus();
  std::vector<float> mine = HostValues(error_flat_);
  std::vector<float> all(mine.size() * static_cast<size_t>(pg.size()));
  if (absl::Status s = pg.Allgather(mine, all); !s.ok()) return s;
  if (pg.rank() != root) return absl::OkStatus();
  out->set_matrix_rank(rank_);
  out->set_world_size(pg.size());
  for (const Matrix& m : matrices_) AddTensor(out->add_q(), names_[m.param], m.q);
  size_t at = 0;
  for (int r = 0; r < pg.size(); ++r) {
    for (const Matrix& m : matrices_) {
      v1::TensorData* e = out->add_error();
      e->set_name(names_[m.param]);
      e->add_shape(m.rows);
      e->add_shape(m.columns);
      const size_t n = static_cast<size_t>(m.rows * m.columns);
      e->mutable_values()->Assign(all.begin() + static_cast<std::ptrdiff_t>(at),
                                  all.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
    }
  }
  return absl::OkStatus();
}

std::string PowerSgdCompressor::Misfit(const v1::PowerSgdState& state, int world) const {
  if (state.matrix_rank() != rank_) {
    return absl::StrCat("it is of rank ", state.matrix_rank(), ", this job's is ", rank_);
  }
  if (state.world_size() != world) {
    return absl::StrCat("it holds the error feedback of ", state.world_size(),
                        " ranks, this attempt has ", world);
  }
  const size_t n = matrices_.size();
  if (static_cast<size_t>(state.q_size()) != n ||
      static_cast<size_t>(state.error_size()) != n * static_cast<size_t>(world)) {
    return absl::StrCat("it compresses ", state.q_size(), " gradients with ", state.error_size(),
                        " error buffers; this job compresses ", n, " on ", world, " ranks");
  }
  for (size_t i = 0; i < n * static_cast<size_t>(world) + n; ++i) {
    const bool is_q = i < n;
    const Matrix& m = matrices_[i % n];
    const v1::TensorData& t =
        is_q ? state.q(static_cast<int>(i)) : state.error(static_cast<int>(i - n));
    const int64_t want = is_q ? m.columns * rank_ : m.rows * m.columns;
    if (t.name() != names_[m.param] || t.values_size() != want) {
      return absl::StrCat(is_q ? "Q " : "error ", t.name(), " (", t.values_size(),
                          " values) does not fit ", names_[m.param], " (", want, ")");
    }
  }
  return "";
}

absl::Status PowerSgdCompressor::RestoreState(int root, const v1::PowerSgdState* state) {
  ProcessGroup& pg = averager_.group();
  std::vector<float> flag(1, 0.0f);
  if (pg.rank() == root && state != nullptr && state->world_size() > 0) {
    const std::string misfit = Misfit(*state, pg.size());
    if (misfit.empty()) {
      flag[0] = 1;
    } else {
      spdlog::warn(
          "PowerSGD: the checkpoint's compression state is not restored ({}); the "
          "error feedback starts at zero and Q afresh",
          misfit);
    }
  }
  if (absl::Status s = pg.Broadcast(flag, root); !s.ok()) return s;
  if (flag[0] == 0) {
    started_ = false;
    error_flat_.zero_();
    return absl::OkStatus();
  }
  std::vector<float> q(static_cast<size_t>(q_flat_.numel()));
  std::vector<float> errors(static_cast<size_t>(error_flat_.numel()) *
                            static_cast<size_t>(pg.size()));
  if (pg.rank() == root) {
    auto q_out = q.begin();
    for (const v1::TensorData& t : state->q())
      q_out = std::copy(t.values().begin(), t.values().end(), q_out);
    auto e_out = errors.begin();
    for (const v1::TensorData& t : state->error()) {
      e_out = std::copy(t.values().begin(), t.values().end(), e_out);
    }
  }
  if (absl::Status s = pg.Broadcast(q, root); !s.ok()) return s;
  if (absl::Status s = pg.Broadcast(errors, root); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  q_flat_.copy_(torch::from_blob(q.data(), {q_flat_.numel()}, torch::kFloat32));
  const int64_t mine = error_flat_.numel();
  error_flat_.copy_(torch::from_blob(errors.data() + static_cast<size_t>(mine) * pg.rank(), {mine},
                                     torch::kFloat32));
  started_ = true;
  return absl::OkStatus();
}

}  // namespace joule::worker
