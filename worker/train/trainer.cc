#include "worker/train/trainer.h"

#include <dlfcn.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "worker/data/dataset.h"
#include "worker/data/staging.h"
#include "worker/models/models.h"
#include "worker/train/attempt_context.h"
#include "worker/train/checkpoint.h"
#include "worker/train/checkpoint_assembly.h"
#include "worker/train/ga.h"
#include "worker/train/model_state.h"
#include "worker/train/regression_loss.h"
#include "worker/train/sgd_loop.h"
#include "worker/train/splits.h"

namespace joule::worker {
namespace {

// The gang's process group, built by the rendezvous hook; CANCELLED without connecting
// when the attempt was cancelled while its data loaded (its rendezvous may be gone).
absl::StatusOr<std::shared_ptr<ProcessGroup>> Connect(const TrainHooks& hooks) {
  if (hooks.cancelled && hooks.cancelled()) {
    return absl::CancelledError("cancelled before the ranks connected");
  }
  ScopedPhase rendezvous(hooks.phases, Phase::kCommunication);
  return hooks.connect();
}

// The spec's model, freshly initialised from spec.seed.
absl::StatusOr<std::unique_ptr<Model>> BuildSeededModel(const v1::JobSpec& spec,
                                                        const InputShape& shape,
                                                        const FileOpener& open,
                                                        const RegressionShape* regression) {
  std::vector<int> hidden(spec.hidden_sizes().begin(), spec.hidden_sizes().end());
  // LibTorch's default generator is process-wide: ranks run as threads of one process
  // (tests, benchmarks) must not interleave their seeded initialisations.
  static std::mutex init_mu;
  std::lock_guard<std::mutex> lock(init_mu);
  torch::manual_seed(spec.seed());
  return BuildModel(spec.model(), hidden, shape, open, regression);
}

// Every rank must build the same model from the same data shape, or the flat buffers
// would not line up: the fingerprints are compared (through the rendezvous store, when
// the hook is set) before the first collective on them.
absl::Status CompareFingerprints(const TrainHooks& hooks, Model& model, const InputShape& shape,
                                 int world, const Splits& splits) {
  if (!hooks.allgather) return absl::OkStatus();
  ScopedPhase comm(hooks.phases, Phase::kCommunication);
  absl::StatusOr<std::vector<std::string>> all =
      hooks.allgather(
          Fingerprint(model, shape, world, splits.train.examples(), splits.test.examples()));
  if (!all.ok()) return all.status();
  return CheckFingerprints(*all);
}

// What the training loop needs that may fail to come about: the data, the gang's group,
// the model on its device.
struct Prepared {
  Splits splits;
  std::string staged_dir;  // the host's staged copy of the data; "" when not staged
  std::shared_ptr<ProcessGroup> pg;
  std::unique_ptr<Model> model;
  torch::Device device{torch::kCPU};
};

// SCRATCH/joule-stage/job-<id>[-<uid>]: where this host stages the job's data.
std::string StagingDirectory(const v1::Assignment& a, const TrainerOptions& options) {
  std::string scratch = options.scratch_dir;
  if (scratch.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    scratch = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
  }
  // Canonical: the opener compares staged files against the resolved roots.
  std::error_code ec;
  const std::filesystem::path resolved = std::filesystem::weakly_canonical(
      std::filesystem::absolute(scratch, ec), ec);
  return absl::StrCat(ec ? scratch : resolved.string(), "/joule-stage/job-", a.job_id(),
                      a.job_uid().empty() ? "" : "-" + a.job_uid());
}

// Copies the job's data to this host's scratch (StageLocal) in the staging phase; returns
// the dataset name that reads the copy. Errors: StageLocal's.
absl::StatusOr<std::string> StageData(const v1::Assignment& a, const TrainerOptions& options,
                                      const TrainHooks& hooks, const FileOpener& open) {
  const v1::JobSpec& spec = a.spec();
  ScopedPhase staging(hooks.phases, Phase::kStaging);
  const joule::Clock& clock = options.clock != nullptr ? *options.clock : *joule::Clock::Real();
  const auto t0 = clock.Now();
  std::string source, prefix, suffix;
  if (absl::StartsWith(spec.dataset(), "hdf5:")) {
    absl::StatusOr<Hdf5Dataset> h = ParseHdf5Dataset(spec.dataset());
    if (!h.ok()) return h.status();
    source = h->file;
    prefix = "hdf5:";
    suffix = absl::StrCat(":", h->inputs, ":", h->targets);
  } else {
    source = spec.dataset().substr(std::string("imagefolder:").size());
    prefix = "imagefolder:";
  }
  absl::StatusOr<StagedData> staged = StageLocal(source, StagingDirectory(a, options), open);
  if (!staged.ok()) return staged.status();
  if (staged->copied) {
    spdlog::info("job {} rank {}: staged {} files ({} bytes) to {} in {:.2f} s", a.job_id(),
                 a.rank(), staged->files, staged->bytes, staged->path,
                 joule::Seconds(clock.Now() - t0));
  }
  return absl::StrCat(prefix, staged->path, suffix);
}

// Loads the splits, rendezvous, builds the model on its device and compares fingerprints.
absl::Status Prepare(const v1::Assignment& a, const TrainerOptions& options,
                     const TrainHooks& hooks, Prepared& out) {
  const v1::JobSpec& spec = a.spec();
  // Files the job names are opened beneath the allowed roots, by the kernel (openat2).
  const FileOpener open = MakeFileOpener(options.allowed_roots);
  // `stage: local`: the data is copied to this host's scratch first (a phase of its own),
  // then read from there; the spec elsewhere (its hash, the report) keeps the original.
  v1::JobSpec data_spec = spec;
  if (spec.stage() == "local") {
    absl::StatusOr<std::string> staged = StageData(a, options, hooks, open);
    if (!staged.ok()) return staged.status();
    data_spec.set_dataset(*staged);
    out.staged_dir = StagingDirectory(a, options);
  }
  absl::StatusOr<Splits> splits =
      LoadSplits(data_spec, options.data_root, open, a.rank(), a.world_size());
  if (!splits.ok()) return splits.status();
  out.splits = *std::move(splits);
  const ImageDataset& train = out.splits.train;
  // A sharded split trains min_shard examples per rank per epoch.
  const int64_t tiled = train.sharded ? train.min_shard * a.world_size() : train.size;
  if (absl::Status s = CheckBatchTiling(spec, a.world_size(), tiled); !s.ok()) return s;
  const InputShape shape{train.channels, train.height, train.width,
                         std::max(train.classes, out.splits.test.classes)};
  // Every rank loaded the same data: each refuses alike, before anything waits on a peer
  // (a rank that left during the rendezvous would fail its peers with "connection closed").
  if (spec.top_k() > shape.classes) {
    return absl::InvalidArgumentError(absl::StrCat("top_k ", spec.top_k(), " is more than the ",
                                                   shape.classes, " classes of ", spec.dataset()));
  }
  if (train.regression()) {
    absl::StatusOr<RegressionLoss> loss =
        RegressionLoss::FromSpec(spec, train.target_shape, torch::Device(torch::kCPU));
    if (!loss.ok()) return loss.status();
  }
  absl::StatusOr<std::shared_ptr<ProcessGroup>> pg = Connect(hooks);
  if (!pg.ok()) return pg.status();
  out.pg = *std::move(pg);
  const RegressionShape regression{train.sample_shape, train.target_shape};
  absl::StatusOr<std::unique_ptr<Model>> model =
      BuildSeededModel(spec, shape, open, train.regression() ? &regression : nullptr);
  if (!model.ok()) return model.status();
  out.model = *std::move(model);
  absl::StatusOr<torch::Device> device = SelectTrainingDevice(spec.device_kind(), *out.pg);
  if (!device.ok()) return device.status();
  out.device = *device;
  if (!out.device.is_cpu()) out.model->To(out.device);
  return CompareFingerprints(hooks, *out.model, shape, a.world_size(), out.splits);
}

v1::RankResult Train(const v1::Assignment& a, const TrainerOptions& given,
                     const TrainHooks& hooks) {
  // A staged copy is read from scratch: beneath the allowed roots too, when there are any.
  TrainerOptions options = given;
  if (a.spec().stage() == "local" && !options.allowed_roots.empty()) {
    options.allowed_roots.push_back(StagingDirectory(a, given));
  }
  const joule::Clock& clock = options.clock != nullptr ? *options.clock : *joule::Clock::Real();
  const joule::Clock::TimePoint wall_start = clock.Now();
  v1::RankResult result;
  result.set_test_top_k_accuracy(-1);  // until an evaluation with spec.top_k measures it
  result.set_rank(a.rank());
  SetIntraOpThreads(a.spec().intra_op_threads() > 0 ? a.spec().intra_op_threads()
                                                    : std::max(1, options.default_threads));
  ScopedPhase loading(hooks.phases, Phase::kData);
  Prepared p;
  absl::Status s = Prepare(a, options, hooks, p);
  // Destroyed after the result is stamped (with the group and the model): the wall time
  // excludes their teardown. The loop refers to the context, which outlives it.
  std::optional<AttemptContext> ctx;
  std::optional<TrainingLoop> loop;
  if (s.ok()) {
    result.set_train_examples(p.splits.train.examples());
    result.set_dataset_train_examples(p.splits.train_examples_before_fraction);
    ctx.emplace(a, options, hooks, *p.pg, CheckpointDirectory(options.checkpoint_root, a), clock,
                wall_start, result);
    if (a.spec().algorithm() == "ga") {
      s = RunGeneticAlgorithm(*ctx, p.splits, *p.model);
    } else {
      loop.emplace(*ctx, p.splits, *p.model, p.device);
      s = loop->Run();
    }
  }
  if (!s.ok()) {
    result.set_ok(false);
    result.set_error(std::string(s.message()));
    result.set_error_code(static_cast<int32_t>(s.code()));
    if (hooks.cancelled && hooks.cancelled()) result.set_cancelled(true);
  } else if (!p.staged_dir.empty()) {
    // Every rank has passed the last collective: nothing on this host reads the copy now.
    RemoveStaged(p.staged_dir);
  }
  result.set_wall_seconds(joule::Seconds(clock.Now() - wall_start));
  return result;
}

}  // namespace

// OpenBLAS's thread pool ignores torch::set_num_threads: two workers on two cores would
// otherwise run four BLAS threads and thrash (measured here: mlp 9,400-13,000 samples/s
// with the default, 17,600 with OpenBLAS at one thread each).
void SetIntraOpThreads(int n) {
  torch::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(n);
  }
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
