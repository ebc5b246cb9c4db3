#include "server/attempt.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/energy_report.h"
#include "common/names.h"
#include "common/text.h"

namespace joule::server {

v1::AttemptOutcome AttemptOutcomeOf(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_SUCCEEDED: return v1::ATTEMPT_OUTCOME_SUCCEEDED;
    case v1::JOB_STATE_FAILED: return v1::ATTEMPT_OUTCOME_FAILED;
    case v1::JOB_STATE_CANCELLED: return v1::ATTEMPT_OUTCOME_CANCELLED;
    case v1::JOB_STATE_BUDGET_EXCEEDED: return v1::ATTEMPT_OUTCOME_BUDGET_EXCEEDED;
    default: return v1::ATTEMPT_OUTCOME_UNSPECIFIED;
  }
}

bool IsRetryable(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kResourceExhausted:  // out of memory: the next attempt would be too
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kPermissionDenied:
      return false;
    default:
      return true;
  }
}

int RootCauseWeight(absl::StatusCode code) {
  if (!IsRetryable(code)) return 3;
  switch (code) {
    case absl::StatusCode::kCancelled:
      return 0;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return 1;
    default:
      return 2;
  }
}

void SanitizeRankResult(v1::RankResult& result, const v1::JobSpec& spec) {
  auto finite = [](std::initializer_list<double> xs) {
    for (double x : xs) {
      if (!std::isfinite(x)) return false;
    }
    return true;
  };
  std::set<int32_t> seen;
  auto* history = result.mutable_history();
  history->erase(std::remove_if(history->begin(), history->end(),
                                [&](const v1::EpochRecord& e) {
                                  return e.epoch() < 1 || e.epoch() > spec.epochs() ||
                                         !seen.insert(e.epoch()).second ||
                                         !finite({e.elapsed_seconds(), e.train_loss(),
                                                  e.test_accuracy(), e.test_loss(), e.joules()});
                                }),
                 history->end());
  std::sort(history->begin(), history->end(),
            [](const v1::EpochRecord& a, const v1::EpochRecord& b) { return a.epoch() < b.epoch(); });
  // The figures a target may read: an accuracy is -1 (not measured) or in [0, 1], a loss
  // -1 or finite and >= 0; anything else becomes -1. The RMSE is derived, not trusted.
  const bool regression = absl::StartsWith(spec.dataset(), "hdf5:");
  for (v1::EpochRecord& e : *history) {
    auto accuracy = [](double v) { return v >= 0 && v <= 1 ? v : -1.0; };
    e.set_test_top_k_accuracy(accuracy(e.test_top_k_accuracy()));
    e.set_train_accuracy(accuracy(e.train_accuracy()));
    e.set_train_top_k_accuracy(accuracy(e.train_top_k_accuracy()));
    if (!(std::isfinite(e.train_eval_loss()) && e.train_eval_loss() >= 0))
      e.set_train_eval_loss(-1);
    if (regression && e.test_loss() >= 0) {
      e.set_test_rmse(std::sqrt(e.test_loss()));
    } else {
      e.clear_test_rmse();
    }
  }
  auto* power = result.mutable_power();
  power->erase(std::remove_if(power->begin(), power->end(),
                              [&](const v1::PowerSample& p) {
                                return !finite({p.elapsed_seconds(), p.joules(), p.watts()});
                              }),
               power->end());
  if (power->size() > kMaxPowerSamples) {
    power->DeleteSubrange(kMaxPowerSamples, power->size() - kMaxPowerSamples);
  }
}

namespace {

// A job that ended before all its ranks completed (cancelled, out of budget, failed):
// the figures it reached, so that its report agrees with what `status` showed while it
// ran (issue 23). Steps, training time and throughput are the last attempt's that a rank
// reported (from its resume point, the slowest reported rank's loop); accuracy and loss
// the job's last evaluation (history over every attempt). A completed attempt's ranks
// set them instead (CompleteRanks).
void SetReachedFigures(v1::JobResult& result) {
  const v1::AttemptSummary* last = nullptr;
  for (const v1::AttemptSummary& a : result.attempts()) {
    if (a.ranks_reported_size() > 0) last = &a;
  }
  if (last != nullptr) {
    result.set_steps(last->resumed_from_step() + last->steps());
    result.set_resumed_from_step(last->resumed_from_step());
    result.set_train_seconds(last->train_seconds());
    result.set_samples_per_second(last->train_seconds() > 0
                                      ? last->samples() / last->train_seconds()
                                      : 0);
  }
  if (!result.history().empty()) {
    const v1::EpochRecord& e = result.history(result.history_size() - 1);
    result.set_test_accuracy(e.test_accuracy());
    result.set_test_loss(e.test_loss());
    result.set_test_top_k_accuracy(e.test_top_k_accuracy());
  }
}

}  // namespace

