#include "worker/train/trainer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "worker/data/dataset.h"
#include "worker/data/prefetcher.h"
#include "worker/models/models.h"
#include "worker/train/checkpoint.h"
#include "worker/train/checkpoint_assembly.h"
#include "worker/train/evaluation.h"
#include "worker/train/ga.h"
#include "worker/train/gradient_sync.h"
#include "worker/train/model_state.h"
#include "worker/train/progress_reporter.h"
#include "worker/train/resume_point.h"
#include "worker/train/sgd.h"
#include "worker/train/splits.h"

namespace joule::worker {
namespace {

using Wall = std::chrono::steady_clock;

double SecondsSince(Wall::time_point t) {
  return std::chrono::duration<double>(Wall::now() - t).count();
}

torch::Tensor ImagesTensor(ImageDataset& d) {
  return torch::from_blob(d.images.data(), {d.size, d.channels, d.height, d.width},
                          torch::kFloat32);
}
torch::Tensor LabelsTensor(ImageDataset& d) {
  return torch::from_blob(d.labels.data(), {d.size}, torch::kLong);
}

// The gang's process group, built by the rendezvous hook.
absl::StatusOr<std::shared_ptr<ProcessGroup>> Connect(const TrainHooks& hooks) {
  ScopedPhase rendezvous(hooks.phases, Phase::kCommunication);
  return hooks.connect();
}

// The spec's model, freshly initialised from spec.seed.
absl::StatusOr<std::unique_ptr<Model>> BuildSeededModel(const v1::JobSpec& spec,
                                                        const InputShape& shape,
                                                        const FileOpener& open) {
  std::vector<int> hidden(spec.hidden_sizes().begin(), spec.hidden_sizes().end());
  // LibTorch's default generator is process-wide: ranks run as threads of one process
  // (tests, benchmarks) must not interleave their seeded initialisations.
  static std::mutex init_mu;
  std::lock_guard<std::mutex> lock(init_mu);
  torch::manual_seed(spec.seed());
  return BuildModel(spec.model(), hidden, shape, open);
}

// Every rank must build the same model from the same data shape, or the flat buffers
// would not line up: the fingerprints are compared (through the rendezvous store, when
// the hook is set) before the first collective on them.
absl::Status CompareFingerprints(const TrainHooks& hooks, Model& model, const InputShape& shape,
                                 int world, const Splits& splits) {
  if (!hooks.allgather) return absl::OkStatus();
  ScopedPhase comm(hooks.phases, Phase::kCommunication);
  absl::StatusOr<std::vector<std::string>> all =
      hooks.allgather(Fingerprint(model, shape, world, splits.train.size, splits.test.size));
  if (!all.ok()) return all.status();
  return CheckFingerprints(*all);
}

// One rank's attempt once its data, group and model are ready: start from rank 0's state
// (resumed from a checkpoint if there is one), train the epochs, compare the final
// parameters. Holds the state the steps share. Not thread-safe (the training thread).
class TrainingLoop {
 public:
  TrainingLoop(const v1::Assignment& a, const TrainerOptions& options, const TrainHooks& hooks,
               Splits& splits, ProcessGroup& pg, Model& model, const torch::Device& device,
               Wall::time_point wall_start, v1::RankResult& result);
  // Fills the result's success fields (but wall_seconds) when it returns OK.
  absl::Status Run();

 private:
  struct StepOutcome {
    double loss;
    bool ranks_equal;  // every rank holds the same parameters after the step
    double wait_seconds = 0;  // blocked at the gradient allreduce after backward
  };
  // The attempt's mean step and allreduce wait, and the links probed, into the result.
  void FillTiming();
  static constexpr int64_t kPrefetchDepth = 2;  // steps whose examples are gathered ahead

