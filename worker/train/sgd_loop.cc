#include "worker/train/sgd_loop.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "worker/train/checkpoint.h"
#include "worker/train/checkpoint_assembly.h"
#include "worker/train/evaluation.h"
#include "worker/train/resume_point.h"

namespace joule::worker {
namespace {

// What an epoch's history keeps of an evaluation.
SplitEvaluation Kept(const EvalResult& e) {
  SplitEvaluation kept;
  kept.accuracy = e.accuracy;
  kept.loss = e.loss;
  kept.top_k_accuracy = e.top_k_accuracy;
  kept.rmse = e.rmse;
  return kept;
}

// The decoder of a file-backed split (null for one in memory): the job's transforms and
// seed, spec.data_threads threads (0: the worker's default thread count, cores / workers
// on the host), files opened beneath the worker's roots.
std::unique_ptr<ImageBatchLoader> MakeImageLoader(const AttemptContext& ctx,
                                                  const ImageDataset& split) {
  if (!split.file_backed()) return nullptr;
  const v1::JobSpec& spec = ctx.spec();
  ImageBatchOptions o;
  o.transform = ImageTransformOptions::FromSpec(spec.augment());
  o.seed = spec.seed();
  o.threads = spec.data_threads() > 0 ? spec.data_threads()
                                      : std::max(1, ctx.options.default_threads);
  o.max_corrupt = spec.has_max_corrupt_images() ? spec.max_corrupt_images() : 10;
  o.open = MakeFileOpener(ctx.options.allowed_roots);
  return std::make_unique<ImageBatchLoader>(split, std::move(o));
}

}  // namespace

TrainingLoop::TrainingLoop(const AttemptContext& ctx, Splits& splits, Model& model,
                           const torch::Device& device)
    : ctx_(ctx),
      a_(ctx.assignment),
      spec_(ctx.spec()),
      options_(ctx.options),
      hooks_(ctx.hooks),
      pg_(ctx.pg),
      model_(model),
      device_(device),
      result_(ctx.result),
      tensors_(CollectModelTensors(model)),
      optimizer_(tensors_.parameters, OptimizerOptions::FromSpec(spec_.optimizer())),
      exchange_(tensors_.parameter_count(), ctx.hooks.on_collective, ctx.clock),
      ckpt_dir_(ctx.checkpoint_dir),
      spec_hash_(SpecHash(spec_)),
      train_x_(ImagesTensor(splits.train)),
      train_y_(LabelsTensor(splits.train)),
      test_x_(ImagesTensor(splits.test)),
      test_y_(LabelsTensor(splits.test)),
      train_images_(MakeImageLoader(ctx, splits.train)),
      test_images_(MakeImageLoader(ctx, splits.test)),
      sharder_(splits.train.sharded ? EpochSharder::Local(splits.train.size, splits.train.min_shard,
                                                          spec_.global_batch_size(), a_.rank(),
                                                          a_.world_size(), spec_.seed())
                                    : EpochSharder(splits.train.size, spec_.global_batch_size(),
                                                   a_.rank(), a_.world_size(), spec_.seed())),
      sharded_(splits.train.sharded),
      prefetch_([this](const std::vector<int64_t>& indices,
                       int64_t epoch) -> absl::StatusOr<BatchPrefetcher::Batch> {
        if (train_images_) return train_images_->Train(indices, epoch);
        torch::Tensor idx = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                             {static_cast<int64_t>(indices.size())}, torch::kLong);
        return BatchPrefetcher::Batch{train_x_.index_select(0, idx), train_y_.index_select(0, idx)};
      }),
      lr_(spec_, sharder_.steps_per_epoch()),
      regression_loss_(RegressionLoss::FromSpec(spec_, splits.train.target_shape, device)),
      schedule_(spec_.sync(), a_.world_size()) {}