void RecomputeTotals(v1::Job& job, double grid_gco2_per_kwh) {
  v1::JobResult* result = job.mutable_result();
  int64_t samples = 0;
  for (const v1::AttemptSummary& a : result->attempts()) samples += a.samples();
  result->set_samples(samples);
  v1::EnergyReport* e = result->mutable_energy();
  *e = BuildEnergyReport(*result, grid_gco2_per_kwh, job.spec().workers());
  double earlier = 0;
  for (const v1::AttemptSummary& a : result->attempts()) {
    if (a.attempt() >= job.attempt()) continue;
    for (const v1::EnergyRecord& r : a.energy()) earlier += r.joules();
  }
  e->set_earlier_attempts_joules(earlier);
  *result->mutable_history() = BuildJobHistory(*result);
  result->clear_to_accuracy();
  for (v1::AccuracyTarget& target : TargetsOf(job.spec())) {
    *result->add_to_accuracy() = ToTarget(result->history(), std::move(target));
  }
  switch (job.state()) {
    case v1::JOB_STATE_CANCELLED:
    case v1::JOB_STATE_BUDGET_EXCEEDED:
    case v1::JOB_STATE_FAILED:
      SetReachedFigures(*result);
      break;
    default:
      break;
  }
  // An ended job's energy so far and budget share: the figure every view shows, from the
  // same sum as a running job's (issue 23: status, report, web UI and /metrics disagreed).
  if (IsTerminal(job.state())) {
    const double joules = JobJoulesSoFar(*e);
    job.mutable_progress()->set_job_energy_joules(joules);
    const double budget = job.spec().energy_budget_joules();
    job.mutable_progress()->set_energy_budget_used(budget > 0 ? joules / budget : 0);
  }
}

void StartAttempt(v1::Job& job, const std::vector<std::string>& workers, int64_t now_unix_ms,
                  double grid_gco2_per_kwh) {
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempt(job.attempt() + 1);
  job.set_reason("");
  job.set_started_unix_ms(now_unix_ms);
  job.clear_worker_ids();
  job.clear_worker_hosts();
  job.clear_worker_regions();
  job.clear_worker_pids();
  for (const std::string& w : workers) job.add_worker_ids(w);
  v1::JobResult earlier;
  earlier.mutable_failed_attempts()->Swap(job.mutable_result()->mutable_failed_attempts());
  earlier.mutable_attempts()->Swap(job.mutable_result()->mutable_attempts());
  job.mutable_result()->Swap(&earlier);
  RecomputeTotals(job, grid_gco2_per_kwh);
  job.clear_progress();
  job.mutable_progress()->set_test_accuracy(-1);
}

void CloseAttempt(v1::Job& job, v1::AttemptOutcome outcome, const std::string& reason,
                  absl::StatusCode reason_code, double wall_seconds, double grid_gco2_per_kwh) {
  v1::JobResult* result = job.mutable_result();
  v1::AttemptSummary* s = result->add_attempts();
  *s = SummariseAttempt(job.attempt(), outcome, reason, wall_seconds, job.spec().workers(),
                        result->ranks());
  s->set_reason_code(static_cast<int32_t>(reason_code));
  s->set_started_unix_ms(job.started_unix_ms());
  *s->mutable_rank_regions() = job.worker_regions();
  result->set_wall_seconds(s->wall_seconds());
  RecomputeTotals(job, grid_gco2_per_kwh);
}

void Requeue(v1::Job& job, const std::string& reason, int64_t now_unix_ms) {
  v1::JobResult* result = job.mutable_result();
  const int failed = result->failed_attempts_size();
  result->clear_ranks();
  result->add_failed_attempts(absl::StrCat("attempt ", job.attempt(), ": ", reason));
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_finished_unix_ms(0);  // it has not finished: it runs again
  job.set_queued_unix_ms(now_unix_ms);
  job.set_reason(absl::StrCat("attempt ", job.attempt(), " failed (", reason, "); restart ",
                              failed + 1, " of ", job.spec().max_restarts(), " queued"));
  job.clear_worker_ids();
  job.clear_worker_hosts();
  job.clear_worker_regions();
  job.clear_worker_pids();
}

std::optional<std::string> CompleteRanks(v1::Job& job) {
  v1::JobResult* result = job.mutable_result();
  std::sort(result->mutable_ranks()->begin(), result->mutable_ranks()->end(),
            [](const v1::RankResult& a, const v1::RankResult& b) { return a.rank() < b.rank(); });
  const v1::RankResult& r0 = result->ranks(0);
  // The workers compare hashes too; this holds even for a worker that does not.
  std::string differ;
  for (const v1::RankResult& rr : result->ranks()) {
    if (rr.parameter_hash() != r0.parameter_hash()) {
      absl::StrAppend(&differ, differ.empty() ? "" : ", ", "rank ", rr.rank(), " has ",
                      SanitizeUtf8(rr.parameter_hash(), 16));
    }
  }
  if (!differ.empty()) {
    return absl::StrCat("the ranks ended with different parameters: rank 0 has ",
                        SanitizeUtf8(r0.parameter_hash(), 16), ", ", differ);
  }
  result->set_test_accuracy(r0.test_accuracy());
  result->set_test_loss(r0.test_loss());
  result->set_test_top_k_accuracy(r0.test_top_k_accuracy());
  result->set_steps(r0.steps());
  result->set_resumed_from_step(r0.resumed_from_step());
  int64_t samples = 0;
  double train_seconds = 0;
  for (const v1::RankResult& rr : result->ranks()) {
    samples += rr.samples();
    train_seconds = std::max(train_seconds, rr.train_seconds());
  }
  result->set_train_seconds(train_seconds);
  // This attempt's throughput; result.samples covers every attempt (RecomputeTotals).
  result->set_samples_per_second(train_seconds > 0 ? samples / train_seconds : 0);
  return std::nullopt;
}