  absl::Status StartFromRankZero();
  absl::Status TrainEpoch(int epoch);
  absl::StatusOr<StepOutcome> Step(const torch::Tensor& batch_x, const torch::Tensor& batch_y);
  absl::Status EndEpoch(int epoch);
  absl::Status AverageParameters();
  // `written`, if given: whether the file was written (a failed write is only logged).
  absl::Status SaveStepCheckpoint(int epoch, int64_t next_step_in_epoch,
                                  bool* written = nullptr);
  absl::Status SaveCheckpoint(int next_epoch, int64_t next_step_in_epoch,
                              const std::vector<torch::Tensor>& statistics);
  absl::Status CompareFinalParameters();
  absl::StatusOr<bool> AgreeToStop(bool last_of_epoch);
  absl::Status StopWithCheckpoint(int epoch, int64_t next_step_in_epoch, bool ranks_equal);
  void Enter(Phase phase) {
    if (hooks_.phases) hooks_.phases->Enter(phase);
  }

  const v1::Assignment& a_;
  const v1::JobSpec& spec_;
  const TrainerOptions& options_;
  const TrainHooks& hooks_;
  ProcessGroup& pg_;
  Model& model_;
  const torch::Device device_;
  const Wall::time_point wall_start_;
  v1::RankResult& result_;

  ModelTensors tensors_;
  Sgd sgd_;
  ParameterExchange exchange_;
  const std::string ckpt_dir_;
  const uint64_t spec_hash_;
  torch::Tensor train_x_, train_y_, test_x_, test_y_;
  EpochSharder sharder_;
  BatchPrefetcher prefetch_;
  const LearningRateSchedule lr_;
  const LocalSgdSchedule schedule_;
  std::unique_ptr<GradientSync> sync_;        // null for one rank
  std::optional<ProgressReporter> reporter_;  // from the start of the loop

