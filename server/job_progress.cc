#include "server/job_progress.h"

#include <string>
#include <utility>
#include <vector>

namespace joule::server {

void ApplyRankProgress(const v1::RankProgress& rank0, v1::JobProgress* shown) {
  // The coordinator's own fields, put back after the copy.
  const double job_joules = shown->job_energy_joules();
  const double budget_used = shown->energy_budget_used();
  const bool budget_warning = shown->budget_warning();
  const bool has_straggler = shown->has_straggler();
  v1::Straggler straggler = has_straggler ? shown->straggler() : v1::Straggler();
  const v1::JobPhase phase = shown->phase();
  const double job_watts = shown->job_power_watts();
  const std::vector<double> rank_watts(shown->rank_power_watts().begin(),
                                       shown->rank_power_watts().end());
  // Same field numbers and types (job.proto): the wire form of one is the other's.
  shown->Clear();
  shown->ParseFromString(rank0.SerializeAsString());
  shown->set_job_energy_joules(job_joules);
  shown->set_energy_budget_used(budget_used);
  shown->set_budget_warning(budget_warning);
  if (has_straggler) *shown->mutable_straggler() = std::move(straggler);
  shown->set_job_power_watts(job_watts);
  shown->mutable_rank_power_watts()->Assign(rank_watts.begin(), rank_watts.end());
  shown->set_phase(phase == v1::JOB_PHASE_UNSPECIFIED && rank0.step() > 0 ? v1::JOB_PHASE_TRAINING
                                                                          : phase);
}

v1::JobPhase JobPhaseOf(v1::RankPhase phase) {
  switch (phase) {
    case v1::RANK_PHASE_DATA:
    case v1::RANK_PHASE_FORWARD:
    case v1::RANK_PHASE_BACKWARD:
    case v1::RANK_PHASE_COMMUNICATION:
    case v1::RANK_PHASE_OPTIMIZER:
      return v1::JOB_PHASE_TRAINING;
    case v1::RANK_PHASE_EVALUATION:
      return v1::JOB_PHASE_EVALUATION;
    case v1::RANK_PHASE_CHECKPOINT:
      return v1::JOB_PHASE_CHECKPOINT;
    case v1::RANK_PHASE_STAGING:
      return v1::JOB_PHASE_STAGING;
    default:
      return v1::JOB_PHASE_UNSPECIFIED;
  }
}

}  // namespace joule::server
