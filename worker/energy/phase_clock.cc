#include "worker/energy/phase_clock.h"

namespace joule::worker {

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kData: return "data";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kCommunication: return "communication";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kEvaluation: return "evaluation";
    case Phase::kCheckpoint: return "checkpoint";
    case Phase::kIdle: return "idle";
    case Phase::kStaging: return "staging";
  }
  return "idle";
}

v1::RankPhase RankPhaseOf(Phase phase) {
  switch (phase) {
    case Phase::kData: return v1::RANK_PHASE_DATA;
    case Phase::kForward: return v1::RANK_PHASE_FORWARD;
    case Phase::kBackward: return v1::RANK_PHASE_BACKWARD;
    case Phase::kCommunication: return v1::RANK_PHASE_COMMUNICATION;
    case Phase::kOptimizer: return v1::RANK_PHASE_OPTIMIZER;
    case Phase::kEvaluation: return v1::RANK_PHASE_EVALUATION;
    case Phase::kCheckpoint: return v1::RANK_PHASE_CHECKPOINT;
    case Phase::kIdle: return v1::RANK_PHASE_UNSPECIFIED;
    case Phase::kStaging: return v1::RANK_PHASE_STAGING;
  }
  return v1::RANK_PHASE_UNSPECIFIED;
}

PhaseClock::PhaseClock(const Clock* clock) : clock_(clock), since_(clock->Now()) {}

void PhaseClock::Enter(Phase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::TimePoint now = clock_->Now();  // under the lock: time never runs backwards
  acc_[static_cast<int>(phase_)] += Seconds(now - since_);
  phase_ = phase;
  since_ = now;
}

Phase PhaseClock::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

PhaseSeconds PhaseClock::TakeInterval() {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::TimePoint now = clock_->Now();
  acc_[static_cast<int>(phase_)] += Seconds(now - since_);
  since_ = now;
  PhaseSeconds out = acc_;
  acc_.fill(0);
  return out;
}

}  // namespace joule::worker
