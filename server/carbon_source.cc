#include "server/carbon_source.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace joule::server {
namespace {

constexpr int64_t kDefaultRunMs = 3'600'000;  // a run of unknown length: an hour

std::string Fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return absl::StrFormat("%016x", h);
}

std::string UtcMinute(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M UTC", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

}  // namespace

CarbonIntensitySource::CarbonIntensitySource(std::string path) : path_(std::move(path)) {}

bool CarbonIntensitySource::Refresh() {
  struct stat st {};
  const bool exists = ::stat(path_.c_str(), &st) == 0;
  const int64_t size = exists ? static_cast<int64_t>(st.st_size) : -1;
  const int64_t mtime =
      exists ? static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec : -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (read_ && size == size_ && mtime == mtime_ns_) return false;
  }
  CarbonSnapshot next;
  if (!exists) {
    next.error = absl::StrCat(path_, ": cannot be read (", std::strerror(errno), ")");
  } else if (!S_ISREG(st.st_mode)) {
    next.error = absl::StrCat(path_, ": not a regular file");
  } else if (size > static_cast<int64_t>(kMaxIntensityFileBytes)) {
    next.error = absl::StrCat(path_, ": ", size, " bytes, more than ", kMaxIntensityFileBytes);
  } else {
    std::ifstream in(path_, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in && !in.eof()) {
      next.error = absl::StrCat(path_, ": cannot be read");
    } else {
      const std::string content = text.str();
      absl::StatusOr<IntensitySeries> series = IntensitySeries::Parse(content);
      if (!series.ok()) {
        next.error = absl::StrCat(path_, ": ", series.status().message());
      } else {
        next.name = absl::StrCat(path_, " (", series->format(), ")");
        next.digest = Fnv1a64(content);
        next.series = std::make_shared<const IntensitySeries>(*std::move(series));
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  read_ = true;
  size_ = size;
  mtime_ns_ = mtime;
  if (next.error.empty()) {
    if (next.digest == snapshot_.digest && snapshot_.error.empty()) return false;
    spdlog::info("carbon intensity: read {}: {} points from {} to {}", next.name,
                 next.series->points().size(), UtcMinute(next.series->begin_ms()),
                 UtcMinute(next.series->end_ms()));
  } else if (next.error != snapshot_.error) {
    spdlog::warn(
        "carbon intensity: {}; carbon-aware jobs start without waiting until it is "
        "fixed",
        next.error);
  } else {
    return false;
  }
  snapshot_ = std::move(next);
  return true;
}

CarbonSnapshot CarbonIntensitySource::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

v1::CarbonPlan PlanCarbonAwareStart(const v1::JobSpec& spec, int64_t now_ms,
                                    const CarbonSnapshot& snapshot) {
  v1::CarbonPlan plan;
  plan.set_planned_unix_ms(now_ms);
  plan.set_planned_start_unix_ms(now_ms);
  const double run_seconds = spec.expected_run_seconds();
  const int64_t run_ms = run_seconds > 0 ? std::llround(run_seconds * 1000) : kDefaultRunMs;
  const int64_t latest = spec.start_before_unix_ms() > 0 ? spec.start_before_unix_ms()
                                                         : spec.finish_by_unix_ms() - run_ms;
  plan.set_latest_start_unix_ms(std::max(latest, now_ms));
  plan.set_source(snapshot.name);
  plan.set_forecast_digest(snapshot.digest);
  if (snapshot.series == nullptr) {
    plan.set_note(snapshot.error.empty()
                      ? "no carbon intensity source (joule-coordinator --carbon-intensity)"
                      : absl::StrCat("the carbon intensity source failed: ", snapshot.error));
    return plan;
  }
  CarbonPlanRequest request;
  request.now_ms = now_ms;
  request.latest_start_ms = latest;
  request.run_ms = run_ms;
  const CarbonPlan chosen = PlanGreenestStart(*snapshot.series, request);
  plan.set_planned_start_unix_ms(chosen.start_ms);
  plan.set_planned_gco2_per_kwh(chosen.planned_gco2_per_kwh.value_or(0));
  plan.set_now_gco2_per_kwh(chosen.now_gco2_per_kwh.value_or(0));
  plan.set_note(chosen.why_now);
  return plan;
}

bool HeldByCarbonPlan(const v1::Job& job, int64_t now_ms) {
  return job.spec().carbon_aware() && job.state() == v1::JOB_STATE_PENDING &&
         job.carbon_plan().planned_start_unix_ms() > now_ms;
}

std::string CarbonWaitingReason(const v1::CarbonPlan& plan) {
  std::string now = plan.now_gco2_per_kwh() > 0
                        ? absl::StrFormat(" against %.0f now", plan.now_gco2_per_kwh())
                        : " (a run started now is not covered by the forecast)";
  return absl::StrFormat(
      "carbon-aware: waiting for %s, forecast %.0f g/kWh%s; starts by %s at the latest "
      "(forecast: %s)",
      UtcMinute(plan.planned_start_unix_ms()), plan.planned_gco2_per_kwh(), now,
      UtcMinute(plan.latest_start_unix_ms()), plan.source());
}

v1::CarbonAccount AccountCarbon(const v1::Job& job, const IntensitySeries& series,
                                const std::string& source) {
  v1::CarbonAccount account;
  account.set_source(source);
  double grams = 0, joules = 0;
  for (const v1::AttemptSummary& attempt : job.result().attempts()) {
    if (attempt.started_unix_ms() <= 0) continue;
    for (const v1::RankPower& rank : attempt.power()) {
      double last_seconds = 0, last_joules = 0;
      for (const v1::PowerSample& s : rank.samples()) {
        const double dj = s.joules() - last_joules;
        const double mid = (last_seconds + s.elapsed_seconds()) / 2;
        if (std::isfinite(dj) && dj > 0 && std::isfinite(mid) && mid >= 0) {
          const int64_t at = attempt.started_unix_ms() + std::llround(mid * 1000);
          if (std::optional<double> g = series.At(at)) {
            grams += dj / 3.6e6 * *g;
            joules += dj;
          }
        }
        if (std::isfinite(s.joules())) last_joules = std::max(last_joules, s.joules());
        if (std::isfinite(s.elapsed_seconds())) {
          last_seconds = std::max(last_seconds, s.elapsed_seconds());
        }
      }
    }
  }
  account.set_grams(grams);
  account.set_joules_covered(joules);
  account.set_mean_gco2_per_kwh(joules > 0 ? grams / (joules / 3.6e6) : 0);
  if (std::optional<double> at_submit = series.At(job.created_unix_ms())) {
    account.set_grams_at_submit(joules / 3.6e6 * *at_submit);
  }
  return account;
}

}  // namespace joule::server
