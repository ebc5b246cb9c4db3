#ifndef JOULE_WORKER_TRAIN_PROGRESS_REPORTER_H_
#define JOULE_WORKER_TRAIN_PROGRESS_REPORTER_H_

#include <chrono>
#include <cstdint>
#include <functional>

#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "common/clock.h"

namespace joule::worker {

// What an attempt tells the coordinator while it trains (TrainHooks::on_progress): a
// v1::RankProgress holding the step, the samples (steps x global batch), the mean loss
// over the steps since the last report (a window), the training throughput since the last
// report (samples per second of training-loop time, evaluation excluded), the current
// epoch and the last evaluation. Reports come at most every `period_seconds` from
// MaybeReport, and whenever Report is called (after each evaluation).
//
// Reads time only from `clock` (its steady time: Clock::Real() in production, a fake in
// tests). Owned by
// the training thread; not thread-safe.
class ProgressReporter {
 public:
  using Sink = std::function<void(const v1::RankProgress&)>;
  // `sink` may be empty: then nothing is reported. `start`: when the attempt started on
  // `clock` (elapsed_seconds counts from it). `first_step`: global steps already done
  // (a resumed attempt), from which the first throughput is measured. `test_accuracy`:
  // the last evaluation's before any in this attempt (-1: none). `clock` must outlive
  // this object. The first period starts now.
  ProgressReporter(Sink sink, double period_seconds, int64_t global_batch,
                   int64_t steps_per_epoch, int64_t first_step, double test_accuracy,
                   const joule::Clock& clock, std::chrono::steady_clock::time_point start);

  // `epoch` is 1-based, as shown.
  void SetEpoch(int epoch) { progress_.set_epoch(epoch); }
  void SetEvaluation(double accuracy, double loss);
  // Adds one step's loss, its length and its wait at the gradient allreduce (seconds) to
  // the window.
  void AddStep(double loss, double step_seconds = 0, double wait_seconds = 0);
  // The links probed at connect, sent with every report.
  void SetLinks(const google::protobuf::RepeatedPtrField<v1::LinkThroughput>& links) {
    *progress_.mutable_links() = links;
  }
  // Reports if period_seconds have passed since the last report. `step`: global steps
  // done; `trained_seconds`: seconds of training loop in this attempt so far.
  void MaybeReport(int64_t step, double trained_seconds) { Send(false, step, trained_seconds); }
  // Reports now.
  void Report(int64_t step, double trained_seconds) { Send(true, step, trained_seconds); }

  // What was last reported, or is about to be (test accuracy and loss are current).
  const v1::RankProgress& progress() const { return progress_; }

 private:
  void Send(bool force, int64_t step, double trained_seconds);

  Sink sink_;
  double period_seconds_;
  int64_t global_batch_;
  const joule::Clock& clock_;
  std::chrono::steady_clock::time_point start_;
  v1::RankProgress progress_;
  double window_loss_ = 0;
  int64_t window_steps_ = 0;
  double window_step_seconds_ = 0, window_wait_seconds_ = 0;
  std::chrono::steady_clock::time_point last_report_;
  int64_t samples_at_report_;
  double trained_seconds_at_report_ = 0;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_PROGRESS_REPORTER_H_