bool MergeLateResult(v1::Job& job, int32_t rank, const std::string& worker_id,
                     const v1::ResultReport& report, double grid_gco2_per_kwh) {
  v1::JobResult* result = job.mutable_result();
  v1::AttemptSummary* summary = nullptr;
  for (v1::AttemptSummary& a : *result->mutable_attempts()) {
    if (a.attempt() == report.attempt()) summary = &a;
  }
  if (summary == nullptr) return false;
  v1::RankResult r = report.result();
  r.set_rank(rank);
  r.set_worker_id(worker_id);
  SanitizeRankResult(r, job.spec());
  if (!AddRankToAttempt(*summary, r)) return false;
  // The attempt ended on the first error to arrive, often a peer's "connection closed";
  // a rank's own error that explains more becomes the attempt's reason.
  if (!r.ok() && !r.cancelled() && summary->outcome() != v1::ATTEMPT_OUTCOME_SUCCEEDED &&
      summary->outcome() != v1::ATTEMPT_OUTCOME_CANCELLED &&
      summary->outcome() != v1::ATTEMPT_OUTCOME_BUDGET_EXCEEDED) {
    const auto code = static_cast<absl::StatusCode>(r.error_code());
    const int recorded = RootCauseWeight(static_cast<absl::StatusCode>(summary->reason_code()));
    if (RootCauseWeight(code) > recorded) {
      const std::string why = absl::StrCat("rank ", rank, " (worker ", worker_id, "): ", r.error());
      const std::string old_entry =
          absl::StrCat("attempt ", report.attempt(), ": ", summary->reason());
      for (std::string& f : *result->mutable_failed_attempts()) {
        if (f == old_entry) f = absl::StrCat("attempt ", report.attempt(), ": ", why);
      }
      if (job.attempt() == report.attempt() && job.state() == v1::JOB_STATE_FAILED) {
        const size_t after = job.reason().rfind(" (after ");
        job.set_reason(after == std::string::npos ? why : why + job.reason().substr(after));
      } else if (job.attempt() == report.attempt() && job.state() == v1::JOB_STATE_PENDING) {
        job.set_reason(absl::StrCat("attempt ", job.attempt(), " failed (", why, "); restart ",
                                    result->failed_attempts_size(), " of ",
                                    job.spec().max_restarts(), " queued"));
      }
      summary->set_reason(why);
      summary->set_reason_code(static_cast<int32_t>(code));
    }
  }
  RecomputeTotals(job, grid_gco2_per_kwh);
  return true;
}

v1::Assignment AssignmentFor(const v1::Job& job, int32_t rank, int32_t world_size,
                             const std::string& rendezvous_prefix) {
  v1::Assignment a;
  a.set_job_id(job.id());
  a.set_attempt(job.attempt());
  a.set_rank(rank);
  a.set_world_size(world_size);
  *a.mutable_spec() = job.spec();
  a.set_rendezvous_prefix(rendezvous_prefix);
  a.set_job_uid(job.uid());
  if (job.spec().resume_from_job() > 0) {
    a.set_resume_from_job_id(job.spec().resume_from_job());
    a.set_resume_from_job_uid(job.resume_from_job_uid());
  }
  return a;
}

std::string WaitingReason(const v1::Job& job, const std::string& waiting) {
  const int restarts = job.result().failed_attempts_size();
  if (restarts > 0) {
    return absl::StrCat("restart ", restarts, " of ", job.spec().max_restarts(), " (",
                        job.result().failed_attempts(restarts - 1), "): ", waiting);
  }
  if (job.attempt() > 0) {  // it ran, and no attempt failed: a restart cut it, or its ranks
                            // did not come back to a coordinator that took over
    const auto& attempts = job.result().attempts();
    if (!attempts.empty() && absl::StartsWith(attempts.rbegin()->reason(), "interrupted: ")) {
      return absl::StrCat("re-queued: ", attempts.rbegin()->reason().substr(13), "; ", waiting);
    }
    return absl::StrCat("re-queued: the coordinator restarted during attempt ", job.attempt(),
                        "; ", waiting);
  }
  return waiting;
}

}  // namespace joule::server
