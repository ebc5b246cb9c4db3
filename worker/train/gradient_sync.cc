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
#endif

}  // namespace

BucketedGradientSync::BucketedGradientSync(std::vector<torch::Tensor> params,
                                           int64_t bucket_bytes, Precision wire,
                                           ProcessGroup& pg, PhaseClock* phases)
    : reducer_(std::move(params), bucket_bytes, pg) {
  reducer_.set_phases(phases);
  reducer_.set_wire_precision(wire);
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
    const std::vector<torch::Tensor>& params, const v1::SyncSpec& sync, ProcessGroup& pg,
    const torch::Device& device, PhaseClock* phases) {
  if (pg.size() <= 1) return std::unique_ptr<GradientSync>();
  if (!device.is_cpu()) return MakeDeviceGradientSync(params, pg);
  const int64_t cap = sync.bucket_bytes() > 0 ? sync.bucket_bytes() : kDefaultBucketBytes;
  const Precision wire = sync.fp16_compression() ? Precision::kFloat16 : Precision::kFloat32;
  return std::make_unique<BucketedGradientSync>(params, cap, wire, pg, phases);
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
