#include "worker/train/gradient_sync.h"

#include <utility>

// The one place that knows which transport backs a device: NCCL for CUDA.
#ifdef JOULE_WITH_NCCL
#include <torch/cuda.h>

#include "worker/comm/nccl_process_group.h"
#endif

namespace joule::worker {
namespace {

#ifdef JOULE_WITH_NCCL
// Averages the gradients of CUDA parameters with one NCCL allreduce of a flat device
// buffer, after backward.
class NcclGradientSync final : public GradientSync {
 public:
  NcclGradientSync(std::vector<torch::Tensor> params, NcclProcessGroup& pg)
      : params_(std::move(params)), pg_(pg) {
    for (const auto& p : params_) bytes_ += p.numel() * static_cast<int64_t>(sizeof(float));
  }
  void Prepare() override {}
  absl::Status Finish() override {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    for (auto& p : params_) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad().reshape(-1));
    }
    torch::Tensor flat = torch::cat(grads);
    // NCCL runs on its own stream: the gradients must be complete first.
    torch::cuda::synchronize(pg_.device());
    if (absl::Status s = pg_.AllreduceDevice(flat.data_ptr(), static_cast<size_t>(flat.numel()),
                                             DataType::kFloat32, ReduceOp::kAverage);
        !s.ok()) {
      return s;
    }
    int64_t off = 0;
    for (auto& p : params_) {
      p.mutable_grad().view(-1).copy_(flat.narrow(0, off, p.numel()));
      off += p.numel();
    }
    return absl::OkStatus();
  }
  int64_t bytes_per_step() const override { return bytes_; }

 private:
  std::vector<torch::Tensor> params_;
  NcclProcessGroup& pg_;
  int64_t bytes_ = 0;
};

// PowerSGD's buffers in device memory, averaged by NCCL on the device.
class NcclFlatAverager final : public FlatAverager {
 public:
  explicit NcclFlatAverager(NcclProcessGroup& pg) : pg_(pg) {}
  torch::Tensor NewBuffer(int64_t n) override {
    return torch::zeros({n},
                        torch::TensorOptions()
                            .dtype(torch::kFloat32)
                            .device(torch::kCUDA, static_cast<c10::DeviceIndex>(pg_.device())));
  }
  absl::Status Average(const torch::Tensor& buffer) override {
    // NCCL runs on its own stream: what wrote the buffer must be complete first.
    torch::cuda::synchronize(pg_.device());
    return pg_.AllreduceDevice(buffer.data_ptr(), static_cast<size_t>(buffer.numel()),
                               DataType::kFloat32, ReduceOp::kAverage);
  }
  ProcessGroup& group() override { return pg_; }

 private:
  NcclProcessGroup& pg_;
};
#endif

// The averager of PowerSGD's buffers for parameters on `device`.
absl::StatusOr<std::unique_ptr<FlatAverager>> MakeFlatAverager(ProcessGroup& pg,
                                                               const torch::Device& device) {
  if (device.is_cpu()) return std::unique_ptr<FlatAverager>(new GroupFlatAverager(pg));
#ifdef JOULE_WITH_NCCL
  auto* nccl = dynamic_cast<NcclProcessGroup*>(&pg);
  if (nccl == nullptr) return absl::FailedPreconditionError("CUDA gradients need NCCL");
  return std::unique_ptr<FlatAverager>(new NcclFlatAverager(*nccl));
#else
  return absl::FailedPreconditionError("CUDA gradients need NCCL: built without NCCL");
#endif
}

}  // namespace

BucketedGradientSync::BucketedGradientSync(std::vector<torch::Tensor> params,
                                           int64_t bucket_bytes, Precision wire,
                                           ProcessGroup& pg, PhaseClock* phases)
    : reducer_(std::move(params), bucket_bytes, pg) {
  reducer_.set_phases(phases);
  reducer_.set_wire_precision(wire);
}

PowerSgdGradientSync::PowerSgdGradientSync(std::vector<torch::Tensor> params,
                                           std::vector<std::string> names, const v1::SyncSpec& sync,
                                           uint64_t seed, std::unique_ptr<FlatAverager> averager,
                                           std::unique_ptr<GradientSync> warmup)
    : averager_(std::move(averager)),
      warmup_(std::move(warmup)),
      compressor_(std::move(params), std::move(names), std::max(1, sync.powersgd_rank()), seed,
                  *averager_),
      warmup_steps_(warmup_ ? sync.warmup_steps() : 0) {}

