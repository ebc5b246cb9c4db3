#include "worker/train/trainer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <zlib.h>

#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "worker/data/csv.h"
#include "worker/data/dataset.h"
#include "worker/data/prefetcher.h"
#include "worker/models/models.h"
#include "worker/train/checkpoint.h"
#include "worker/train/gradient_reducer.h"
#ifdef JOULE_WITH_NCCL
#include <torch/cuda.h>

#include "worker/comm/nccl_process_group.h"
#endif

namespace joule::worker {
namespace {

using Wall = std::chrono::steady_clock;

// Sets the intra-op threads of LibTorch and of the BLAS under it. Debian's LibTorch calls
// the system libblas.so.3; with OpenBLAS, whose thread pool ignores torch::set_num_threads,
// two workers on two cores would otherwise run four BLAS threads and thrash (measured here:
// mlp 9,400-13,000 samples/s with the default, 17,600 with OpenBLAS at one thread each).
void SetIntraOpThreads(int n) {
  torch::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(n);
  }
}

double SecondsSince(Wall::time_point t) {
  return std::chrono::duration<double>(Wall::now() - t).count();
}

// Number of scalar parameters of `model` (the length of the flat gradient buffer).
int64_t ParameterCount(Model& model) {
  int64_t n = 0;
  for (const auto& [name, p] : model.Parameters()) n += p.numel();
  return n;
}

// CRC-32 of the parameters and then the float buffers (BatchNorm statistics).
uint32_t ParameterHash(Model& model) {
  uLong crc = crc32(0L, Z_NULL, 0);
  NamedTensors all = model.Parameters();
  for (auto& b : model.Buffers()) all.push_back(std::move(b));
  for (const auto& [name, p] : all) {
    torch::Tensor c = p.detach().to(torch::kCPU).contiguous();
    crc = crc32(crc, reinterpret_cast<const Bytef*>(c.data_ptr<float>()),
                static_cast<uInt>(c.numel() * sizeof(float)));
  }
  return static_cast<uint32_t>(crc);
}

std::string HashText(uint32_t hash) { return absl::StrCat(absl::Hex(hash, absl::kZeroPad8)); }

struct EvalResult {
  double accuracy = 0;
  double loss = 0;
};

// Evaluates this rank's strided shard of `test` and allreduces (correct, loss sum, count).
absl::StatusOr<EvalResult> Evaluate(Model& model, const torch::Tensor& images,
                                    const torch::Tensor& labels, ProcessGroup& pg,
                                    const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model.SetTraining(false);
  const int64_t n = images.size(0);
  // Rank r takes examples r, r + size, ...: none when the split is smaller than the world
  // (torch::arange refuses a start past the end); its zeros still join the allreduce.
  torch::Tensor idx = pg.rank() < n ? torch::arange(pg.rank(), n, pg.size(), torch::kLong)
                                    : torch::empty({0}, torch::kLong);
  // Summed on the device, read once: no host synchronisation per chunk.
  torch::Tensor correct =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  torch::Tensor loss_sum = torch::zeros_like(correct);
  constexpr int64_t kChunk = 1000;
  for (int64_t begin = 0; begin < idx.size(0); begin += kChunk) {
    torch::Tensor b = idx.slice(0, begin, std::min(begin + kChunk, idx.size(0)));
    torch::Tensor x = images.index_select(0, b).to(device);
    torch::Tensor y = labels.index_select(0, b).to(device);
    torch::Tensor logits = model.Forward(x);
    correct += logits.argmax(1).eq(y).sum();
    loss_sum += torch::nn::functional::cross_entropy(
        logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
  model.SetTraining(true);
  float sums[3] = {static_cast<float>(correct.item<double>()),
                   static_cast<float>(loss_sum.item<double>()),
                   static_cast<float>(idx.size(0))};
  if (absl::Status s = pg.AllreduceSum(std::span<float>(sums, 3)); !s.ok()) return s;
  if (sums[2] == 0) return EvalResult{};
  return EvalResult{sums[0] / sums[2], sums[1] / sums[2]};
}

// "world=2 input=1x28x28 classes=10 | train=60000 test=10000 | 1.weight:512x784:Float | ...
// | buffer bn1.running_mean:64:Float | ..." (the data's shape and size, then the names,
// shapes and dtypes of the parameters and of the float buffers).
std::string Fingerprint(Model& model, const InputShape& shape, int world,
                        int64_t train_size, int64_t test_size) {
  std::string out = absl::StrCat("world=", world, " input=", shape.channels, "x", shape.height,
                                 "x", shape.width, " classes=", shape.classes, " | train=",
                                 train_size, " test=", test_size);
  auto append = [&](const char* kind, const NamedTensors& tensors) {
    for (const auto& [name, t] : tensors) {
      absl::StrAppend(&out, " | ", kind, name, ":");
      const auto sizes = t.sizes();
      for (size_t i = 0; i < sizes.size(); ++i) absl::StrAppend(&out, i ? "x" : "", sizes[i]);
      absl::StrAppend(&out, ":", std::string(c10::toString(t.scalar_type())));
    }
  };
  append("", model.Parameters());
  // The buffers that are averaged and hashed (BatchNorm statistics) must line up too.
  append("buffer ", model.Buffers());
  return out;
}

// The first " | "-separated field where two fingerprints differ, as "a vs b".
std::string FirstDifference(const std::string& a, const std::string& b) {
  std::vector<std::string> fa = absl::StrSplit(a, " | "), fb = absl::StrSplit(b, " | ");
  for (size_t i = 0; i < std::max(fa.size(), fb.size()); ++i) {
    const std::string x = i < fa.size() ? fa[i] : "(nothing)";
    const std::string y = i < fb.size() ? fb[i] : "(nothing)";
    if (x != y) return absl::StrCat(y, " where rank 0 has ", x);
  }
  return "identical";
}

void Pack(const std::vector<torch::Tensor>& tensors, torch::Tensor& flat) {
  int64_t off = 0;
  for (const auto& t : tensors) {
    flat.narrow(0, off, t.numel()).copy_(t.reshape(-1));
    off += t.numel();
  }
}

void Unpack(const torch::Tensor& flat, std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  int64_t off = 0;
  for (auto& t : tensors) {
    t.view(-1).copy_(flat.narrow(0, off, t.numel()));
    off += t.numel();
  }
}

void AddTensor(v1::TensorData* out, const std::string& name, const torch::Tensor& t) {
  out->set_name(name);
  for (int64_t d : t.sizes()) out->add_shape(d);
  torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  out->mutable_values()->Add(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// Copies a checkpoint's tensors into `params` and `buffers`, checking names and sizes.
absl::Status Restore(const v1::Checkpoint& c, const std::vector<std::string>& names,
                     std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& buffers) {
  if (c.parameters_size() != static_cast<int>(params.size()) ||
      (c.momentum_size() != 0 && c.momentum_size() != static_cast<int>(params.size()))) {
    return absl::DataLossError(absl::StrCat("checkpoint holds ", c.parameters_size(),
                                            " parameters, the model has ", params.size()));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    for (auto [src, dst] : {std::pair{&c.parameters(i), &params[i]},
                            std::pair{c.momentum_size() ? &c.momentum(i) : nullptr, &buffers[i]}}) {
      if (src == nullptr) continue;
      if (src->name() != names[i] || src->values_size() != dst->numel()) {
        return absl::DataLossError(absl::StrCat("checkpoint tensor ", src->name(), " (",
                                                src->values_size(), " values) does not fit ",
                                                names[i], " (", dst->numel(), ")"));
      }
      dst->copy_(torch::from_blob(const_cast<float*>(src->values().data()), dst->sizes(),
                                  torch::kFloat32));
    }
  }
  return absl::OkStatus();
}

// Broadcasts rank 0's values (average = false) or averages over ranks (average = true)
// the float tensors `ts` in place, through one flat buffer.
absl::Status SyncTensors(ProcessGroup& pg, std::vector<torch::Tensor>& ts, bool average) {
  if (ts.empty() || pg.size() == 1) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<float> flat;
  for (const auto& t : ts) {
    torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    flat.insert(flat.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  absl::Status s = average ? pg.Allreduce(flat, ReduceOp::kAverage) : pg.Broadcast(flat, 0);
  if (!s.ok()) return s;
  size_t off = 0;
  for (auto& t : ts) {
    t.copy_(torch::from_blob(flat.data() + off, t.sizes(), torch::kFloat32));
    off += static_cast<size_t>(t.numel());
  }
  return absl::OkStatus();
}

// Copies a checkpoint's model statistics into `stats`, checking names and sizes.
absl::Status RestoreStatistics(const v1::Checkpoint& c, const std::vector<std::string>& names,
                               std::vector<torch::Tensor>& stats) {
  if (c.statistics_size() == 0) return absl::OkStatus();
  if (c.statistics_size() != static_cast<int>(stats.size())) {
    return absl::DataLossError(absl::StrCat("checkpoint holds ", c.statistics_size(),
                                            " statistics tensors, the model has ", stats.size()));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < stats.size(); ++i) {
    const v1::TensorData& src = c.statistics(static_cast<int>(i));
    if (src.name() != names[i] || src.values_size() != stats[i].numel()) {
      return absl::DataLossError(absl::StrCat("checkpoint statistics ", src.name(), " (",
                                              src.values_size(), " values) do not fit ",
                                              names[i], " (", stats[i].numel(), ")"));
    }
    stats[i].copy_(torch::from_blob(const_cast<float*>(src.values().data()), stats[i].sizes(),
                                    torch::kFloat32));
  }
  return absl::OkStatus();
}

// The loop of SgdStep, instantiated per case so that each variant has no branch inside
// and the compiler vectorises it. Not inlined: GCC drops the __restrict promises when it
// inlines, and then keeps the loop scalar (seen: 14% of an mlp step).
template <bool kDecay, bool kMomentum, bool kStarted>
__attribute__((noinline)) void SgdKernel(float* __restrict p, float* __restrict g, float* __restrict b, int64_t n,
               float lr, float m, float wd) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if constexpr (kDecay) d = d + wd * p[i];
    if constexpr (kMomentum) {
      if constexpr (kStarted) {
        d = b[i] * m + d;
      }
      b[i] = d;
    }
    p[i] = p[i] + (-lr) * d;
    g[i] = 0.0f;
  }
}

void SgdLoop(float* p, float* g, float* b, int64_t n, float lr, float m, float wd,
             bool started) {
  const bool decay = wd != 0, mom = m != 0;
  if (decay) {
    if (!mom) return SgdKernel<true, false, false>(p, g, b, n, lr, m, wd);
    if (started) return SgdKernel<true, true, true>(p, g, b, n, lr, m, wd);
    return SgdKernel<true, true, false>(p, g, b, n, lr, m, wd);
  }
  if (!mom) return SgdKernel<false, false, false>(p, g, b, n, lr, m, wd);
  if (started) return SgdKernel<false, true, true>(p, g, b, n, lr, m, wd);
  return SgdKernel<false, true, false>(p, g, b, n, lr, m, wd);
}

// One parameter's torch.optim.SGD update (dampening 0, no Nesterov; PyTorch's rule):
//   d = g + wd p;  b = m b + d (b = d on the first step);  p -= lr (m != 0 ? b : d)
// and then g = 0, ready for the next step's accumulation. A single pass over p, g and b
// when all are contiguous float32 (one read-modify-write instead of four tensor ops), the
// same arithmetic in the same order as the tensor version it falls back to. An undefined
// g (the parameter got no gradient) counts as zero.
void SgdStep(torch::Tensor& p, torch::Tensor& g, torch::Tensor& b, double lr, double momentum,
             double weight_decay, bool started) {
  if (!g.defined()) g = torch::zeros_like(p);
  const float flr = static_cast<float>(lr), fm = static_cast<float>(momentum),
              fwd = static_cast<float>(weight_decay);
  if (p.is_cpu() && p.is_contiguous() && g.is_contiguous() && b.is_contiguous() &&
      p.scalar_type() == torch::kFloat32 && g.scalar_type() == torch::kFloat32 &&
      b.scalar_type() == torch::kFloat32) {
    SgdLoop(p.data_ptr<float>(), g.data_ptr<float>(), b.data_ptr<float>(), p.numel(), flr, fm,
            fwd, started);
    return;
  }
  torch::Tensor d = g;
  if (weight_decay != 0) d = d.add(p, weight_decay);
  if (momentum != 0) {
    if (started) {
      b.mul_(momentum).add_(d);
    } else {
      b.copy_(d);
    }
    d = b;
  }
  p.add_(d, -lr);
  g.zero_();
}

// Averages the gradients of CUDA parameters over ranks with one NCCL allreduce of a flat
// device buffer. (The CPU path overlaps buckets with backward: GradientReducer.)
absl::Status AllreduceDeviceGradients(ProcessGroup& pg, std::vector<torch::Tensor>& params) {
#ifdef JOULE_WITH_NCCL
  auto* nccl = dynamic_cast<NcclProcessGroup*>(&pg);
  if (nccl == nullptr) return absl::FailedPreconditionError("CUDA gradients need NCCL");
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad().reshape(-1));
  }
  torch::Tensor flat = torch::cat(grads);
  // NCCL runs on its own stream: the gradients must be complete first.
  torch::cuda::synchronize(nccl->device());
  if (absl::Status s = nccl->AllreduceDevice(flat.data_ptr(), static_cast<size_t>(flat.numel()),
                                             DataType::kFloat32, ReduceOp::kAverage);
      !s.ok()) {
    return s;
  }
  int64_t off = 0;
  for (auto& p : params) {
    p.mutable_grad().view(-1).copy_(flat.narrow(0, off, p.numel()));
    off += p.numel();
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("built without NCCL");
#endif
}

torch::Tensor ImagesTensor(ImageDataset& d) {
  return torch::from_blob(d.images.data(), {d.size, d.channels, d.height, d.width},
                          torch::kFloat32);
}
torch::Tensor LabelsTensor(ImageDataset& d) {
  return torch::from_blob(d.labels.data(), {d.size}, torch::kLong);
}

v1::RankResult Train(const v1::Assignment& a, const TrainerOptions& options,
                     const TrainHooks& hooks) {
  const auto wall_start = Wall::now();
  const v1::JobSpec& spec = a.spec();
  const int rank = a.rank(), world = a.world_size();
  v1::RankResult result;
  result.set_rank(rank);
  auto fail = [&](const absl::Status& s) {
    result.set_ok(false);
    result.set_error(std::string(s.message()));
    result.set_error_code(static_cast<int32_t>(s.code()));
    result.set_wall_seconds(SecondsSince(wall_start));
    return result;
  };

  SetIntraOpThreads(spec.intra_op_threads() > 0 ? spec.intra_op_threads()
                                                : std::max(1, options.default_threads));
  ScopedPhase loading(hooks.phases, Phase::kData);
  // Files the job names are opened beneath the allowed roots, by the kernel (openat2).
  const FileOpener open = MakeFileOpener(options.allowed_roots);
  std::string dir;
  if (absl::Status s = ResolveDataset(spec.dataset(), options.data_root, &dir); !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<ImageDataset> train, test;
  if (dir.empty()) {  // synthetic
    absl::StatusOr<SyntheticSpec> syn = ParseSynthetic(spec.dataset());
    if (!syn.ok()) return fail(syn.status());
    train = MakeSyntheticDataset(*syn, Split::kTrain);
    test = MakeSyntheticDataset(*syn, Split::kTest);
  } else if (absl::StartsWith(spec.dataset(), "csv:")) {
    auto both = LoadCsvDataset(dir, spec.max_train_samples(), spec.max_test_samples(),
                               CsvLimits{}, open);
    if (!both.ok()) return fail(both.status());
    train = std::move(both->first);
    test = std::move(both->second);
  } else {
    // Named datasets ("fashion-mnist") lie under the worker's own data root.
    const FileOpener& idx_open = absl::StartsWith(spec.dataset(), "idx:") ? open : OpenPlain;
    train = LoadIdxDataset(dir, Split::kTrain, spec.max_train_samples(), idx_open);
    if (!train.ok()) return fail(train.status());
    test = LoadIdxDataset(dir, Split::kTest, spec.max_test_samples(), idx_open);
  }
  if (!test.ok()) return fail(test.status());
  KeepStratifiedFraction(*train, spec.dataset_fraction());
  if (test->height != train->height || test->width != train->width) {
    return fail(absl::DataLossError(absl::StrCat(dir, ": test images are ", test->height, "x",
                                                 test->width, ", train images ", train->height,
                                                 "x", train->width)));
  }
  const int64_t gbs = spec.global_batch_size();
  // The coordinator normalises specs (common/job_spec); a worker still refuses batch sizes
  // that do not tile, which would otherwise index past its share of a step.
  const int64_t micro_per_step = std::max(1, spec.accumulation_steps());
  if (world < 1 || spec.local_batch_size() <= 0 ||
      gbs != int64_t{world} * spec.local_batch_size() * micro_per_step) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "global_batch_size ", gbs, " is not workers ", world, " x local_batch_size ",
        spec.local_batch_size(), " x accumulation_steps ", micro_per_step)));
  }
  if (train->size < gbs) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "the training split has ", train->size, " examples, fewer than one global batch (",
        gbs, ")")));
  }

  absl::StatusOr<std::shared_ptr<ProcessGroup>> pg_or;
  {
    ScopedPhase rendezvous(hooks.phases, Phase::kCommunication);
    pg_or = hooks.connect();
  }
  if (!pg_or.ok()) return fail(pg_or.status());
  std::shared_ptr<ProcessGroup> pg_holder = *std::move(pg_or);
  ProcessGroup& pg = *pg_holder;

  std::vector<int> hidden(spec.hidden_sizes().begin(), spec.hidden_sizes().end());
  InputShape shape{train->channels, train->height, train->width,
                   std::max(train->classes, test->classes)};
  absl::StatusOr<std::unique_ptr<Model>> model_or;
  {
    // LibTorch's default generator is process-wide: ranks run as threads of one process
    // (tests, benchmarks) must not interleave their seeded initialisations.
    static std::mutex init_mu;
    std::lock_guard<std::mutex> lock(init_mu);
    torch::manual_seed(spec.seed());
    model_or = BuildModel(spec.model(), hidden, shape, open);
  }
  if (!model_or.ok()) return fail(model_or.status());
  std::unique_ptr<Model> model_holder = *std::move(model_or);
  Model& model = *model_holder;

  // Device: the CPU, or for device_kind GPU the CUDA device of the NCCL group (one GPU per
  // rank, chosen by local rank when the group was built).
  torch::Device device(torch::kCPU);