absl::Status TrainingLoop::Run() {
  // Every rank holds the same spec and shapes: a refusal is every rank's.
  if (!regression_loss_.ok()) return regression_loss_.status();
  if (absl::Status s = StartFromRankZero(); !s.ok()) return s;
  // Gradients are averaged in buckets overlapped with backward on the CPU, in one flat
  // allreduce on a GPU (GradientSync).
  absl::StatusOr<std::unique_ptr<GradientSync>> sync =
      MakeGradientSync(tensors_.parameters, tensors_.parameter_names, spec_.seed(), spec_.sync(),
                       pg_, device_, hooks_.phases);
  if (!sync.ok()) return sync.status();
  sync_ = *std::move(sync);
  if (sync_ && sync_->has_checkpoint_state()) {
    // Rank 0 read it with the checkpoint (StartFromRankZero); every rank takes its part.
    ScopedPhase comm(hooks_.phases, Phase::kCommunication);
    if (absl::Status s = sync_->RestoreState(0, a_.rank() == 0 ? &sync_state_ : nullptr, step_);
        !s.ok()) {
      return s;
    }
    sync_state_.Clear();
  }
  reporter_.emplace(hooks_.on_progress, options_.progress_period_seconds,
                    spec_.global_batch_size(), sharder_.steps_per_epoch(), step_,
                    resumed_accuracy_, ctx_.clock, ctx_.wall_start);
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
absl::StatusOr<bool> TrainingLoop::StopAgreed(bool last_of_epoch) {
  if (spec_.energy_budget_joules() <= 0) return false;
  if (step_ % kStopCheckInterval != 0 && !last_of_epoch) return false;
  return AgreeToStop(ctx_);
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
// optimizer state and statistics.
absl::Status TrainingLoop::StartFromRankZero() {
  std::optional<ResumePoint> point;
  if (a_.rank() == 0) {
    absl::StatusOr<std::optional<ResumePoint>> restored = RestoreNewestCheckpoint(
        ckpt_dir_, spec_hash_, a_.job_id(), tensors_, optimizer_, &sync_state_);
    if (!restored.ok()) return restored.status();
    point = *restored;
    // None of its own yet: the job it starts from (spec.resume_from_job), whose
    // directory is its sibling under the same checkpoint root.
    if (!point.has_value() && a_.resume_from_job_id() > 0 && !ckpt_dir_.empty()) {
      const std::string from =
          CheckpointDirectory(std::filesystem::path(ckpt_dir_).parent_path().string(),
                              a_.resume_from_job_id(), a_.resume_from_job_uid());
      restored = RestoreNewestCheckpoint(from, spec_hash_, a_.job_id(), tensors_, optimizer_,
                                         &sync_state_);
      if (!restored.ok()) return restored.status();
      if (!restored->has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat("resume_from_job ", a_.resume_from_job_id(), ": no checkpoint of it in ",
                         from, " (did it run with keep_model, under this checkpoint root?)"));
      }
      point = *restored;
      spdlog::info("job {}: starting from job {}'s checkpoint at step {}", a_.job_id(),
                   a_.resume_from_job_id(), point->global_step);
    }
  }
  ScopedPhase comm(hooks_.phases, Phase::kCommunication);
  if (absl::Status s = BroadcastResumePoint(pg_, 0, &point); !s.ok()) return s;
  if (point.has_value()) {
    start_epoch_ = point->next_epoch;
    start_step_in_epoch_ = point->next_step_in_epoch;
    step_ = point->global_step;
    // One optimizer step per global step: adamw's bias correction goes on from there.
    optimizer_.set_steps(point->has_optimizer_state ? point->global_step : 0);
    resumed_accuracy_ = point->test_accuracy;
    if (point->has_plateau) lr_.set_plateau(point->plateau);
    result_.set_resumed_from_step(step_);
    result_.set_test_accuracy(resumed_accuracy_);
    if (a_.rank() == 0) {
      spdlog::info("job {}: resuming from the checkpoint at step {} (epoch {}, step {})",
                   a_.job_id(), step_, start_epoch_ + 1, start_step_in_epoch_);
    }
  }
  first_step_ = step_;
  if (absl::Status s = exchange_.Broadcast(pg_, tensors_.parameters); !s.ok()) return s;
  for (std::vector<torch::Tensor>& slot : optimizer_.state()) {
    if (absl::Status s = exchange_.Broadcast(pg_, slot); !s.ok()) return s;
  }
  return SyncTensors(pg_, tensors_.statistics, /*average=*/false);
}

absl::Status TrainingLoop::TrainEpoch(int epoch) {
  reporter_->SetEpoch(epoch + 1);
  sharder_.StartEpoch(epoch);
  const int64_t steps = sharder_.steps_per_epoch();
  const int64_t first = epoch == start_epoch_ ? start_step_in_epoch_ : 0;
  prefetch_.Clear();
  for (int64_t k = first; k < std::min(first + kPrefetchDepth, steps); ++k) {
    prefetch_.Submit(sharder_.Batch(k), epoch);
  }
  const auto epoch_start = ctx_.clock.Now();
  for (int64_t s = first; s < steps; ++s) {
    if (hooks_.cancelled && hooks_.cancelled()) {
      result_.set_cancelled(true);
      return absl::CancelledError("cancelled");
    }
    const auto step_start = ctx_.clock.Now();
    Enter(Phase::kData);
    absl::StatusOr<BatchPrefetcher::Batch> batch = prefetch_.Next();
    if (!batch.ok()) return batch.status();
    if (s + kPrefetchDepth < steps) prefetch_.Submit(sharder_.Batch(s + kPrefetchDepth), epoch);
    absl::StatusOr<StepOutcome> outcome = Step(batch->first, batch->second);
    if (!outcome.ok()) return outcome.status();
    const double step_seconds = Since(step_start);
    if (hooks_.on_step) hooks_.on_step(sharder_.local_batch(), step_seconds, outcome->loss);
    reporter_->AddStep(outcome->loss, step_seconds, outcome->wait_seconds);
    step_seconds_sum_ += step_seconds;
    wait_seconds_sum_ += outcome->wait_seconds;
    ++timed_steps_;
    epoch_loss_sum_ += outcome->loss;
    ++epoch_loss_steps_;
    reporter_->MaybeReport(step_, train_seconds_ + Since(epoch_start));
    absl::StatusOr<bool> stop = StopAgreed(s + 1 == steps);
    if (!stop.ok()) return stop.status();
    if (*stop) {
      train_seconds_ += Since(epoch_start);
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
  train_seconds_ += Since(epoch_start);
  return absl::OkStatus();
}

// Forward and backward over the rank's share in micro-batches (gradient accumulation:
// each loss scaled so that the gradient is the mean over the share), the gradients
// averaged over ranks unless local SGD skips it, the optimizer's update, and under local SGD the
// periodic averaging of parameters. Gradients are zero on entry: Optimizer::Step clears them
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
    torch::Tensor out = model_.Forward(x);
    // Float labels are a regression's targets (hdf5:): the mean squared error.
    torch::Tensor micro_loss = y.is_floating_point() ? regression_loss_->Mean(out, y)
                                                     : torch::nn::functional::cross_entropy(out, y);
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
    const auto t0 = ctx_.clock.Now();
    if (absl::Status s = sync_->Finish(); !s.ok()) return s;
    wait_seconds = Since(t0);
    if (hooks_.on_collective) {
      hooks_.on_collective("allreduce", sync_->bytes_per_step(), wait_seconds);
    }
  }
  Enter(Phase::kOptimizer);
  optimizer_.Step(lr_now);
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
  absl::StatusOr<EvalResult> eval = EvaluateSplit(/*train=*/false);
  if (!eval.ok()) return eval.status();
  reporter_->SetEvaluation(eval->accuracy, eval->loss);
  result_.set_test_accuracy(eval->accuracy);
  result_.set_test_loss(eval->loss);
  result_.set_test_top_k_accuracy(eval->top_k_accuracy);
  if (a_.rank() == 0 && eval->rmse >= 0) {
    spdlog::info("job {} rank {}: epoch {}/{} test {} {:.6g} RMSE {:.6g}", a_.job_id(), a_.rank(),
                 epoch + 1, spec_.epochs(), spec_.loss(), eval->loss, eval->rmse);
  } else if (a_.rank() == 0) {
    spdlog::info("job {} rank {}: epoch {}/{} test accuracy {:.4f} loss {:.4f}", a_.job_id(),
                 a_.rank(), epoch + 1, spec_.epochs(), eval->accuracy, eval->loss);
  }
  // The training split too, when asked (every rank its strided shard, like the test's).
  SplitEvaluation train_eval;
  if (spec_.evaluate_train()) {
    absl::StatusOr<EvalResult> t = EvaluateSplit(/*train=*/true);
    if (!t.ok()) return t.status();
    train_eval = Kept(*t);
    if (a_.rank() == 0) {
      spdlog::info("job {} rank {}: epoch {}/{} train accuracy {:.4f} loss {:.4f}", a_.job_id(),
                   a_.rank(), epoch + 1, spec_.epochs(), t->accuracy, t->loss);
    }
  }
  // The epoch's rate, then the schedule's step on its evaluation (every rank sees the same
  // allreduced loss), before the checkpoint that keeps it.
  const double epoch_lr = lr_.At(std::max<int64_t>(0, step_ - 1));
  lr_.OnEvaluation(epoch, eval->loss);
  const bool every_epochs = spec_.checkpoint_every_epochs() > 0 &&
                            (epoch + 1) % spec_.checkpoint_every_epochs() == 0;
  const bool every_steps_crossed = spec_.checkpoint_every_steps() > 0;
  const bool final_kept = spec_.keep_model() && epoch + 1 == spec_.epochs();
  if (((every_epochs || every_steps_crossed) && epoch + 1 < spec_.epochs()) || final_kept) {
    if (absl::Status s = GatherSyncState(); !s.ok()) return s;
    if (absl::Status s = SaveCheckpoint(epoch + 1, 0, tensors_.statistics); !s.ok()) {
      spdlog::warn("job {}: checkpoint after epoch {} failed: {}", a_.job_id(), epoch + 1,
                   s.ToString());
    }
  }
  checkpoint_due_ = false;  // the epoch's end is a checkpoint (or the job's end)
  // -1: no step of this epoch ran in this attempt (resumed at its end).
  RecordEpoch(ctx_, epoch + 1, step_, step_ * spec_.global_batch_size(),
              epoch_loss_steps_ > 0 ? epoch_loss_sum_ / epoch_loss_steps_ : -1, epoch_lr,
              Kept(*eval), train_eval);
  epoch_loss_sum_ = 0;
  epoch_loss_steps_ = 0;
  reporter_->Report(step_, train_seconds_);
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> TrainingLoop::EvaluateSplit(bool train) {
  EvalOptions options;
  options.top_k = spec_.top_k();
  options.local = sharded_;
  options.regression_loss = &*regression_loss_;
  ImageBatchLoader* images = train ? train_images_.get() : test_images_.get();
  if (images == nullptr) {
    return train ? Evaluate(model_, train_x_, train_y_, pg_, device_, options)
                 : Evaluate(model_, test_x_, test_y_, pg_, device_, options);
  }
  // Decoded a chunk at a time: a local batch's worth, at least 16 images.
  const int64_t chunk = std::max<int64_t>(16, spec_.local_batch_size());
  return Evaluate(
      model_, images->size(),
      [images](const std::vector<int64_t>& indices) { return images->Eval(indices); }, chunk, pg_,
      device_, options);
}

// Local SGD: every rank's parameters (and optimizer state, if asked and started) become their
// average.
absl::Status TrainingLoop::AverageParameters() {
  ScopedPhase comm(hooks_.phases, Phase::kCommunication);
  if (absl::Status s = exchange_.Average(pg_, tensors_.parameters); !s.ok()) return s;
  if (!(spec_.sync().average_momentum() && optimizer_.started())) return absl::OkStatus();
  for (std::vector<torch::Tensor>& slot : optimizer_.state()) {
    if (absl::Status s = exchange_.Average(pg_, slot); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A checkpoint within an epoch, at a step after which the ranks hold equal parameters.
// The statistics are averaged into copies: the model's own go on as without checkpoints.
// Only a failed collective is an error; a failed write is logged.
absl::Status TrainingLoop::SaveStepCheckpoint(int epoch, int64_t next_step_in_epoch,
                                              bool* written) {
  std::vector<torch::Tensor> averaged_stats;
  for (const auto& t : tensors_.statistics) averaged_stats.push_back(t.detach().clone());
  if (absl::Status s = SyncTensors(pg_, averaged_stats, /*average=*/true); !s.ok()) return s;
  if (absl::Status s = GatherSyncState(); !s.ok()) return s;
  absl::Status saved = SaveCheckpoint(epoch, next_step_in_epoch, averaged_stats);
  if (!saved.ok()) {
    spdlog::warn("job {}: checkpoint at step {} failed: {}", a_.job_id(), step_, saved.ToString());
  }
  if (written) *written = saved.ok() && !ckpt_dir_.empty();
  return absl::OkStatus();
}

absl::Status TrainingLoop::GatherSyncState() {
  if (!sync_ || !sync_->has_checkpoint_state()) return absl::OkStatus();
  ScopedPhase comm(hooks_.phases, Phase::kCommunication);
  return sync_->GatherState(0, &sync_state_);
}

// Rank 0 saves; the others go on (they wait for it at the next collective).
absl::Status TrainingLoop::SaveCheckpoint(int next_epoch, int64_t next_step_in_epoch,
                                          const std::vector<torch::Tensor>& statistics) {
  if (a_.rank() != 0 || ckpt_dir_.empty()) {
    sync_state_.Clear();  // gathered for a file that is not written
    return absl::OkStatus();
  }
  ScopedPhase save(hooks_.phases, Phase::kCheckpoint);
  CheckpointPosition position{next_epoch, next_step_in_epoch, step_,
                              reporter_->progress().test_accuracy(),
                              reporter_->progress().test_loss(), /*plateau=*/std::nullopt};
  if (lr_.is_plateau()) position.plateau = lr_.plateau();
  absl::Status written = WriteCheckpoint(
      ckpt_dir_,
      AssembleCheckpoint(a_, spec_hash_, position, tensors_, optimizer_, statistics, &sync_state_),
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

}  // namespace joule::worker
