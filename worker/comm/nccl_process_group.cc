#include "worker/comm/nccl_process_group.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/comm/half.h"

namespace joule::worker {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t ToNccl(DataType t) { return t == DataType::kFloat16 ? ncclHalf : ncclFloat32; }
ncclRedOp_t ToNccl(ReduceOp op) { return op == ReduceOp::kAverage ? ncclAvg : ncclSum; }

std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

}  // namespace

// Owns the communicator and the CUDA objects: whatever Create made before an error is
// released with it.
struct NcclProcessGroup::Impl {
  explicit Impl(int device) : device(device) {}
  ~Impl() {
    cudaSetDevice(device);
    // Every collective of the group has completed or been abandoned (Wait() returned);
    // ncclCommAbort frees the communicator without waiting on peers.
    if (comm != nullptr) ncclCommAbort(comm);
    if (staging != nullptr) cudaFree(staging);
    if (calls != nullptr) cudaFree(calls);
    if (event != nullptr) cudaEventDestroy(event);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  const int device;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  void* staging = nullptr;
  size_t staging_bytes = 0;
  uint64_t* calls = nullptr;  // 3 x size: the ranks' CollectiveCalls (Agree)

  std::string NcclError(ncclResult_t r) const {
    std::string s = ncclGetErrorString(r);
    if (comm != nullptr) {
      const char* last = ncclGetLastError(comm);
      if (last != nullptr && *last != '\0') absl::StrAppend(&s, ": ", last);
    }
    return s;
  }
};

NcclProcessGroup::NcclProcessGroup(int rank, int size, int device, std::unique_ptr<Impl> impl,
                                   std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), device_(device), impl_(std::move(impl)), timeout_(timeout) {}

NcclProcessGroup::~NcclProcessGroup() = default;

absl::StatusOr<std::unique_ptr<NcclProcessGroup>> NcclProcessGroup::Create(
    int rank, int size, KvClient& kv, const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of world size ", size));
  }
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, ": no CUDA device", e != cudaSuccess ? ": " + CudaError(e) : ""));
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, ": CUDA device ",
                                                      options.device, " does not exist (",
                                                      devices, " visible)"));
  }
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaSetDevice(", options.device, "): ", CudaError(e)));
  }
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
    }
    if (absl::Status s = kv.Set("nccl/id", std::string(id.internal, NCCL_UNIQUE_ID_BYTES)); !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<std::string> v = kv.Get("nccl/id", options.timeout);
    if (!v.ok()) return v.status();
    if (v->size() != NCCL_UNIQUE_ID_BYTES) {
      return absl::DataLossError(absl::StrCat("rendezvous key nccl/id holds ", v->size(),
                                              " bytes, not ", NCCL_UNIQUE_ID_BYTES));
    }
    std::memcpy(id.internal, v->data(), NCCL_UNIQUE_ID_BYTES);
  }
  auto impl = std::make_unique<Impl>(options.device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns; we poll with a deadline
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, size, id, rank, &config);
  const auto deadline = Clock::now() + options.timeout;
  while (r == ncclInProgress) {
    if (Clock::now() > deadline) {  // ~Impl aborts the communicator
      return absl::DeadlineExceededError(absl::StrCat(
          "NCCL rendezvous on rank ", rank, ": not every rank joined within ",
          options.timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(impl->comm, &r);
  }
  if (r != ncclSuccess) {
    std::string why = impl->NcclError(r);
    return absl::UnavailableError(absl::StrCat("ncclCommInitRankConfig on rank ", rank, ": ", why));
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaStreamCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&impl->event, cudaEventDisableTiming);
      e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaEventCreate: ", CudaError(e)));
  }
  if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&impl->calls),
                                 3 * sizeof(uint64_t) * static_cast<size_t>(size));
      e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaMalloc for NCCL call checks: ", CudaError(e)));
  }
  return std::unique_ptr<NcclProcessGroup>(
      new NcclProcessGroup(rank, size, options.device, std::move(impl), options.timeout));
}

void NcclProcessGroup::Abort() { aborted_.store(true); }

absl::Status NcclProcessGroup::Check(const char* what) const {
  if (broken_ || aborted_.load()) {
    return absl::AbortedError(absl::StrCat("NCCL ", what, " on rank ", rank_, ": ",
                                           aborted_.load() ? "aborted"
                                                           : "the group is broken by an earlier error"));
  }
  return absl::OkStatus();
}

