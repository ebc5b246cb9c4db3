#ifndef JOULE_WORKER_ENERGY_PHASE_CLOCK_H_
#define JOULE_WORKER_ENERGY_PHASE_CLOCK_H_

#include <array>
#include <mutex>
#include <string>

#include "joule/v1/worker.pb.h"
#include "worker/energy/clock.h"

namespace joule::worker {

// The phases of training that energy is attributed to (DESIGN.md, Energy).
enum class Phase {
  kData = 0,
  kForward,
  kBackward,
  kCommunication,
  kOptimizer,
  kEvaluation,
  kCheckpoint,
  kIdle,
  kStaging,  // copying the job's data to node-local disk (JobSpec.stage)
};
inline constexpr int kPhaseCount = 9;
const char* PhaseName(Phase phase);
// The phase as the heartbeat sends it (worker.proto RankPhase); kIdle is UNSPECIFIED.
v1::RankPhase RankPhaseOf(Phase phase);

using PhaseSeconds = std::array<double, kPhaseCount>;

// Stamps which phase the training thread is in. The training thread calls Enter() at each
// phase change; the energy sampler calls TakeInterval() once per sampling interval to learn
// how long each phase lasted since its previous call (the phase in progress is split at
// the call). Starts in kIdle.
//
// Thread-safe: one mutex, held for a few instructions per call.
class PhaseClock {
 public:
  explicit PhaseClock(const Clock* clock);
  void Enter(Phase phase);
  Phase current() const;
  // Seconds spent in each phase since the previous TakeInterval (or construction).
  PhaseSeconds TakeInterval();

 private:
  const Clock* clock_;
  mutable std::mutex mu_;
  Phase phase_ = Phase::kIdle;
  Clock::TimePoint since_;  // when phase_ was entered or last split
  PhaseSeconds acc_{};
};

// Enters `phase` for the scope, then returns to the phase that was current before.
class ScopedPhase {
 public:
  ScopedPhase(PhaseClock* clock, Phase phase) : clock_(clock) {
    if (clock_) {
      previous_ = clock_->current();
      clock_->Enter(phase);
    }
  }
  ~ScopedPhase() {
    if (clock_) clock_->Enter(previous_);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseClock* clock_;
  Phase previous_ = Phase::kIdle;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_PHASE_CLOCK_H_
