#ifndef JOULE_SERVER_JOB_PROGRESS_H_
#define JOULE_SERVER_JOB_PROGRESS_H_
// The job's progress as clients see it (v1::JobProgress), built from what its ranks send
// (v1::RankProgress, v1::Heartbeat's RankPhase). One writer: the coordinator, under its
// lock. Pure functions; thread-compatible.
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"

namespace joule::server {

// Rank 0's report becomes the job's view: every RankProgress field is copied to the
// JobProgress field of the same number (job.proto keeps the numbers the same; a test
// checks every field's name and type). What only the coordinator knows is kept: the job's
// energy over all ranks and attempts, the budget's share and warning, the straggler, and
// the phase, which becomes TRAINING at rank 0's first step when no heartbeat has told it
// yet (a rank sends no progress while it evaluates or writes a checkpoint).
void ApplyRankProgress(const v1::RankProgress& rank0, v1::JobProgress* shown);

// A rank's phase as the job's: data, forward, backward, communication and optimizer are
// TRAINING; evaluation and checkpoint are themselves; idle (or a value this build does not
// know) is UNSPECIFIED.
v1::JobPhase JobPhaseOf(v1::RankPhase phase);

}  // namespace joule::server

#endif  // JOULE_SERVER_JOB_PROGRESS_H_