absl::Status NcclProcessGroup::Wait(const char* what) {
  if (cudaError_t e = cudaEventRecord(impl_->event, impl_->stream); e != cudaSuccess) {
    broken_ = true;
    return absl::UnavailableError(absl::StrCat("NCCL ", what, " on rank ", rank_,
                                               ": cudaEventRecord: ", CudaError(e)));
  }
  const auto start = Clock::now();
  const auto deadline = start + timeout_;
  auto give_up = [&](absl::Status s) {
    ncclCommAbort(impl_->comm);  // releases the kernels waiting on peers
    impl_->comm = nullptr;
    broken_ = true;
    return s;
  };
  while (true) {
    const cudaError_t q = cudaEventQuery(impl_->event);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) {
      return give_up(absl::UnavailableError(
          absl::StrCat("NCCL ", what, " on rank ", rank_, ": CUDA: ", CudaError(q))));
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(impl_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      return give_up(absl::UnavailableError(absl::StrCat("NCCL ", what, " on rank ", rank_,
                                                         ": ", impl_->NcclError(async))));
    }
    const auto now = Clock::now();
    if (aborted_.load()) {
      return give_up(absl::AbortedError(absl::StrCat("NCCL ", what, " on rank ", rank_,
                                                     ": aborted while waiting for peers")));
    }
    if (now > deadline) {
      return give_up(absl::DeadlineExceededError(absl::StrCat(
          "NCCL ", what, " on rank ", rank_, ": not finished within ", timeout_.count(),
          " ms (a peer is gone or stopped)")));
    }
    if (now - start > std::chrono::microseconds(200)) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

absl::Status NcclProcessGroup::Enqueued(int result, const char* what) {
  ncclResult_t r = static_cast<ncclResult_t>(result);
  // A non-blocking communicator may answer ncclInProgress before the kernel is on the
  // stream (e.g. while it connects lazily): recording the completion event now would see
  // an empty stream. Poll until the call has really been enqueued.
  const auto deadline = Clock::now() + timeout_;
  while (r == ncclInProgress) {
    if (aborted_.load() || Clock::now() > deadline) {
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      broken_ = true;
      return aborted_.load()
                 ? absl::AbortedError(absl::StrCat("NCCL ", what, " on rank ", rank_, ": aborted"))
                 : absl::DeadlineExceededError(absl::StrCat("NCCL ", what, " on rank ", rank_,
                                                            ": not enqueued within ",
                                                            timeout_.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    ncclCommGetAsyncError(impl_->comm, &r);
  }
  if (r != ncclSuccess) {
    broken_ = true;
    return absl::UnavailableError(
        absl::StrCat("NCCL ", what, " on rank ", rank_, ": ", impl_->NcclError(r)));
  }
  return Wait(what);
}

absl::Status NcclProcessGroup::Agree(const CollectiveCall& call, const char* what) {
  if (size_ == 1) return absl::OkStatus();
  std::vector<uint64_t> all(3 * static_cast<size_t>(size_));
  uint64_t* mine = all.data() + 3 * rank_;
  mine[0] = call.kind;
  mine[1] = call.count;
  mine[2] = call.arg;
  // The stream is idle (every call waits), so neither copy can block on a peer.
  if (cudaError_t e = cudaMemcpyAsync(impl_->calls + 3 * rank_, mine, 3 * sizeof(uint64_t),
                                      cudaMemcpyHostToDevice, impl_->stream);
      e != cudaSuccess) {
    broken_ = true;
    return absl::UnavailableError(absl::StrCat("NCCL ", what, " on rank ", rank_,
                                               ": copying its call: ", CudaError(e)));
  }
  ncclResult_t r = ncclAllGather(impl_->calls + 3 * rank_, impl_->calls, 3, ncclUint64,
                                 impl_->comm, impl_->stream);
  if (absl::Status s = Enqueued(r, what); !s.ok()) return s;
  if (cudaError_t e = cudaMemcpyAsync(all.data(), impl_->calls, all.size() * sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, impl_->stream);
      e != cudaSuccess) {
    broken_ = true;
    return absl::UnavailableError(absl::StrCat("NCCL ", what, " on rank ", rank_,
                                               ": copying the calls: ", CudaError(e)));
  }
  if (absl::Status s = Wait(what); !s.ok()) return s;
  std::vector<CollectiveCall> calls(size_);
  for (int i = 0; i < size_; ++i) calls[i] = {all[3 * i], all[3 * i + 1], all[3 * i + 2]};
  // Every rank skips the collective alike: the communicator stays usable.
  return CompareCalls("NCCL", what, rank_, calls);
}

absl::Status NcclProcessGroup::AllreduceDevice(void* data, size_t count, DataType type,
                                               ReduceOp op) {
  if (absl::Status s = Check("allreduce"); !s.ok()) return s;
  const CollectiveCall call{
      type == DataType::kFloat16 ? CollectiveCall::kAllreduceHalf : CollectiveCall::kAllreduce,
      count, static_cast<uint64_t>(op)};
  if (absl::Status s = Agree(call, "allreduce"); !s.ok()) return s;
  if (count == 0) return absl::OkStatus();
  ncclResult_t r = ncclAllReduce(data, data, count, ToNccl(type), ToNccl(op), impl_->comm,
                                 impl_->stream);
  return Enqueued(r, "allreduce");
}

absl::Status NcclProcessGroup::BroadcastDevice(void* data, size_t count, DataType type,
                                               int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " of world size ", size_));
  }
  if (absl::Status s = Check("broadcast"); !s.ok()) return s;
  if (absl::Status s = Agree({CollectiveCall::kBroadcast, count, static_cast<uint64_t>(root)},
                             "broadcast");
      !s.ok()) {
    return s;
  }
  if (count == 0) return absl::OkStatus();
  ncclResult_t r =
      ncclBroadcast(data, data, count, ToNccl(type), root, impl_->comm, impl_->stream);
  return Enqueued(r, "broadcast");
}

absl::Status NcclProcessGroup::Staged(void* host, size_t bytes, const char* what,
                                      const std::function<absl::Status(void*)>& op) {
  if (absl::Status s = Check(what); !s.ok()) return s;
  if (bytes > impl_->staging_bytes) {
    if (impl_->staging != nullptr) cudaFree(impl_->staging);
    impl_->staging = nullptr;
    impl_->staging_bytes = 0;
    if (cudaError_t e = cudaMalloc(&impl_->staging, bytes); e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc(", bytes, ") for NCCL ", what, ": ", CudaError(e)));
    }
    impl_->staging_bytes = bytes;
  }
  void* dev = impl_->staging;
  // The stream is idle here (every call waits), so these copies cannot block on a peer.
  if (cudaError_t e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, impl_->stream);
      e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("copy to device for NCCL ", what, ": ", CudaError(e)));
  }
  if (absl::Status s = op(dev); !s.ok()) return s;
  if (cudaError_t e = cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, impl_->stream);
      e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("copy from device for NCCL ", what, ": ", CudaError(e)));
  }
  return Wait(what);
}