void PowerSgdGradientSync::Prepare() {
  if (!compressing()) warmup_->Prepare();
}

absl::Status PowerSgdGradientSync::Finish() {
  last_compressed_ = compressing();
  absl::Status s;
  // The loop has entered the communication phase; a warm-up's buckets record their own.
  s = last_compressed_ ? compressor_.Reduce() : warmup_->Finish();
  if (s.ok()) ++steps_;
  return s;
}

int64_t PowerSgdGradientSync::bytes_per_step() const {
  if (last_compressed_ || !warmup_) {
    return compressor_.floats_per_step() * static_cast<int64_t>(sizeof(float));
  }
  return warmup_->bytes_per_step();
}

absl::Status PowerSgdGradientSync::GatherState(int root, v1::PowerSgdState* out) {
  return compressor_.GatherState(root, out);
}

absl::Status PowerSgdGradientSync::RestoreState(int root, const v1::PowerSgdState* state,
                                                int64_t global_step) {
  steps_ = global_step;
  return compressor_.RestoreState(root, state);
}

absl::StatusOr<std::unique_ptr<GradientSync>> MakeDeviceGradientSync(
    std::vector<torch::Tensor> params, ProcessGroup& pg) {
#ifdef JOULE_WITH_NCCL
  auto* nccl = dynamic_cast<NcclProcessGroup*>(&pg);
  if (nccl == nullptr) return absl::FailedPreconditionError("CUDA gradients need NCCL");
  return std::make_unique<NcclGradientSync>(std::move(params), *nccl);
#else
  (void)params;
  (void)pg;
  return absl::FailedPreconditionError("CUDA gradients need NCCL: built without NCCL");
#endif
}

absl::StatusOr<std::unique_ptr<GradientSync>> MakeGradientSync(
    const std::vector<torch::Tensor>& params, const std::vector<std::string>& names, uint64_t seed,
    const v1::SyncSpec& sync, ProcessGroup& pg, const torch::Device& device, PhaseClock* phases) {
  if (pg.size() <= 1) return std::unique_ptr<GradientSync>();
  auto exact = [&]() -> absl::StatusOr<std::unique_ptr<GradientSync>> {
    if (!device.is_cpu()) return MakeDeviceGradientSync(params, pg);
    const int64_t cap = sync.bucket_bytes() > 0 ? sync.bucket_bytes() : kDefaultBucketBytes;
    const Precision wire = sync.fp16_compression() ? Precision::kFloat16 : Precision::kFloat32;
    return std::unique_ptr<GradientSync>(new BucketedGradientSync(params, cap, wire, pg, phases));
  };
  if (sync.strategy() != v1::SYNC_STRATEGY_POWERSGD) return exact();
  // The same order on every rank: the warm-up's buffers, then the compressor's.
  std::unique_ptr<GradientSync> warmup;
  if (sync.warmup_steps() > 0) {
    absl::StatusOr<std::unique_ptr<GradientSync>> w = exact();
    if (!w.ok()) return w.status();
    warmup = *std::move(w);
  }
  absl::StatusOr<std::unique_ptr<FlatAverager>> averager = MakeFlatAverager(pg, device);
  if (!averager.ok()) return averager.status();
  return std::unique_ptr<GradientSync>(
      new PowerSgdGradientSync(params, names, sync, seed, *std::move(averager), std::move(warmup)));
}

absl::StatusOr<torch::Device> SelectTrainingDevice(v1::DeviceKind kind, ProcessGroup& pg) {
  if (kind != v1::DEVICE_KIND_GPU) return torch::Device(torch::kCPU);
#ifdef JOULE_WITH_NCCL
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "GPU job on a worker whose LibTorch has no CUDA (Debian's libtorch-dev is CPU-only; "
        "see README, GPU builds)");
  }
  auto* nccl = dynamic_cast<NcclProcessGroup*>(&pg);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError("GPU training needs the NCCL process group");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(nccl->device()));
#else
  (void)pg;
  return absl::FailedPreconditionError(
      "GPU job on a worker built without CUDA and NCCL (see README, GPU builds)");
#endif
}

}  // namespace joule::worker
