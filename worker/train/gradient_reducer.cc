#include "worker/train/gradient_reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "absl/strings/str_cat.h"

namespace joule::worker {

GradientReducer::GradientReducer(std::vector<torch::Tensor> params, int64_t bucket_bytes,
                                 ProcessGroup& pg)
    : params_(std::move(params)), pg_(pg) {
  const size_t n = params_.size();
  bucket_of_.assign(n, -1);
  offset_of_.assign(n, 0);
  ready_.assign(n, false);
  views_.resize(n);
  // Reverse model order: the order backward produces gradients in.
  std::vector<std::vector<size_t>> groups;
  int64_t filled = 0;
  for (size_t k = n; k-- > 0;) {
    const int64_t bytes = params_[k].numel() * static_cast<int64_t>(sizeof(float));
    // The bucket being filled is the first one while groups.size() == 1.
    const int64_t cap =
        groups.size() == 1 ? std::min(bucket_bytes, kFirstBucketBytes) : bucket_bytes;
    if (groups.empty() || (filled > 0 && filled + bytes > cap)) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(k);
    filled += bytes;
    total_bytes_ += bytes;
  }
  for (auto& g : groups) {
    Bucket b;
    int64_t floats = 0;
    for (size_t k : g) {
      bucket_of_[k] = static_cast<int>(buckets_.size());
      offset_of_[k] = floats;
      floats += params_[k].numel();
    }
    // Collective: every rank builds the same buckets in the same order.
    b.buffer = pg_.NewBuffer(static_cast<size_t>(floats));
    b.params = std::move(g);
    b.pending = static_cast<int>(b.params.size());
    buckets_.push_back(std::move(b));
  }
  for (size_t k = 0; k < n; ++k) {
    SharedBuffer keep = buckets_[bucket_of_[k]].buffer;
    views_[k] = torch::from_blob(keep->data() + offset_of_[k], params_[k].sizes(),
                                 [keep](void*) {}, torch::kFloat32);
  }
  BindGradients();
  for (size_t k = 0; k < n; ++k) {
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params_[k]);
    const uintptr_t key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, k](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list&) {
          OnGradientReady(k);
          return outputs;
        }));
    hooks_.emplace_back(std::move(acc), key);
  }
}

GradientReducer::~GradientReducer() {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
}

void GradientReducer::BindGradients() {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    torch::Tensor& grad = params_[k].mutable_grad();
    if (grad.defined() && grad.data_ptr() == views_[k].data_ptr()) continue;
    if (grad.defined()) {
      views_[k].copy_(grad);
    } else {
      views_[k].zero_();
    }
    grad = views_[k];
  }
}

void GradientReducer::Prepare() {
  BindGradients();
  armed_ = true;
}

void GradientReducer::OnGradientReady(size_t k) {
  if (!armed_ || ready_[k]) return;
  ready_[k] = true;
  const torch::Tensor& grad = params_[k].grad();
  if (grad.defined() && grad.data_ptr() != views_[k].data_ptr()) {
    torch::NoGradGuard no_grad;
    views_[k].copy_(grad);
  }
  if (--buckets_[bucket_of_[k]].pending == 0) LaunchReady();
}

void GradientReducer::LaunchReady() {
  ScopedPhase comm(phases_, Phase::kCommunication);
  while (next_launch_ < num_buckets() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    // The first step checks every bucket's call on every rank; later steps repeat that
    // cycle, unchecked (ProcessGroup::AllreduceAgreedAsync).
    b.work = agreed_ ? pg_.AllreduceAgreedAsync(b.buffer, ReduceOp::kAverage, wire_)
                     : pg_.AllreduceAsync(b.buffer, ReduceOp::kAverage, wire_);
  }
}

absl::Status GradientReducer::Finish() {
  armed_ = false;
  torch::NoGradGuard no_grad;
  // Gradients that never arrived (unused parameters, or a backward that ran disarmed).
  for (size_t k = 0; k < params_.size(); ++k) {
    if (ready_[k]) continue;
    const torch::Tensor& grad = params_[k].grad();
    if (!grad.defined()) {
      views_[k].zero_();
    } else if (grad.data_ptr() != views_[k].data_ptr()) {
      views_[k].copy_(grad);
    }
    ready_[k] = true;
    --buckets_[bucket_of_[k]].pending;
  }
  LaunchReady();
  absl::Status first;
  for (int b = 0; b < num_buckets(); ++b) {
    absl::Status s = buckets_[b].work->Wait();
    if (!s.ok() && first.ok()) {
      first = absl::Status(s.code(), absl::StrCat("gradient bucket ", b, " of ", num_buckets(),
                                                  " (", buckets_[b].buffer->size() * sizeof(float),
                                                  " bytes): ", s.message()));
    }
    buckets_[b].work = nullptr;
    buckets_[b].pending = static_cast<int>(buckets_[b].params.size());
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  if (!first.ok()) return first;
  agreed_ = true;
  for (size_t k = 0; k < params_.size(); ++k) {
    // A .grad() replaced during the step (its value is in the bucket): point it back.
    if (params_[k].grad().data_ptr() != views_[k].data_ptr()) params_[k].mutable_grad() = views_[k];
  }
  return absl::OkStatus();
}

}  // namespace joule::worker