absl::Status NcclProcessGroup::Allreduce(std::span<float> data, ReduceOp op) {
  if (size_ == 1) return Check("allreduce");
  if (data.empty()) return AllreduceDevice(nullptr, 0, DataType::kFloat32, op);  // compared
  return Staged(data.data(), data.size_bytes(), "allreduce", [&](void* dev) {
    return AllreduceDevice(dev, data.size(), DataType::kFloat32, op);
  });
}

std::shared_ptr<Work> NcclProcessGroup::AllreduceAsync(SharedBuffer data, ReduceOp op,
                                                       Precision wire) {
  if (wire == Precision::kFloat32) {
    return std::make_shared<CompletedWork>(Allreduce(std::span<float>(*data), op));
  }
  std::vector<Half> half(data->size());
  FloatsToHalves(data->data(), half.data(), half.size());
  absl::Status s = AllreduceHalf(half, op);
  if (s.ok()) {
    HalvesToFloats(half.data(), data->data(), half.size());
  }
  return std::make_shared<CompletedWork>(std::move(s));
}

absl::Status NcclProcessGroup::AllreduceHalf(std::span<Half> data, ReduceOp op) {
  if (size_ == 1) return Check("allreduce");
  if (data.empty()) return AllreduceDevice(nullptr, 0, DataType::kFloat16, op);  // compared
  return Staged(data.data(), data.size_bytes(), "allreduce", [&](void* dev) {
    return AllreduceDevice(dev, data.size(), DataType::kFloat16, op);
  });
}

absl::Status NcclProcessGroup::Broadcast(std::span<float> data, int root) {
  if (size_ == 1) return Check("broadcast");
  if (data.empty()) return BroadcastDevice(nullptr, 0, DataType::kFloat32, root);  // compared
  return Staged(data.data(), data.size_bytes(), "broadcast", [&](void* dev) {
    return BroadcastDevice(dev, data.size(), DataType::kFloat32, root);
  });
}

absl::Status NcclProcessGroup::Allgather(std::span<const float> input, std::span<float> output) {
  if (absl::Status s = CheckAllgatherSizes(input.size(), output.size(), size_); !s.ok()) {
    return s;
  }
  std::copy(input.begin(), input.end(), output.begin() + rank_ * input.size());
  if (size_ == 1) return Check("allgather");
  if (absl::Status s = Check("allgather"); !s.ok()) return s;
  const CollectiveCall call{CollectiveCall::kAllgather, input.size(), 0};
  if (input.empty()) return Agree(call, "allgather");
  // In place: rank r's input is the r-th slice of the output buffer.
  return Staged(output.data(), output.size_bytes(), "allgather", [&](void* d) -> absl::Status {
    if (absl::Status s = Agree(call, "allgather"); !s.ok()) return s;
    float* dev = static_cast<float*>(d);
    ncclResult_t r = ncclAllGather(dev + rank_ * input.size(), dev, input.size(), ncclFloat32,
                                   impl_->comm, impl_->stream);
    return Enqueued(r, "allgather");
  });
}

absl::Status NcclProcessGroup::Barrier() {
  float one = 1.0f;
  return Allreduce(std::span<float>(&one, 1), ReduceOp::kSum);
}

}  // namespace joule::worker