#ifdef JOULE_WITH_NCCL
  auto* nccl = dynamic_cast<NcclProcessGroup*>(&pg);
#endif
  if (spec.device_kind() == v1::DEVICE_KIND_GPU) {
#ifdef JOULE_WITH_NCCL
    if (!torch::cuda::is_available()) {
      return fail(absl::FailedPreconditionError(
          "GPU job on a worker whose LibTorch has no CUDA (Debian's libtorch-dev is CPU-only; "
          "see README, GPU builds)"));
    }
    if (nccl == nullptr) {
      return fail(absl::FailedPreconditionError("GPU training needs the NCCL process group"));
    }
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(nccl->device()));
    model.To(device);
#else
    return fail(absl::FailedPreconditionError(
        "GPU job on a worker built without CUDA and NCCL (see README, GPU builds)"));
#endif
  }

  // Every rank must build the same model from the same data shape, or the flat buffers
  // would not line up: compare fingerprints before the first collective on them.
  if (hooks.allgather) {
    ScopedPhase comm(hooks.phases, Phase::kCommunication);
    const std::string mine = Fingerprint(model, shape, world, train->size, test->size);
    absl::StatusOr<std::vector<std::string>> all = hooks.allgather(mine);
    if (!all.ok()) return fail(all.status());
    for (int r = 0; r < static_cast<int>(all->size()); ++r) {
      if ((*all)[r] != (*all)[0]) {
        return fail(absl::FailedPreconditionError(absl::StrCat(
            "rank ", r, " differs from rank 0: ", FirstDifference((*all)[0], (*all)[r]))));
      }
    }
  }

  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (auto& [name, p] : model.Parameters()) {
    names.push_back(name);
    params.push_back(p);
  }
  // BatchNorm running statistics: not trained by gradients, so each rank's drift with its
  // own batches; they start as rank 0's and are averaged before every evaluation and
  // checkpoint (PyTorch DDP instead broadcasts rank 0's before every forward).
  std::vector<torch::Tensor> stats;
  std::vector<std::string> stat_names;
  for (auto& [name, b] : model.Buffers()) {
    stat_names.push_back(name);
    stats.push_back(b);
  }
  const int64_t total = ParameterCount(model);
  torch::Tensor flat = torch::zeros({total}, torch::kFloat32);
  std::span<float> flat_span(flat.data_ptr<float>(), static_cast<size_t>(total));
  const double lr = spec.optimizer().lr(), momentum = spec.optimizer().momentum();
  const double weight_decay = spec.optimizer().weight_decay();
  std::vector<torch::Tensor> buffers;  // SGD momentum, one per parameter
  for (const auto& p : params) buffers.push_back(torch::zeros_like(p));
  bool buffers_started = false;        // PyTorch starts b = d on the first step

  // Resume from the job's newest valid checkpoint, if any. Only rank 0 reads it (the
  // others may not see the same files: no shared storage, or a deposed writer still
  // renaming); it broadcasts where to resume, then the tensors below.
  const std::string ckpt_dir =
      options.checkpoint_root.empty()
          ? ""
          : absl::StrCat(options.checkpoint_root, "/job-", a.job_id(),
                         a.job_uid().empty() ? "" : "-" + a.job_uid());
  const uint64_t spec_hash = SpecHash(spec);
  int start_epoch = 0;
  int64_t start_step_in_epoch = 0, step = 0;
  double resumed_accuracy = -1;
  {
    // found, next_epoch, next_step (24-bit halves), global_step (halves), has_momentum,
    // accuracy: exact in float32.
    std::vector<float> header(8, 0.0f);
    if (rank == 0 && !ckpt_dir.empty()) {
      std::vector<std::string> skipped;
      absl::StatusOr<v1::Checkpoint> ckpt = LoadNewestCheckpoint(ckpt_dir, spec_hash, &skipped);
      for (const std::string& why : skipped) {
        spdlog::warn("job {}: skipping {}", a.job_id(), why);
      }
      if (ckpt.ok()) {
        if (absl::Status s = Restore(*ckpt, names, params, buffers); !s.ok()) return fail(s);
        if (absl::Status s = RestoreStatistics(*ckpt, stat_names, stats); !s.ok()) return fail(s);
        header = {1.0f,
                  static_cast<float>(ckpt->next_epoch()),
                  static_cast<float>(ckpt->next_step_in_epoch() & 0xFFFFFF),
                  static_cast<float>(ckpt->next_step_in_epoch() >> 24),
                  static_cast<float>(ckpt->global_step() & 0xFFFFFF),
                  static_cast<float>(ckpt->global_step() >> 24),
                  ckpt->momentum_size() > 0 ? 1.0f : 0.0f,
                  static_cast<float>(ckpt->test_accuracy())};
      }
    }
    ScopedPhase comm(hooks.phases, Phase::kCommunication);
    if (absl::Status s = pg.Broadcast(header, 0); !s.ok()) return fail(s);
    if (header[0] == 1.0f) {
      start_epoch = static_cast<int>(header[1]);
      start_step_in_epoch = static_cast<int64_t>(header[2]) + (static_cast<int64_t>(header[3]) << 24);
      step = static_cast<int64_t>(header[4]) + (static_cast<int64_t>(header[5]) << 24);
      buffers_started = header[6] == 1.0f;
      resumed_accuracy = header[7];
      result.set_resumed_from_step(step);
      result.set_test_accuracy(resumed_accuracy);
      if (rank == 0) {
        spdlog::info("job {}: resuming from the checkpoint at step {} (epoch {}, step {})",
                     a.job_id(), step, start_epoch + 1, start_step_in_epoch);
      }
    }
  }

  // Every rank starts from rank 0's parameters (and momentum).
  {
    ScopedPhase comm(hooks.phases, Phase::kCommunication);
    for (std::vector<torch::Tensor>* group : {&params, &buffers}) {
      torch::NoGradGuard no_grad;
      Pack(*group, flat);
      const auto t0 = Wall::now();
      if (absl::Status s = pg.Broadcast(flat_span, 0); !s.ok()) return fail(s);
      if (hooks.on_collective) {
        hooks.on_collective("broadcast", total * static_cast<int64_t>(sizeof(float)),
                            SecondsSince(t0));
      }
      Unpack(flat, *group);
    }
  }

  {
    ScopedPhase comm(hooks.phases, Phase::kCommunication);
    if (absl::Status s = SyncTensors(pg, stats, /*average=*/false); !s.ok()) return fail(s);
  }

  torch::Tensor train_x = ImagesTensor(*train), train_y = LabelsTensor(*train);
  torch::Tensor test_x = ImagesTensor(*test), test_y = LabelsTensor(*test);
  EpochSharder sharder(train->size, gbs, rank, world, spec.seed());
  // The next kPrefetchDepth steps' examples are gathered off the training thread.
  constexpr int64_t kPrefetchDepth = 2;
  BatchPrefetcher prefetch(train_x, train_y);
  const int64_t steps_per_epoch = sharder.steps_per_epoch();
  const float inv_world = 1.0f / static_cast<float>(world);
  // Gradients are averaged in buckets overlapped with backward (see GradientReducer).
  std::unique_ptr<GradientReducer> reducer;
  if (world > 1 && device.is_cpu()) {
    const int64_t cap =
        spec.sync().bucket_bytes() > 0 ? spec.sync().bucket_bytes() : kDefaultBucketBytes;
    reducer = std::make_unique<GradientReducer>(params, cap, pg);
    reducer->set_phases(hooks.phases);
    if (spec.sync().fp16_compression()) reducer->set_wire_precision(Precision::kFloat16);
  }
  const int64_t micro_batches = std::max(1, spec.accumulation_steps());
  const int64_t micro_size = spec.local_batch_size();
  // Goyal et al. 2017: lr = base x GBS / 256, ramped linearly from base over the warm-up.
  const double base_lr = lr;
  const double target_lr = spec.lr_scaling() == "linear" ? base_lr * gbs / 256.0 : base_lr;
  const double warmup_steps_lr = spec.lr_warmup_epochs() * steps_per_epoch;
  auto lr_at = [&](int64_t global_step) {
    if (warmup_steps_lr <= 0 || global_step >= warmup_steps_lr) return target_lr;
    return base_lr + (target_lr - base_lr) * (global_step / warmup_steps_lr);
  };
  const bool local_sgd = spec.sync().strategy() == v1::SYNC_STRATEGY_LOCAL_SGD && world > 1;
  const int64_t period = std::max(1, spec.sync().period());
  const int64_t warmup = spec.sync().warmup_steps();

  // Local SGD: every rank's parameters (and momentum, if asked) become their average.
  auto average_parameters = [&]() -> absl::Status {
    ScopedPhase comm(hooks.phases, Phase::kCommunication);
    torch::NoGradGuard no_grad;
    for (std::vector<torch::Tensor>* group : {&params, &buffers}) {
      if (group == &buffers && !(spec.sync().average_momentum() && buffers_started)) continue;
      Pack(*group, flat);
      const auto t0 = Wall::now();
      if (absl::Status s = pg.AllreduceSum(flat_span); !s.ok()) return s;
      if (hooks.on_collective) {
        hooks.on_collective("average", total * static_cast<int64_t>(sizeof(float)),
                            SecondsSince(t0));
      }
      flat.mul_(inv_world);
      Unpack(flat, *group);
    }
    return absl::OkStatus();
  };

  v1::JobProgress progress;
  progress.set_steps_per_epoch(steps_per_epoch);
  progress.set_test_accuracy(resumed_accuracy);
  double train_seconds = 0;
  const int64_t first_step = step;
  double window_loss = 0;
  int64_t window_steps = 0;
  auto last_report = Wall::now();
  int64_t samples_at_report = step * gbs;
  double train_seconds_at_report = 0;

  // `trained` = seconds spent in the training loop so far (evaluation excluded).
  auto report = [&](bool force, double trained) {
    if (!hooks.on_progress) return;
    double since = SecondsSince(last_report);
    if (!force && since < options.progress_period_seconds) return;
    progress.set_step(step);
    progress.set_samples(step * gbs);
    if (window_steps > 0) progress.set_loss(window_loss / window_steps);
    double dt = trained - train_seconds_at_report;
    if (dt > 0) progress.set_samples_per_second((step * gbs - samples_at_report) / dt);
    progress.set_elapsed_seconds(SecondsSince(wall_start));
    hooks.on_progress(progress);
    last_report = Wall::now();
    samples_at_report = step * gbs;
    train_seconds_at_report = trained;
    window_loss = 0;
    window_steps = 0;
  };

  // Rank 0 saves; the others go on (they wait for it at the next collective).
  // `checkpoint_stats`: the model statistics to save (the ranks' average).
  auto checkpoint = [&](int next_epoch, int64_t next_step_in_epoch,
                        const std::vector<torch::Tensor>& checkpoint_stats) -> absl::Status {
    if (rank != 0 || ckpt_dir.empty()) return absl::OkStatus();
    ScopedPhase save(hooks.phases, Phase::kCheckpoint);
    v1::Checkpoint c;
    c.set_format_version(1);
    c.set_spec_hash(spec_hash);
    c.set_job_id(a.job_id());
    c.set_attempt(a.attempt());
    c.set_next_epoch(next_epoch);
    c.set_next_step_in_epoch(next_step_in_epoch);
    c.set_global_step(step);
    c.set_test_accuracy(progress.test_accuracy());
    c.set_test_loss(progress.test_loss());
    for (size_t i = 0; i < params.size(); ++i) {
      AddTensor(c.add_parameters(), names[i], params[i]);
      if (buffers_started) AddTensor(c.add_momentum(), names[i], buffers[i]);
    }
    for (size_t i = 0; i < checkpoint_stats.size(); ++i) {
      AddTensor(c.add_statistics(), stat_names[i], checkpoint_stats[i]);
    }
    return WriteCheckpoint(ckpt_dir, c, spec.keep_checkpoints());
  };

  bool checkpoint_due = false;  // a step checkpoint is due at the next equal-ranks step
  for (int epoch = start_epoch; epoch < spec.epochs(); ++epoch) {
    progress.set_epoch(epoch + 1);
    sharder.StartEpoch(epoch);
    const int64_t first_step_in_epoch = epoch == start_epoch ? start_step_in_epoch : 0;
    prefetch.Clear();
    for (int64_t k = first_step_in_epoch;
         k < std::min(first_step_in_epoch + kPrefetchDepth, steps_per_epoch); ++k) {
      prefetch.Submit(sharder.Batch(k));
    }
    const auto epoch_start = Wall::now();
    for (int64_t s = first_step_in_epoch; s < steps_per_epoch; ++s) {
      if (hooks.cancelled && hooks.cancelled()) {
        result.set_cancelled(true);
        return fail(absl::CancelledError("cancelled"));
      }
      const auto step_start = Wall::now();
      if (hooks.phases) hooks.phases->Enter(Phase::kData);
      auto [batch_x, batch_y] = prefetch.Next();
      if (s + kPrefetchDepth < steps_per_epoch) prefetch.Submit(sharder.Batch(s + kPrefetchDepth));
      // Gradients are zero here: SgdStep clears them (they may be undefined before the
      // first backward).
      // Post-local SGD (Lin et al., ICLR 2020): gradients are averaged for the first
      // `warmup` steps, then each rank steps alone and parameters are averaged every
      // `period` steps.
      const bool sync_gradients = !local_sgd || step < warmup;
      const double lr_now = lr_at(step);
      // Gradient accumulation: the rank's share in micro-batches, each loss scaled so the
      // gradient is the mean over the share.
      // On the training device: LibTorch refuses to add a CUDA scalar into a CPU tensor.
      torch::Tensor loss_sum =
          torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
      for (int64_t m = 0; m < micro_batches; ++m) {
        if (hooks.phases) hooks.phases->Enter(Phase::kData);
        torch::Tensor x = batch_x.narrow(0, m * micro_size, micro_size).to(device);
        torch::Tensor y = batch_y.narrow(0, m * micro_size, micro_size).to(device);
        if (hooks.phases) hooks.phases->Enter(Phase::kForward);
        torch::Tensor micro_loss = torch::nn::functional::cross_entropy(model.Forward(x), y);
        if (micro_batches > 1) micro_loss = micro_loss / static_cast<double>(micro_batches);
        if (hooks.phases) hooks.phases->Enter(Phase::kBackward);
        // The last micro-batch's backward reduces buckets as they fill.
        if (reducer && sync_gradients && m + 1 == micro_batches) reducer->Prepare();
        micro_loss.backward();
        loss_sum += micro_loss.detach();
      }
      torch::Tensor loss = loss_sum;
      if (world > 1 && sync_gradients && !device.is_cpu()) {
        // GPU: one flat allreduce of all gradients on the device, after backward.
        if (hooks.phases) hooks.phases->Enter(Phase::kCommunication);
        const auto t0 = Wall::now();
        if (absl::Status st = AllreduceDeviceGradients(pg, params); !st.ok()) return fail(st);
        if (hooks.on_collective) {
          hooks.on_collective("allreduce", total * static_cast<int64_t>(sizeof(float)),
                              SecondsSince(t0));
        }
      }
      if (reducer && sync_gradients) {
        if (hooks.phases) hooks.phases->Enter(Phase::kCommunication);
        const auto t0 = Wall::now();
        if (absl::Status st = reducer->Finish(); !st.ok()) return fail(st);
        if (hooks.on_collective) {
          hooks.on_collective("allreduce", reducer->total_bytes(), SecondsSince(t0));
        }
      }
      if (hooks.phases) hooks.phases->Enter(Phase::kOptimizer);
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i) {
          SgdStep(params[i], params[i].mutable_grad(), buffers[i], lr_now, momentum,
                  weight_decay, buffers_started);
        }
        if (momentum != 0) buffers_started = true;
      }
      // One host synchronisation per step on a GPU (the loss and the step time reported
      // to on_step need the step to have finished; NCCL's allreduce waits anyway).
      const double step_loss = loss.item<double>();
      ++step;
      // Whether every rank now holds the same parameters (and, but for local SGD without
      // average_momentum, the same momentum).
      bool ranks_equal = sync_gradients;
      if (!sync_gradients && (step - warmup) % period == 0) {
        if (absl::Status st = average_parameters(); !st.ok()) return fail(st);
        ranks_equal = true;
      }
      if (hooks.on_step) hooks.on_step(sharder.local_batch(), SecondsSince(step_start), step_loss);
      window_loss += step_loss;
      ++window_steps;
      report(false, train_seconds + SecondsSince(epoch_start));
      if (spec.checkpoint_every_steps() > 0 && step % spec.checkpoint_every_steps() == 0) {
        checkpoint_due = true;
      }
      // Under local SGD the ranks differ between averagings: a due checkpoint waits for
      // the next one, so that taking it changes nothing (averaging early would).
      if (checkpoint_due && ranks_equal && s + 1 < steps_per_epoch) {
        checkpoint_due = false;
        // The statistics are averaged into copies: the model's own go on as without
        // checkpoints.
        std::vector<torch::Tensor> averaged_stats;
        for (const auto& t : stats) averaged_stats.push_back(t.detach().clone());
        if (absl::Status st = SyncTensors(pg, averaged_stats, /*average=*/true); !st.ok()) {
          return fail(st);
        }
        if (absl::Status st = checkpoint(epoch, s + 1, averaged_stats); !st.ok()) {
          spdlog::warn("job {}: checkpoint at step {} failed: {}", a.job_id(), step,
                       st.ToString());
        }
      }
    }
    train_seconds += SecondsSince(epoch_start);
    // Evaluate (and end) with the same parameters on every rank.
    if (local_sgd) {
      if (absl::Status st = average_parameters(); !st.ok()) return fail(st);
    }
    if (hooks.phases) hooks.phases->Enter(Phase::kEvaluation);
    if (absl::Status st = SyncTensors(pg, stats, /*average=*/true); !st.ok()) return fail(st);
    absl::StatusOr<EvalResult> eval = Evaluate(model, test_x, test_y, pg, device);
    if (!eval.ok()) return fail(eval.status());
    progress.set_test_accuracy(eval->accuracy);
    progress.set_test_loss(eval->loss);
    result.set_test_accuracy(eval->accuracy);
    result.set_test_loss(eval->loss);
    if (rank == 0) {
      spdlog::info("job {} rank {}: epoch {}/{} test accuracy {:.4f} loss {:.4f}", a.job_id(),
                   rank, epoch + 1, spec.epochs(), eval->accuracy, eval->loss);
    }
    const bool every_epochs = spec.checkpoint_every_epochs() > 0 &&
                              (epoch + 1) % spec.checkpoint_every_epochs() == 0;
    const bool every_steps_crossed = spec.checkpoint_every_steps() > 0;
    if ((every_epochs || every_steps_crossed) && epoch + 1 < spec.epochs()) {
      if (absl::Status st = checkpoint(epoch + 1, 0, stats); !st.ok()) {
        spdlog::warn("job {}: checkpoint after epoch {} failed: {}", a.job_id(), epoch + 1,
                     st.ToString());
      }
    }
    checkpoint_due = false;  // the epoch's end is a checkpoint (or the job's end)
    report(true, train_seconds);
  }
  if (hooks.phases) hooks.phases->Enter(Phase::kIdle);
  const uint32_t hash = ParameterHash(model);
  {
    ScopedPhase comm(hooks.phases, Phase::kCommunication);
    if (absl::Status s = CompareParameterHashes(pg, hash); !s.ok()) return fail(s);
  }
  if (hooks.phases) hooks.phases->Enter(Phase::kIdle);
  result.set_ok(true);
  result.set_parameter_hash(HashText(hash));
  result.set_steps(step);
  result.set_samples((step - first_step) * sharder.local_batch());
  result.set_train_seconds(train_seconds);
  result.set_wall_seconds(SecondsSince(wall_start));
  return result;
}

}  // namespace