  int start_epoch_ = 0;
  int64_t start_step_in_epoch_ = 0;
  int64_t step_ = 0;        // global steps done
  int64_t first_step_ = 0;  // where this attempt started
  double resumed_accuracy_ = -1;
  double train_seconds_ = 0;    // in the loop so far, evaluation excluded
  // Sums over the attempt's steps: whole steps and their allreduce waits, seconds.
  double step_seconds_sum_ = 0, wait_seconds_sum_ = 0;
  int64_t timed_steps_ = 0;
  bool checkpoint_due_ = false;  // a step checkpoint is due at the next equal-ranks step
  double epoch_loss_sum_ = 0;    // this epoch's steps on this rank, for history
  int64_t epoch_loss_steps_ = 0;
};

TrainingLoop::TrainingLoop(const v1::Assignment& a, const TrainerOptions& options,
                           const TrainHooks& hooks, Splits& splits, ProcessGroup& pg,
                           Model& model, const torch::Device& device,
                           Wall::time_point wall_start, v1::RankResult& result)
    : a_(a),
      spec_(a.spec()),
      options_(options),
      hooks_(hooks),
      pg_(pg),
      model_(model),
      device_(device),
      wall_start_(wall_start),
      result_(result),
      tensors_(CollectModelTensors(model)),
      sgd_(tensors_.parameters,
           SgdOptions{spec_.optimizer().momentum(), spec_.optimizer().weight_decay()}),
      exchange_(tensors_.parameter_count(), hooks.on_collective),
      ckpt_dir_(CheckpointDirectory(options.checkpoint_root, a)),
      spec_hash_(SpecHash(spec_)),
      train_x_(ImagesTensor(splits.train)),
      train_y_(LabelsTensor(splits.train)),
      test_x_(ImagesTensor(splits.test)),
      test_y_(LabelsTensor(splits.test)),
      sharder_(splits.train.size, spec_.global_batch_size(), a.rank(), a.world_size(),
               spec_.seed()),
      prefetch_(train_x_, train_y_),
      lr_(spec_.optimizer().lr(), spec_.lr_scaling() == "linear", spec_.global_batch_size(),
          spec_.lr_warmup_epochs() * sharder_.steps_per_epoch()),
      schedule_(spec_.sync(), a.world_size()) {}

absl::Status TrainingLoop::Run() {
  if (absl::Status s = StartFromRankZero(); !s.ok()) return s;
  // Gradients are averaged in buckets overlapped with backward on the CPU, in one flat
  // allreduce on a GPU (GradientSync).
  absl::StatusOr<std::unique_ptr<GradientSync>> sync =
      MakeGradientSync(tensors_.parameters, spec_.sync(), pg_, device_, hooks_.phases);
  if (!sync.ok()) return sync.status();
  sync_ = *std::move(sync);
  reporter_.emplace(hooks_.on_progress, options_.progress_period_seconds,
                    spec_.global_batch_size(), sharder_.steps_per_epoch(), step_,
                    resumed_accuracy_, *joule::Clock::Real(), wall_start_);
  // Each link's throughput, once per attempt, so that a straggler's cause can be a link.
  if (options_.link_probe_bytes > 0 && pg_.size() > 1) {
    ScopedPhase comm(hooks_.phases, Phase::kCommunication);
    absl::StatusOr<std::vector<LinkProbe>> probes = pg_.ProbeLinks(options_.link_probe_bytes);
    if (!probes.ok()) return probes.status();
    for (const LinkProbe& p : *probes) {
      v1::LinkThroughput* l = result_.add_links();
      l->set_peer(p.peer);
      l->set_bytes(p.bytes);
      l->set_megabytes_per_second(p.megabytes_per_second());
    }
    reporter_->SetLinks(result_.links());
  }
  absl::Status status = absl::OkStatus();
  for (int epoch = start_epoch_; epoch < spec_.epochs() && status.ok(); ++epoch) {
    status = TrainEpoch(epoch);
    if (status.ok()) status = EndEpoch(epoch);
  }
  FillTiming();
  if (status.ok()) return CompareFinalParameters();
  // A failed, cancelled or stopped attempt keeps what it did for its partial report.
  result_.set_steps(step_);
  result_.set_samples((step_ - first_step_) * sharder_.local_batch());
  result_.set_train_seconds(train_seconds_);
  return status;
}

// Every kStopCheckInterval global steps of a budgeted job, and at each epoch's last step
// (so that epochs shorter than the interval are checked too): whether any rank was asked
// to stop. The ranks hold the same step_, so they check at the same steps.
absl::StatusOr<bool> TrainingLoop::AgreeToStop(bool last_of_epoch) {
  if (spec_.energy_budget_joules() <= 0) return false;
  if (step_ % kStopCheckInterval != 0 && !last_of_epoch) return false;
  float flag = hooks_.stop_requested && hooks_.stop_requested() ? 1.0f : 0.0f;
  ScopedPhase comm(hooks_.phases, Phase::kCommunication);
  if (absl::Status st = pg_.Allreduce(std::span<float>(&flag, 1), ReduceOp::kSum); !st.ok()) {
    return st;
  }
  return flag > 0;
}

// The agreed stop: every rank holds the same parameters (averaged first under local
// SGD), rank 0 writes the checkpoint a later attempt would resume from, and the attempt
// ends cancelled.
absl::Status TrainingLoop::StopWithCheckpoint(int epoch, int64_t next_step_in_epoch,
                                              bool ranks_equal) {
  if (!ranks_equal) {
    if (absl::Status s = AverageParameters(); !s.ok()) return s;
  }
  bool written = false;
  if (absl::Status s = SaveStepCheckpoint(epoch, next_step_in_epoch, &written); !s.ok()) {
    return s;
  }
  result_.set_cancelled(true);
  const char* how = ckpt_dir_.empty() ? " (no checkpoint: the worker has no checkpoint directory)"
                    : a_.rank() != 0  ? ", after rank 0's checkpoint"
                    : written         ? ", after a checkpoint"
                                      : " (the checkpoint could not be written: see the log)";
  if (a_.rank() == 0) {
    spdlog::info("job {}: stopped at step {} as asked{}", a_.job_id(), step_, how);
  }
  return absl::CancelledError(
      absl::StrCat("stopped at step ", step_, " as the coordinator asked", how));
}

// Resumes from the job's newest valid checkpoint, if any. Only rank 0 reads it (the
// others may not see the same files: no shared storage, or a deposed writer still
// renaming); it broadcasts where to resume, then every rank takes rank 0's parameters,
// momentum and statistics.
absl::Status TrainingLoop::StartFromRankZero() {
  std::optional<ResumePoint> point;
  if (a_.rank() == 0) {
    absl::StatusOr<std::optional<ResumePoint>> restored =
        RestoreNewestCheckpoint(ckpt_dir_, spec_hash_, a_.job_id(), tensors_, sgd_);
    if (!restored.ok()) return restored.status();
    point = *restored;
  }
  ScopedPhase comm(hooks_.phases, Phase::kCommunication);
  if (absl::Status s = BroadcastResumePoint(pg_, 0, &point); !s.ok()) return s;
  if (point.has_value()) {
    start_epoch_ = point->next_epoch;
    start_step_in_epoch_ = point->next_step_in_epoch;
    step_ = point->global_step;
    sgd_.set_started(point->has_momentum);
    resumed_accuracy_ = point->test_accuracy;
    result_.set_resumed_from_step(step_);
    result_.set_test_accuracy(resumed_accuracy_);
    if (a_.rank() == 0) {
      spdlog::info("job {}: resuming from the checkpoint at step {} (epoch {}, step {})",
                   a_.job_id(), step_, start_epoch_ + 1, start_step_in_epoch_);
    }
  }
  first_step_ = step_;
  if (absl::Status s = exchange_.Broadcast(pg_, tensors_.parameters); !s.ok()) return s;
  if (absl::Status s = exchange_.Broadcast(pg_, sgd_.momentum_buffers()); !s.ok()) return s;
  return SyncTensors(pg_, tensors_.statistics, /*average=*/false);
}

absl::Status TrainingLoop::TrainEpoch(int epoch) {
  reporter_->SetEpoch(epoch + 1);
  sharder_.StartEpoch(epoch);
  const int64_t steps = sharder_.steps_per_epoch();
  const int64_t first = epoch == start_epoch_ ? start_step_in_epoch_ : 0;
  prefetch_.Clear();
  for (int64_t k = first; k < std::min(first + kPrefetchDepth, steps); ++k) {
    prefetch_.Submit(sharder_.Batch(k));
  }
  const auto epoch_start = Wall::now();
  for (int64_t s = first; s < steps; ++s) {
    if (hooks_.cancelled && hooks_.cancelled()) {
      result_.set_cancelled(true);
      return absl::CancelledError("cancelled");
    }
    const auto step_start = Wall::now();
    Enter(Phase::kData);
    auto [batch_x, batch_y] = prefetch_.Next();
    if (s + kPrefetchDepth < steps) prefetch_.Submit(sharder_.Batch(s + kPrefetchDepth));
    absl::StatusOr<StepOutcome> outcome = Step(batch_x, batch_y);
    if (!outcome.ok()) return outcome.status();
    const double step_seconds = SecondsSince(step_start);
    if (hooks_.on_step) hooks_.on_step(sharder_.local_batch(), step_seconds, outcome->loss);
    reporter_->AddStep(outcome->loss, step_seconds, outcome->wait_seconds);
    step_seconds_sum_ += step_seconds;
    wait_seconds_sum_ += outcome->wait_seconds;
    ++timed_steps_;
    epoch_loss_sum_ += outcome->loss;
    ++epoch_loss_steps_;
    reporter_->MaybeReport(step_, train_seconds_ + SecondsSince(epoch_start));
    absl::StatusOr<bool> stop = AgreeToStop(s + 1 == steps);
    if (!stop.ok()) return stop.status();
    if (*stop) {
      train_seconds_ += SecondsSince(epoch_start);
      return StopWithCheckpoint(epoch, s + 1, outcome->ranks_equal);
    }
    if (spec_.checkpoint_every_steps() > 0 && step_ % spec_.checkpoint_every_steps() == 0) {
      checkpoint_due_ = true;
    }
    // Under local SGD the ranks differ between averagings: a due checkpoint waits for
    // the next one, so that taking it changes nothing (averaging early would).
    if (checkpoint_due_ && outcome->ranks_equal && s + 1 < steps) {
      checkpoint_due_ = false;
      if (absl::Status st = SaveStepCheckpoint(epoch, s + 1); !st.ok()) return st;
    }
  }
  train_seconds_ += SecondsSince(epoch_start);
  return absl::OkStatus();
}

// Forward and backward over the rank's share in micro-batches (gradient accumulation:
// each loss scaled so that the gradient is the mean over the share), the gradients
// averaged over ranks unless local SGD skips it, the SGD update, and under local SGD the
// periodic averaging of parameters. Gradients are zero on entry: Sgd::Step clears them
// (they may be undefined before the first backward).
absl::StatusOr<TrainingLoop::StepOutcome> TrainingLoop::Step(const torch::Tensor& batch_x,
                                                             const torch::Tensor& batch_y) {
  const bool sync_gradients = schedule_.AveragesGradients(step_);
  const double lr_now = lr_.At(step_);
  const int64_t micro_batches = std::max(1, spec_.accumulation_steps());
  const int64_t micro_size = spec_.local_batch_size();
  // On the training device: LibTorch refuses to add a CUDA scalar into a CPU tensor.
  torch::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  for (int64_t m = 0; m < micro_batches; ++m) {
    Enter(Phase::kData);
    torch::Tensor x = batch_x.narrow(0, m * micro_size, micro_size).to(device_);
    torch::Tensor y = batch_y.narrow(0, m * micro_size, micro_size).to(device_);
    Enter(Phase::kForward);
    torch::Tensor micro_loss = torch::nn::functional::cross_entropy(model_.Forward(x), y);
    if (micro_batches > 1) micro_loss = micro_loss / static_cast<double>(micro_batches);
    Enter(Phase::kBackward);
    // The last micro-batch's backward reduces buckets as they fill.
    if (sync_ && sync_gradients && m + 1 == micro_batches) sync_->Prepare();
    micro_loss.backward();
    loss_sum += micro_loss.detach();
  }
  double wait_seconds = 0;
  if (sync_ && sync_gradients) {
    Enter(Phase::kCommunication);
    const auto t0 = Wall::now();
    if (absl::Status s = sync_->Finish(); !s.ok()) return s;
    wait_seconds = SecondsSince(t0);
    if (hooks_.on_collective) {
      hooks_.on_collective("allreduce", sync_->bytes_per_step(), wait_seconds);
    }
  }
  Enter(Phase::kOptimizer);
  sgd_.Step(lr_now);
  // One host synchronisation per step on a GPU (the loss and the step time reported
  // to on_step need the step to have finished; NCCL's allreduce waits anyway).
  const double loss = loss_sum.item<double>();
  ++step_;
  if (schedule_.AveragesParametersAfter(step_)) {
    if (absl::Status s = AverageParameters(); !s.ok()) return s;
    return StepOutcome{loss, true, wait_seconds};
  }
  return StepOutcome{loss, sync_gradients, wait_seconds};
}

void TrainingLoop::FillTiming() {
  if (timed_steps_ == 0) return;
  result_.set_step_seconds(step_seconds_sum_ / static_cast<double>(timed_steps_));
  result_.set_collective_wait_seconds(wait_seconds_sum_ / static_cast<double>(timed_steps_));
}

// Evaluates (and ends) with the same parameters and statistics on every rank, then
// writes the epoch's checkpoint and reports.
absl::Status TrainingLoop::EndEpoch(int epoch) {
  if (schedule_.local()) {
    if (absl::Status s = AverageParameters(); !s.ok()) return s;
  }
  Enter(Phase::kEvaluation);
  if (absl::Status s = SyncTensors(pg_, tensors_.statistics, /*average=*/true); !s.ok()) return s;
  absl::StatusOr<EvalResult> eval = Evaluate(model_, test_x_, test_y_, pg_, device_);
  if (!eval.ok()) return eval.status();
  reporter_->SetEvaluation(eval->accuracy, eval->loss);
  result_.set_test_accuracy(eval->accuracy);
  result_.set_test_loss(eval->loss);
  if (a_.rank() == 0) {
    spdlog::info("job {} rank {}: epoch {}/{} test accuracy {:.4f} loss {:.4f}", a_.job_id(),
                 a_.rank(), epoch + 1, spec_.epochs(), eval->accuracy, eval->loss);
  }
  const bool every_epochs = spec_.checkpoint_every_epochs() > 0 &&
                            (epoch + 1) % spec_.checkpoint_every_epochs() == 0;
  const bool every_steps_crossed = spec_.checkpoint_every_steps() > 0;
  const bool final_kept = spec_.keep_model() && epoch + 1 == spec_.epochs();
  if (((every_epochs || every_steps_crossed) && epoch + 1 < spec_.epochs()) || final_kept) {
    if (absl::Status s = SaveCheckpoint(epoch + 1, 0, tensors_.statistics); !s.ok()) {
      spdlog::warn("job {}: checkpoint after epoch {} failed: {}", a_.job_id(), epoch + 1,
                   s.ToString());
    }
  }
  checkpoint_due_ = false;  // the epoch's end is a checkpoint (or the job's end)
  v1::EpochRecord* h = result_.add_history();
  h->set_epoch(epoch + 1);
  h->set_step(step_);
  h->set_samples(step_ * spec_.global_batch_size());
  h->set_elapsed_seconds(SecondsSince(wall_start_));
  // -1: no step of this epoch ran in this attempt (resumed at its end).
  h->set_train_loss(epoch_loss_steps_ > 0 ? epoch_loss_sum_ / epoch_loss_steps_ : -1);
  h->set_test_accuracy(eval->accuracy);
  h->set_test_loss(eval->loss);
  h->set_joules(hooks_.energy_joules ? hooks_.energy_joules() : 0);
  h->set_attempt(a_.attempt());
  epoch_loss_sum_ = 0;
  epoch_loss_steps_ = 0;
  reporter_->Report(step_, train_seconds_);
  return absl::OkStatus();
}

// Local SGD: every rank's parameters (and momentum, if asked and started) become their
// average.
absl::Status TrainingLoop::AverageParameters() {
  ScopedPhase comm(hooks_.phases, Phase::kCommunication);
  if (absl::Status s = exchange_.Average(pg_, tensors_.parameters); !s.ok()) return s;
  if (!(spec_.sync().average_momentum() && sgd_.started())) return absl::OkStatus();
  return exchange_.Average(pg_, sgd_.momentum_buffers());
}

// A checkpoint within an epoch, at a step after which the ranks hold equal parameters.
// The statistics are averaged into copies: the model's own go on as without checkpoints.
// Only a failed collective is an error; a failed write is logged.
absl::Status TrainingLoop::SaveStepCheckpoint(int epoch, int64_t next_step_in_epoch,
                                              bool* written) {
  std::vector<torch::Tensor> averaged_stats;
  for (const auto& t : tensors_.statistics) averaged_stats.push_back(t.detach().clone());
  if (absl::Status s = SyncTensors(pg_, averaged_stats, /*average=*/true); !s.ok()) return s;
  absl::Status saved = SaveCheckpoint(epoch, next_step_in_epoch, averaged_stats);
  if (!saved.ok()) {
    spdlog::warn("job {}: checkpoint at step {} failed: {}", a_.job_id(), step_, saved.ToString());
  }
  if (written) *written = saved.ok() && !ckpt_dir_.empty();
  return absl::OkStatus();
}

// Rank 0 saves; the others go on (they wait for it at the next collective).
absl::Status TrainingLoop::SaveCheckpoint(int next_epoch, int64_t next_step_in_epoch,
                                          const std::vector<torch::Tensor>& statistics) {
  if (a_.rank() != 0 || ckpt_dir_.empty()) return absl::OkStatus();
  ScopedPhase save(hooks_.phases, Phase::kCheckpoint);
  const CheckpointPosition position{next_epoch, next_step_in_epoch, step_,
                                    reporter_->progress().test_accuracy(),
                                    reporter_->progress().test_loss()};
  absl::Status written =
      WriteCheckpoint(ckpt_dir_, AssembleCheckpoint(a_, spec_hash_, position, tensors_, sgd_, statistics),
                      spec_.keep_checkpoints());
  // In the job's log (`joule logs`), as the README says: where a resume would start.
  if (written.ok()) {
    spdlog::info("job {}: checkpoint at step {} (epoch {}, step {} of it) written to {}",
                 a_.job_id(), step_, next_epoch + (next_step_in_epoch > 0 ? 1 : 0),
                 next_step_in_epoch, ckpt_dir_);
  }
  return written;
}

// A job whose ranks end with different parameters never succeeds.
absl::Status TrainingLoop::CompareFinalParameters() {
  Enter(Phase::kIdle);
  const uint32_t hash = ParameterHash(model_);
  {
    ScopedPhase comm(hooks_.phases, Phase::kCommunication);
    if (absl::Status s = CompareParameterHashes(pg_, hash); !s.ok()) return s;
  }
  Enter(Phase::kIdle);
  result_.set_ok(true);
  result_.set_parameter_hash(HashText(hash));
  result_.set_steps(step_);
  result_.set_samples((step_ - first_step_) * sharder_.local_batch());
  result_.set_train_seconds(train_seconds_);
  return absl::OkStatus();
}

// What the training loop needs that may fail to come about: the data, the gang's group,
// the model on its device.
struct Prepared {
  Splits splits;
  std::shared_ptr<ProcessGroup> pg;
  std::unique_ptr<Model> model;
  torch::Device device{torch::kCPU};
};

// Loads the splits, rendezvous, builds the model on its device and compares fingerprints.
absl::Status Prepare(const v1::Assignment& a, const TrainerOptions& options,
                     const TrainHooks& hooks, Prepared& out) {
  const v1::JobSpec& spec = a.spec();
  // Files the job names are opened beneath the allowed roots, by the kernel (openat2).
  const FileOpener open = MakeFileOpener(options.allowed_roots);
  absl::StatusOr<Splits> splits = LoadSplits(spec, options.data_root, open);
  if (!splits.ok()) return splits.status();
  out.splits = *std::move(splits);
  const ImageDataset& train = out.splits.train;
  if (absl::Status s = CheckBatchTiling(spec, a.world_size(), train.size); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<ProcessGroup>> pg = Connect(hooks);
  if (!pg.ok()) return pg.status();
  out.pg = *std::move(pg);
  const InputShape shape{train.channels, train.height, train.width,
                         std::max(train.classes, out.splits.test.classes)};
  absl::StatusOr<std::unique_ptr<Model>> model = BuildSeededModel(spec, shape, open);
  if (!model.ok()) return model.status();
  out.model = *std::move(model);
  absl::StatusOr<torch::Device> device = SelectTrainingDevice(spec.device_kind(), *out.pg);
  if (!device.ok()) return device.status();
  out.device = *device;
  if (!out.device.is_cpu()) out.model->To(out.device);
  return CompareFingerprints(hooks, *out.model, shape, a.world_size(), out.splits);
}

// keep_model for a ga job (rank 0): the winner's genome becomes the job model's
// parameters (a genome is the Linear stack's parameters in order: each layer's weight
// [out, in], then its bias) and is written as the final checkpoint, as an sgd job's is,
// for `joule export`. A failure is logged, as the final checkpoint of an sgd job.
void KeepGaModel(const v1::Assignment& a, const TrainerOptions& options, const TrainHooks& hooks,
                 const torch::Tensor& genome, Model& model, const v1::RankResult& result) {
  const std::string dir = CheckpointDirectory(options.checkpoint_root, a);
  if (dir.empty()) {
    spdlog::warn("job {}: keep_model: the worker has no checkpoint directory", a.job_id());
    return;
  }
  ScopedPhase phase(hooks.phases, Phase::kCheckpoint);
  ModelTensors tensors = CollectModelTensors(model);
  int64_t n = 0;
  for (const torch::Tensor& t : tensors.parameters) n += t.numel();
  if (n != genome.numel()) {
    spdlog::warn("job {}: keep_model: the genome has {} weights, the model {}", a.job_id(),
                 genome.numel(), n);
    return;
  }
  {
    torch::NoGradGuard no_grad;
    Unpack(genome, tensors.parameters);
  }
  const Sgd unused(tensors.parameters, SgdOptions{});  // no momentum: none is written
  const CheckpointPosition position{std::max(1, a.spec().epochs()), 0,
                                    a.spec().ga().generations(), result.test_accuracy(),
                                    result.test_loss()};
  if (absl::Status s = WriteCheckpoint(
          dir, AssembleCheckpoint(a, SpecHash(a.spec()), position, tensors, unused, {}),
          a.spec().keep_checkpoints());
      !s.ok()) {
    spdlog::warn("job {}: keep_model: {}", a.job_id(), s.ToString());
  }
}

v1::RankResult Train(const v1::Assignment& a, const TrainerOptions& options,
                     const TrainHooks& hooks) {
  const auto wall_start = Wall::now();
  v1::RankResult result;
  result.set_rank(a.rank());
  SetIntraOpThreads(a.spec().intra_op_threads() > 0 ? a.spec().intra_op_threads()
                                                    : std::max(1, options.default_threads));
  ScopedPhase loading(hooks.phases, Phase::kData);
  Prepared p;
  absl::Status s = Prepare(a, options, hooks, p);
  // Destroyed after the result is stamped (with the group and the model): the wall time
  // excludes their teardown.
  std::optional<TrainingLoop> loop;
  if (s.ok()) {
    result.set_train_examples(p.splits.train.size);
    result.set_dataset_train_examples(p.splits.train_examples_before_fraction);
    if (a.spec().algorithm() == "ga") {
      torch::Tensor winner;
      s = RunGeneticAlgorithm(a, hooks, *p.pg, CheckpointDirectory(options.checkpoint_root, a),
                              std::max(p.splits.train.classes, p.splits.test.classes),
                              ImagesTensor(p.splits.train), LabelsTensor(p.splits.train),
                              ImagesTensor(p.splits.test), LabelsTensor(p.splits.test), result,
                              &winner);
      if (s.ok() && a.spec().keep_model() && a.rank() == 0) {
        KeepGaModel(a, options, hooks, winner, *p.model, result);
      }
    } else {
      loop.emplace(a, options, hooks, p.splits, *p.pg, *p.model, p.device, wall_start, result);
      s = loop->Run();
    }
  }
  if (!s.ok()) {
    result.set_ok(false);
    result.set_error(std::string(s.message()));
    result.set_error_code(static_cast<int32_t>(s.code()));
  }
  result.set_wall_seconds(SecondsSince(wall_start));
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
