#ifndef JOULE_SERVER_ATTEMPT_H_
#define JOULE_SERVER_ATTEMPT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"

namespace joule::server {

// A job's attempts as pure functions on the Job message: what starting, ending,
// re-queueing and completing an attempt does to it, and the totals derived from every
// attempt. No clock, no I/O, no locks: the Coordinator passes times in and stores the
// result. Thread-compatible.

// The outcome of an attempt that ends its job in `state` (SUCCEEDED, FAILED, CANCELLED,
// BUDGET_EXCEEDED); UNSPECIFIED for a state no job ends in.
v1::AttemptOutcome AttemptOutcomeOf(v1::JobState state);

// Failures that another attempt would meet again (bad input, bad data, ranks that
// disagree, out of memory): not retried.
bool IsRetryable(absl::StatusCode code);

// How well an error explains why an attempt failed: a rank's own failure (3: one no
// retry gets past; 2: any other, e.g. an internal error) explains more than what its
// peers saw when it left (1: aborted, unavailable, deadline), and a cancellation (0)
// explains nothing.
int RootCauseWeight(absl::StatusCode code);

// Starts attempt `job.attempt() + 1` on `workers` (in rank order): RUNNING, a fresh
// result that keeps what earlier attempts left (why they failed, what they did and
// spent), fresh progress.
void StartAttempt(v1::Job& job, const std::vector<std::string>& workers, int64_t now_unix_ms,
                  double grid_gco2_per_kwh);

// Ends the running attempt's accounting: its summary (wall time as measured by the
// caller's steady clock, the rank results it got) joins result.attempts; totals are
// rebuilt. The job's state is the caller's to set.
// `reason_code`: the google.rpc.Code of the rank error `reason` quotes (OK for one that
// quotes none, e.g. a lost worker), used to tell a root cause from a symptom later.
void CloseAttempt(v1::Job& job, v1::AttemptOutcome outcome, const std::string& reason,
                  absl::StatusCode reason_code, double wall_seconds, double grid_gco2_per_kwh);

// After CloseAttempt of a failed attempt that restarts remain for: PENDING, the reason
// recorded in failed_attempts and shown as "attempt K failed (...); restart N of M
// queued", no finish time.
void Requeue(v1::Job& job, const std::string& reason, int64_t now_unix_ms);

// What rank `rank` of the job's current attempt is told: the job, attempt, rank, world
// size (the gang's), spec, uid and its rendezvous scope.
v1::Assignment AssignmentFor(const v1::Job& job, int32_t rank, int32_t world_size,
                             const std::string& rendezvous_prefix);

// Why a pending job waits, as its reason says: the scheduler's `waiting`, after which
// restart of how many and its cause when an attempt failed, or the coordinator restart
// that re-queued it when one ran and none failed.
std::string WaitingReason(const v1::Job& job, const std::string& waiting);

// Every rank of the running attempt succeeded: the job's figures from its ranks (rank 0's
// accuracy and steps, the slowest rank's training time, this attempt's throughput).
// Returns why it must fail instead, when the ranks ended with different parameters
// (data parallelism means one model).
std::optional<std::string> CompleteRanks(v1::Job& job);

// Adds a rank's result to the attempt it belongs to, which has ended (result.attempts);
// false when there is no such attempt or that rank is counted already. A rank's own
// error that explains more (RootCauseWeight) than the recorded one becomes the attempt's
// reason, in failed_attempts and, for the attempt the job last ran, the job's reason
// (keeping its "(after N restarts)"). A job re-queued after that attempt, whose late rank
// failed in a way no retry gets past, is the caller's to end (see IsRetryable).
bool MergeLateResult(v1::Job& job, int32_t rank, const std::string& worker_id,
                     const v1::ResultReport& report, double grid_gco2_per_kwh);

// What a rank's result may carry into the job (a worker is not trusted to be sane):
// history records of epochs 1..spec.epochs, each epoch once, with finite values; at most
// kMaxPowerSamples finite power samples. The rest is dropped.
void SanitizeRankResult(v1::RankResult& result, const v1::JobSpec& spec);

// result.samples, result.energy, result.history and result.to_accuracy (TargetsOf the
// spec) from result.attempts (common/energy_report.h);
// earlier_attempts_joules: what the attempts before the job's current one spent. For a
// job that ended cancelled, out of budget or failed, also the figures it reached: steps,
// training time and throughput of its last reported attempt, its last evaluation.
void RecomputeTotals(v1::Job& job, double grid_gco2_per_kwh);

}  // namespace joule::server

#endif  // JOULE_SERVER_ATTEMPT_H_
