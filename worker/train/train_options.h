#ifndef JOULE_WORKER_TRAIN_TRAIN_OPTIONS_H_
#define JOULE_WORKER_TRAIN_TRAIN_OPTIONS_H_

// What a training attempt is given: the worker's options and the hooks into the agent
// (the rendezvous, progress, cancellation, energy). Plain types (no LibTorch): the agent
// fills them.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "worker/comm/process_group.h"
#include "worker/energy/phase_clock.h"

namespace joule::worker {

struct TrainerOptions {
  // Durations (steps, epochs, the attempt's wall time) and progress reports read this
  // clock's steady time; not owned, outlives the attempt.
  const joule::Clock* clock = joule::Clock::Real();
  // Root under which named datasets ("fashion-mnist") are found.
  std::string data_root = "/usr/share/datasets";
  // Node-local scratch for JobSpec.stage "local": the copies go to
  // SCRATCH/joule-stage/job-<id>[-<uid>]. Empty: $TMPDIR, else /tmp.
  std::string scratch_dir;
  // Intra-op threads when the spec leaves intra_op_threads at 0.
  int default_threads = 1;
  // How often on_progress is called, at most.
  double progress_period_seconds = 1.0;
  // Where job checkpoints live: ROOT/job-<id>/ckpt-*.jck. Ranks of one job read the same
  // directory, so on several hosts it must be shared storage. Empty: no checkpoints.
  std::string checkpoint_root;
  // When not empty, files a spec names (idx:/csv: data, torchscript: models) must lie
  // under one of these directories on this worker too, checked before they are opened
  // (the coordinator checks its own --data-roots at submit; this guards a worker against
  // a coordinator it does not trust, or one whose filesystem differs). Violations fail the
  // attempt with PERMISSION_DENIED.
  std::vector<std::string> allowed_roots;
  // Bytes each pair of ranks exchanges, both ways at once, to time its link when the
  // process group connects (ProcessGroup::ProbeLinks); 0 turns the probe off. 1 MiB takes
  // about 84 ms on a 100 Mbit/s link, well under a millisecond on loopback.
  int64_t link_probe_bytes = int64_t{1} << 20;
};

struct TrainHooks {
  // Builds the gang's process group (the rendezvous). Called once, after the data loaded.
  // The caller may keep a reference to Abort() it from another thread.
  std::function<absl::StatusOr<std::shared_ptr<ProcessGroup>>()> connect;
  // Publishes `value` as this rank's and returns every rank's, in rank order (through
  // the rendezvous store). Used to compare model fingerprints; may be empty (no check).
  std::function<absl::StatusOr<std::vector<std::string>>(const std::string& value)> allgather;
  // Called on the training thread about every progress_period_seconds and after each
  // evaluation. May be empty.
  std::function<void(const v1::RankProgress&)> on_progress;
  // Polled before every step; true stops the attempt (result: cancelled).
  std::function<bool()> cancelled;
  // Stamped with the phase the training thread is in (data, forward, backward,
  // communication, optimizer, evaluation, idle). May be null.
  PhaseClock* phases = nullptr;
  // After every step: local samples, wall seconds of the step, its loss. May be empty.
  std::function<void(int64_t samples, double seconds, double loss)> on_step;
  // After every collective: its name ("allreduce", "broadcast"), bytes of this rank's
  // buffer, wall seconds. May be empty.
  std::function<void(const char* op, int64_t bytes, double seconds)> on_collective;
  // This rank's energy in the attempt so far, joules (the meter's job totals), recorded
  // at every epoch's end in RankResult.history. May be empty (0 recorded).
  std::function<double()> energy_joules;
  // A graceful stop was asked (CancelAttempt.checkpoint: the job's energy budget is
  // spent). Polled by every rank; see kStopCheckInterval. May be empty.
  std::function<bool()> stop_requested;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_TRAIN_TRAIN_OPTIONS_H_
