#include "worker/train/trainer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <zlib.h>

#include <dlfcn.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "worker/data/dataset.h"
#include "worker/models/models.h"

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
int64_t ParameterCount(torch::nn::Sequential& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

std::string ParameterHash(torch::nn::Sequential& model) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& p : model->parameters()) {
    torch::Tensor c = p.detach().contiguous();
    crc = crc32(crc, reinterpret_cast<const Bytef*>(c.data_ptr<float>()),
                static_cast<uInt>(c.numel() * sizeof(float)));
  }
  return absl::StrCat(absl::Hex(crc, absl::kZeroPad8));
}

struct EvalResult {
  double accuracy = 0;
  double loss = 0;
};

// Evaluates this rank's strided shard of `test` and allreduces (correct, loss sum, count).
absl::StatusOr<EvalResult> Evaluate(torch::nn::Sequential& model, const torch::Tensor& images,
                                    const torch::Tensor& labels, ProcessGroup& pg) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t n = images.size(0);
  torch::Tensor idx = torch::arange(pg.rank(), n, pg.size(), torch::kLong);
  float sums[3] = {0, 0, 0};
  constexpr int64_t kChunk = 1000;
  for (int64_t begin = 0; begin < idx.size(0); begin += kChunk) {
    torch::Tensor b = idx.slice(0, begin, std::min(begin + kChunk, idx.size(0)));
    torch::Tensor x = images.index_select(0, b);
    torch::Tensor y = labels.index_select(0, b);
    torch::Tensor logits = model->forward(x);
    sums[0] += logits.argmax(1).eq(y).sum().item<float>();
    sums[1] += torch::nn::functional::cross_entropy(
                   logits, y,
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<float>();
    sums[2] += static_cast<float>(b.size(0));
  }
  model->train();
  if (absl::Status s = pg.AllreduceSum(std::span<float>(sums, 3)); !s.ok()) return s;
  if (sums[2] == 0) return EvalResult{};
  return EvalResult{sums[0] / sums[2], sums[1] / sums[2]};
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
    result.set_wall_seconds(SecondsSince(wall_start));
    return result;
  };

  SetIntraOpThreads(spec.intra_op_threads() > 0 ? spec.intra_op_threads()
                                                : std::max(1, options.default_threads));
  ScopedPhase loading(hooks.phases, Phase::kData);
  std::string dir;
  if (absl::Status s = ResolveDataset(spec.dataset(), options.data_root, &dir); !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<ImageDataset> train = LoadIdxDataset(dir, Split::kTrain, spec.max_train_samples());
  if (!train.ok()) return fail(train.status());
  absl::StatusOr<ImageDataset> test = LoadIdxDataset(dir, Split::kTest, spec.max_test_samples());
  if (!test.ok()) return fail(test.status());
  if (test->height != train->height || test->width != train->width) {
    return fail(absl::DataLossError(absl::StrCat(dir, ": test images are ", test->height, "x",
                                                 test->width, ", train images ", train->height,
                                                 "x", train->width)));
  }
  const int64_t gbs = spec.global_batch_size();
  if (train->size < gbs) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "the training split has ", train->size, " examples, fewer than one global batch (",
        gbs, ")")));
  }

  absl::StatusOr<std::unique_ptr<ProcessGroup>> pg_or;
  {
    ScopedPhase rendezvous(hooks.phases, Phase::kCommunication);
    pg_or = hooks.connect();
  }
  if (!pg_or.ok()) return fail(pg_or.status());
  ProcessGroup& pg = **pg_or;

  torch::manual_seed(spec.seed());
  std::vector<int> hidden(spec.hidden_sizes().begin(), spec.hidden_sizes().end());
  InputShape shape{train->channels, train->height, train->width,
                   std::max(train->classes, test->classes)};
  absl::StatusOr<torch::nn::Sequential> model_or = BuildModel(spec.model(), hidden, shape);
  if (!model_or.ok()) return fail(model_or.status());
  torch::nn::Sequential model = *model_or;
  std::vector<torch::Tensor> params = model->parameters();
  const int64_t total = ParameterCount(model);
  torch::Tensor flat = torch::zeros({total}, torch::kFloat32);
  std::span<float> flat_span(flat.data_ptr<float>(), static_cast<size_t>(total));

  // Every rank starts from rank 0's parameters.
  {
    torch::NoGradGuard no_grad;
    int64_t off = 0;
    for (auto& p : params) {
      flat.narrow(0, off, p.numel()).copy_(p.view(-1));
      off += p.numel();
    }
    ScopedPhase comm(hooks.phases, Phase::kCommunication);
    const auto t0 = Wall::now();
    if (absl::Status s = pg.Broadcast(flat_span, 0); !s.ok()) return fail(s);
    if (hooks.on_collective) {
      hooks.on_collective("broadcast", total * static_cast<int64_t>(sizeof(float)),
                          SecondsSince(t0));
    }
    off = 0;
    for (auto& p : params) {
      p.view(-1).copy_(flat.narrow(0, off, p.numel()));
      off += p.numel();
    }
  }

  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(spec.optimizer().lr())
                                          .momentum(spec.optimizer().momentum())
                                          .weight_decay(spec.optimizer().weight_decay()));
  torch::Tensor train_x = ImagesTensor(*train), train_y = LabelsTensor(*train);
  torch::Tensor test_x = ImagesTensor(*test), test_y = LabelsTensor(*test);
  EpochSharder sharder(train->size, gbs, rank, world, spec.seed());
  const int64_t steps_per_epoch = sharder.steps_per_epoch();
  const float inv_world = 1.0f / static_cast<float>(world);

  v1::JobProgress progress;
  progress.set_steps_per_epoch(steps_per_epoch);
  progress.set_test_accuracy(-1);
  double train_seconds = 0;
  int64_t step = 0;
  double window_loss = 0;
  int64_t window_steps = 0;
  auto last_report = Wall::now();
  int64_t samples_at_report = 0;
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

  for (int epoch = 0; epoch < spec.epochs(); ++epoch) {
    progress.set_epoch(epoch + 1);
    sharder.StartEpoch(epoch);
    const auto epoch_start = Wall::now();
    for (int64_t s = 0; s < steps_per_epoch; ++s) {
      if (hooks.cancelled && hooks.cancelled()) {
        result.set_cancelled(true);
        return fail(absl::CancelledError("cancelled"));
      }
      const auto step_start = Wall::now();
      if (hooks.phases) hooks.phases->Enter(Phase::kData);
      std::vector<int64_t> batch = sharder.Batch(s);
      torch::Tensor idx = torch::from_blob(batch.data(), {static_cast<int64_t>(batch.size())},
                                           torch::kLong);
      torch::Tensor x = train_x.index_select(0, idx);
      torch::Tensor y = train_y.index_select(0, idx);
      if (hooks.phases) hooks.phases->Enter(Phase::kForward);
      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      if (hooks.phases) hooks.phases->Enter(Phase::kBackward);
      loss.backward();
      if (world > 1) {
        if (hooks.phases) hooks.phases->Enter(Phase::kCommunication);
        torch::NoGradGuard no_grad;
        const auto t0 = Wall::now();
        int64_t off = 0;
        for (auto& p : params) {
          flat.narrow(0, off, p.numel()).copy_(p.grad().view(-1));
          off += p.numel();
        }
        if (absl::Status st = pg.AllreduceSum(flat_span); !st.ok()) return fail(st);
        flat.mul_(inv_world);
        off = 0;
        for (auto& p : params) {
          p.mutable_grad().view(-1).copy_(flat.narrow(0, off, p.numel()));
          off += p.numel();
        }
        if (hooks.on_collective) {
          hooks.on_collective("allreduce", total * static_cast<int64_t>(sizeof(float)),
                              SecondsSince(t0));
        }
      }
      if (hooks.phases) hooks.phases->Enter(Phase::kOptimizer);
      optimizer.step();
      const double step_loss = loss.item<double>();
      if (hooks.on_step) hooks.on_step(sharder.local_batch(), SecondsSince(step_start), step_loss);
      ++step;
      window_loss += step_loss;
      ++window_steps;
      report(false, train_seconds + SecondsSince(epoch_start));
    }
    train_seconds += SecondsSince(epoch_start);
    if (hooks.phases) hooks.phases->Enter(Phase::kEvaluation);
    absl::StatusOr<EvalResult> eval = Evaluate(model, test_x, test_y, pg);
    if (!eval.ok()) return fail(eval.status());
    progress.set_test_accuracy(eval->accuracy);
    progress.set_test_loss(eval->loss);
    result.set_test_accuracy(eval->accuracy);
    result.set_test_loss(eval->loss);
    if (rank == 0) {
      spdlog::info("job {} rank {}: epoch {}/{} test accuracy {:.4f} loss {:.4f}", a.job_id(),
                   rank, epoch + 1, spec.epochs(), eval->accuracy, eval->loss);
    }
    report(true, train_seconds);
  }
  if (hooks.phases) hooks.phases->Enter(Phase::kIdle);
  result.set_ok(true);
  result.set_parameter_hash(ParameterHash(model));
  result.set_steps(step);
  result.set_samples(step * sharder.local_batch());
  result.set_train_seconds(train_seconds);
  result.set_wall_seconds(SecondsSince(wall_start));
  return result;
}

}  // namespace

v1::RankResult RunTraining(const v1::Assignment& assignment, const TrainerOptions& options,
                           const TrainHooks& hooks) {
  try {
    return Train(assignment, options, hooks);
  } catch (const std::exception& e) {
    v1::RankResult r;
    r.set_rank(assignment.rank());
    r.set_ok(false);
    r.set_error(absl::StrCat("training failed: ", e.what()));
    return r;
  }
}

}  // namespace joule::worker
