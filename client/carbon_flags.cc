#include "client/carbon_flags.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/estimate.h"
#include "common/carbon_intensity.h"
#include "common/job_spec.h"
#include "common/text.h"

namespace joule::client {

void AddCarbonFlags(CLI::App* cmd, CarbonFlags* f, const std::string& whom) {
  cmd->add_flag("--carbon-aware", f->carbon_aware,
                absl::StrCat("wait, for ", whom,
                             ", for the start with the least forecast grid carbon intensity "
                             "over the run, before --start-before or --finish-by (the "
                             "coordinator's --carbon-intensity forecast; without one it "
                             "starts as any job)"));
  cmd->add_option("--start-before", f->start_before,
                  "carbon-aware: the latest start, RFC 3339 (2026-12-06T04:00:00Z) or +6h");
  cmd->add_option("--finish-by", f->finish_by,
                  "carbon-aware: the time the run must end by (RFC 3339 or +DURATION); the "
                  "run's length is the estimate's upper bound, or --expected-duration");
  cmd->add_option("--expected-duration", f->expected_duration,
                  "carbon-aware: the run's length to plan for (2h, 45m), instead of the "
                  "estimate");
}

absl::StatusOr<int64_t> ParseDeadline(absl::string_view flag, absl::string_view text,
                                      absl::Time now) {
  if (absl::ConsumePrefix(&text, "+")) {
    absl::Duration d;
    if (absl::ParseDuration(text, &d) && d > absl::ZeroDuration() && d < absl::Hours(24 * 366)) {
      return absl::ToUnixMillis(now + d);
    }
  } else if (std::optional<int64_t> ms = ParseRfc3339Ms(text)) {
    return *ms;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": \"", SanitizeUtf8(std::string(text), 64),
      "\" is neither an RFC 3339 time (2026-12-06T04:00:00Z) nor +DURATION from now (+6h, "
      "+1h30m, under a year)"));
}

absl::Status ApplyCarbonFlags(const CarbonFlags& f, const CLI::App& cmd, v1::JobSpec* spec,
                              absl::Time now) {
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  if (given("--carbon-aware")) spec->set_carbon_aware(f.carbon_aware);
  if (given("--start-before")) {
    absl::StatusOr<int64_t> ms = ParseDeadline("--start-before", f.start_before, now);
    if (!ms.ok()) return ms.status();
    spec->set_start_before_unix_ms(*ms);
  }
  if (given("--finish-by")) {
    absl::StatusOr<int64_t> ms = ParseDeadline("--finish-by", f.finish_by, now);
    if (!ms.ok()) return ms.status();
    spec->set_finish_by_unix_ms(*ms);
  }
  if (given("--expected-duration")) {
    absl::Duration d;
    if (!absl::ParseDuration(f.expected_duration, &d) || d <= absl::ZeroDuration() ||
        d > absl::Hours(24 * 366)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--expected-duration: \"", SanitizeUtf8(f.expected_duration, 64),
                       "\" is not a duration (2h, 45m, 1h30m) under a year"));
    }
    spec->set_expected_run_seconds(absl::ToDoubleSeconds(d));
  }
  return absl::OkStatus();
}

absl::Status FillCarbonRun(const absl::StatusOr<std::vector<v1::Job>>& history, v1::JobSpec* spec) {
  if (!spec->carbon_aware() || spec->expected_run_seconds() > 0) return absl::OkStatus();
  v1::JobSpec normalized = *spec;
  normalized.set_expected_run_seconds(1);  // (finish_by is valid only with one)
  if (!NormalizeAndValidateSpec(normalized).ok()) return absl::OkStatus();
  normalized.clear_expected_run_seconds();
  absl::StatusOr<JobEstimate> e = history.ok() ? EstimateJob(normalized, *history)
                                               : absl::StatusOr<JobEstimate>(history.status());
  if (e.ok() && e->wall_seconds > 0) {
    spec->set_expected_run_seconds(e->wall_ci95 > 0 ? e->wall_seconds + e->wall_ci95
                                                    : 1.5 * e->wall_seconds);
  } else if (spec->finish_by_unix_ms() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--finish-by needs the run's length, and there is no estimate for this job (",
                     e.ok() ? "no wall time" : std::string(e.status().message()),
                     "): give --expected-duration, or run `joule estimate --calibrate`"));
  }
  return absl::OkStatus();
}

bool DropPassedCarbonDeadline(int64_t now_ms, v1::JobSpec* spec) {
  if (!spec->carbon_aware()) return false;
  const int64_t deadline =
      spec->start_before_unix_ms() > 0 ? spec->start_before_unix_ms() : spec->finish_by_unix_ms();
  if (deadline > now_ms) return false;
  spec->clear_carbon_aware();
  spec->clear_start_before_unix_ms();
  spec->clear_finish_by_unix_ms();
  spec->clear_expected_run_seconds();
  return true;
}

}  // namespace joule::client
