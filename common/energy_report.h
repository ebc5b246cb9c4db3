#ifndef JOULE_COMMON_ENERGY_REPORT_H_
#define JOULE_COMMON_ENERGY_REPORT_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule {

// Grid carbon intensity assumed when none is configured, gCO2 per kWh: the world average
// of electricity generation in 2023 (IEA, "Electricity 2024", about 460 g/kWh).
inline constexpr double kDefaultGridGco2PerKwh = 460.0;

// Bounds on what a rank's result may add to an attempt (longer lists are cut): epochs of
// history, and power samples per rank (the worker keeps at most this many).
inline constexpr int kMaxHistory = 10000;
inline constexpr int kMaxPowerSamples = 512;

// Summarises one attempt from the rank results it got (`ranks`: RankResult.energy,
// .devices, .samples, .steps, .resumed_from_step, .energy_warnings) and its wall time:
//   steps   = the most updates any rank made after its resume point (steps - resumed)
//   samples = sum of the ranks' samples
//   devices = each reported rank's devices (at least 1) plus 1 for each rank that did
//             not report: the gang held them all the same
// Warnings name each reported rank with no energy record (metering off: its energy is
// not counted) and the ranks that did not report at all.
v1::AttemptSummary SummariseAttempt(
    int32_t attempt, v1::AttemptOutcome outcome, const std::string& reason, double wall_seconds,
    int ranks_expected, const google::protobuf::RepeatedPtrField<v1::RankResult>& ranks);

// Adds one rank's late result to `summary` (a rank of an attempt that had already ended
// when it reported); the attempt's wall time grows to the rank's own wall time if that is
// longer. False, changing nothing, when that rank is already counted or is not in
// [0, ranks_expected).
bool AddRankToAttempt(v1::AttemptSummary& summary, const v1::RankResult& rank);

// Builds a job's energy account from every ended attempt in `result.attempts` (or, when
// there is none, from `result.ranks` and `result.wall_seconds/samples/steps` as one
// attempt), so that every figure covers the same attempts:
//   total J = sum of all records;          kWh = J / 3.6e6
//   device-hours = sum over attempts of wall s x devices / 3600
//                  (Huber et al., arXiv 2508.07706: GPU-hours = wall time x GPUs)
//   average W = J / sum of wall s;          J per device-hour = J / device-hours
//   samples per J = sum of samples / J;     updates per device-hour = sum of steps /
//                                            device-hours
//   CO2 g = kWh x grid intensity (gCO2/kWh); estimated: any record is `estimated`
// Quantities with a zero denominator are 0. ranks_reported/expected describe the last
// attempt (0 of 0 for a job with no attempt and no rank: it never ran);
// earlier_attempts_joules is what the attempts before it spent; unreported_joules what the
// ranks that have not reported their result yet last said in progress (not in the total).
// A job's energy so far, the one figure every view shows and a budget is held to (status,
// report, web UI, /metrics): the ended attempts' metered total plus what ranks not yet
// reported last said (their results replace it as they arrive). The coordinator adds the
// running attempt's ranks' progress to it for a running job (JobProgress.job_energy_joules).
inline double JobJoulesSoFar(const v1::EnergyReport& e) {
  return e.total_joules() + e.unreported_joules();
}

v1::EnergyReport BuildEnergyReport(const v1::JobResult& result, double grid_gco2_per_kwh,
                                   int ranks_expected);

// The job's epochs over all its attempts (`result.attempts`, oldest first): each
// attempt's history with the wall seconds and joules of the attempts before it added,
// an epoch a later (resumed) attempt ended again replacing the earlier record.
google::protobuf::RepeatedPtrField<v1::EpochRecord> BuildJobHistory(const v1::JobResult& result);

// A figure of an EpochRecord that a job may target (JobSpec.target_metric).
struct TargetMetric {
  std::string_view name;  // the EpochRecord field's name, e.g. "test_top_k_accuracy"
  bool lower_is_better;   // a loss (reached at <= target) rather than an accuracy
  double (*read)(const v1::EpochRecord&);  // < 0: not measured in that epoch
};

// The metric named `name` ("" = "test_accuracy"); nullptr for an unknown name.
const TargetMetric* FindTargetMetric(std::string_view name);

// The metric names, comma-separated, for error messages.
std::string TargetMetricNames();

// The targets a report gives energy and time to, for `spec.target_metric` (which
// NormalizeAndValidateSpec has checked; unknown is taken as test_accuracy): an accuracy gets the
// ladder 0.5, 0.6, 0.7, 0.8, 0.85, 0.9 and spec.target_accuracy (if in (0, 1]),
// ascending; a loss only spec.target_loss (if > 0), since a loss has no common scale.
// Each comes unreached, for ToTarget to fill.
std::vector<v1::AccuracyTarget> TargetsOf(const v1::JobSpec& spec);

// Fills `target` from `history`: the first epoch whose `target.metric` is at or past
// `target.target` (>= for an accuracy, <= for a loss; an epoch that did not measure it is
// passed over) (Zeus, Chung et al., NSDI'23: energy-to-accuracy and time-to-accuracy), or
// reached = false.
v1::AccuracyTarget ToTarget(const google::protobuf::RepeatedPtrField<v1::EpochRecord>& history,
                            v1::AccuracyTarget target);

// "test_accuracy >= 0.85", "test_rmse <= 0.05": the target in words for reports ("" as
// metric reads test_accuracy).
std::string TargetLabel(const v1::AccuracyTarget& target);

// ToTarget for a test accuracy.
v1::AccuracyTarget ToAccuracy(const google::protobuf::RepeatedPtrField<v1::EpochRecord>& history,
                              double target);

// Sums of `report.records` by one key: "rank", "device", "source" or "phase"
// (ranks as decimal strings; devices as "rank/device").
std::map<std::string, double> EnergyBy(const v1::EnergyReport& report, const std::string& key);

}  // namespace joule

#endif  // JOULE_COMMON_ENERGY_REPORT_H_
