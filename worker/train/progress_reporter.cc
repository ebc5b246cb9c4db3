#include "worker/train/progress_reporter.h"

#include <utility>

namespace joule::worker {
namespace {

double SecondsOf(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

ProgressReporter::ProgressReporter(Sink sink, double period_seconds, int64_t global_batch,
                                   int64_t steps_per_epoch, int64_t first_step,
                                   double test_accuracy, const joule::Clock& clock,
                                   std::chrono::steady_clock::time_point start)
    : sink_(std::move(sink)),
      period_seconds_(period_seconds),
      global_batch_(global_batch),
      clock_(clock),
      start_(start),
      last_report_(clock.Now()),
      samples_at_report_(first_step * global_batch) {
  progress_.set_steps_per_epoch(steps_per_epoch);
  progress_.set_test_accuracy(test_accuracy);
}

void ProgressReporter::SetEvaluation(double accuracy, double loss) {
  progress_.set_test_accuracy(accuracy);
  progress_.set_test_loss(loss);
}

void ProgressReporter::AddStep(double loss, double step_seconds, double wait_seconds) {
  window_loss_ += loss;
  window_step_seconds_ += step_seconds;
  window_wait_seconds_ += wait_seconds;
  ++window_steps_;
}

void ProgressReporter::Send(bool force, int64_t step, double trained_seconds) {
  if (!sink_) return;
  const double since = SecondsOf(clock_.Now() - last_report_);
  if (!force && since < period_seconds_) return;
  const int64_t samples = step * global_batch_;
  progress_.set_step(step);
  progress_.set_samples(samples);
  // An empty window keeps the last loss, a window without training time the last rate.
  if (window_steps_ > 0) {
    progress_.set_loss(window_loss_ / window_steps_);
    progress_.set_step_seconds(window_step_seconds_ / window_steps_);
    progress_.set_collective_wait_seconds(window_wait_seconds_ / window_steps_);
  }
  const double dt = trained_seconds - trained_seconds_at_report_;
  if (dt > 0) progress_.set_samples_per_second((samples - samples_at_report_) / dt);
  progress_.set_elapsed_seconds(SecondsOf(clock_.Now() - start_));
  sink_(progress_);
  last_report_ = clock_.Now();
  samples_at_report_ = samples;
  trained_seconds_at_report_ = trained_seconds;
  window_loss_ = 0;
  window_step_seconds_ = 0;
  window_wait_seconds_ = 0;
  window_steps_ = 0;
}

}  // namespace joule::worker