absl::Status CompareParameterHashes(ProcessGroup& pg, uint32_t hash) {
  // 16-bit halves: exact in float32.
  const float mine[2] = {static_cast<float>(hash >> 16), static_cast<float>(hash & 0xFFFF)};
  std::vector<float> all(2 * static_cast<size_t>(pg.size()));
  if (absl::Status s = pg.Allgather(mine, all); !s.ok()) return s;
  std::vector<uint32_t> hashes(pg.size());
  for (int r = 0; r < pg.size(); ++r) {
    hashes[r] = (static_cast<uint32_t>(all[2 * r]) << 16) | static_cast<uint32_t>(all[2 * r + 1]);
  }
  std::string differ;
  for (int r = 1; r < pg.size(); ++r) {
    if (hashes[r] != hashes[0]) {
      absl::StrAppend(&differ, differ.empty() ? "" : ", ", "rank ", r, " has ",
                      HashText(hashes[r]));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("the ranks ended training with different parameters: rank 0 has hash ",
                   HashText(hashes[0]), ", ", differ));
}

v1::RankResult RunTraining(const v1::Assignment& assignment, const TrainerOptions& options,
                           const TrainHooks& hooks) {
  v1::RankResult r;
  r.set_rank(assignment.rank());
  r.set_ok(false);
  auto failed = [&](absl::StatusCode code, const std::string& why) {
    r.set_error(why);
    r.set_error_code(static_cast<int32_t>(code));
    return r;
  };
  try {
    return Train(assignment, options, hooks);
  } catch (const std::bad_alloc&) {
    return failed(absl::StatusCode::kResourceExhausted,
                  "out of memory: the model or the data does not fit on this worker");
  } catch (const std::exception& e) {
    // One line, without LibTorch's backtrace. An allocation that failed is not worth
    // another attempt: the next one would need the same memory.
    const std::string line = ErrorLine(e);
    if (absl::StrContains(line, "can't allocate memory") ||
        absl::StrContains(line, "out of memory")) {
      return failed(absl::StatusCode::kResourceExhausted, absl::StrCat("out of memory: ", line));
    }
    return failed(absl::StatusCode::kInternal, absl::StrCat("training failed: ", line));
  } catch (...) {
    return failed(absl::StatusCode::kInternal, "training failed: an unknown exception");
  }
}

}  // namespace joule::worker
