#include "server/carbon_source.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
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

bool IsUrlSource(const std::string& source) {
  return absl::StartsWith(source, "http://") || absl::StartsWith(source, "https://");
}

std::string UrlOrigin(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return "";
  const size_t host_begin = scheme_end + 3;
  std::string authority = url.substr(host_begin, url.find_first_of("/?#", host_begin) - host_begin);
  if (const size_t at = authority.rfind('@'); at != std::string::npos) {
    authority = authority.substr(at + 1);
  }
  std::string origin = absl::AsciiStrToLower(absl::StrCat(url.substr(0, host_begin), authority));
  // The scheme's default port named or not: one host.
  for (const auto& [scheme, port] : {std::pair<std::string, std::string>{"http://", ":80"},
                                     std::pair<std::string, std::string>{"https://", ":443"}}) {
    if (absl::StartsWith(origin, scheme) && absl::EndsWith(origin, port)) {
      origin.resize(origin.size() - port.size());
    }
  }
  return origin;
}

namespace {

bool IsUrl(const std::string& source) { return IsUrlSource(source); }

// A URL without its user information, query or fragment (which may hold a key); the
// source itself otherwise.
std::string Shown(const std::string& source) {
  if (!IsUrl(source)) return source;
  std::string url = source.substr(0, source.find_first_of("?#"));
  const size_t host = url.find("://") + 3;
  const size_t path = std::min(url.find('/', host), url.size());
  const size_t at = url.rfind('@', path);
  if (at != std::string::npos && at >= host) url.erase(host, at + 1 - host);
  return url;
}

}  // namespace

CarbonIntensitySource::CarbonIntensitySource(std::string source, CarbonSourceOptions options)
    : path_(std::move(source)),
      options_(std::move(options)),
      url_(IsUrl(path_)),
      shown_(Shown(path_)) {
  if (url_) poller_ = std::thread(&CarbonIntensitySource::PollLoop, this);
}

CarbonIntensitySource::~CarbonIntensitySource() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (poller_.joinable()) poller_.join();
}

CarbonSnapshot CarbonIntensitySource::ParseText(const std::string& text) const {
  CarbonSnapshot next;
  absl::StatusOr<IntensitySeries> series = IntensitySeries::Parse(text);
  if (!series.ok()) {
    next.error = absl::StrCat(shown_, ": ", series.status().message());
  } else {
    next.name = absl::StrCat(shown_, " (", series->format(), ")");
    next.digest = Fnv1a64(text);
    next.series = std::make_shared<const IntensitySeries>(*std::move(series));
  }
  return next;
}

CarbonSnapshot CarbonIntensitySource::Read(int stat_errno, const struct stat& st) const {
  CarbonSnapshot next;
  const auto size = static_cast<int64_t>(st.st_size);
  if (stat_errno != 0) {
    next.error = absl::StrCat(path_, ": cannot be read (", std::strerror(stat_errno), ")");
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
      next = ParseText(text.str());
    }
  }
  return next;
}

absl::StatusOr<std::string> CarbonIntensitySource::Fetch() const {
  // scheme://host[:port] and the rest (path and query).
  const size_t host_at = path_.find("://") + 3;
  const size_t path_at = path_.find('/', host_at);
  const std::string origin = path_.substr(0, path_at);
  const std::string target = path_at == std::string::npos ? "/" : path_.substr(path_at);
  httplib::Client client(origin);
  if (!client.is_valid()) return absl::InvalidArgumentError(absl::StrCat(shown_, ": not a URL"));
  const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(options_.timeout);
  client.set_connection_timeout(timeout.count() / 1'000'000, timeout.count() % 1'000'000);
  client.set_read_timeout(timeout.count() / 1'000'000, timeout.count() % 1'000'000);
  // A redirect would carry the token to wherever it points (another host, plain http):
  // followed only without one.
  client.set_follow_location(options_.token_file.empty());
  if (!options_.ca_file.empty()) {
    client.set_ca_cert_path(options_.ca_file);
  } else if (std::ifstream("/etc/ssl/certs/ca-certificates.crt").good()) {
    client.set_ca_cert_path("/etc/ssl/certs/ca-certificates.crt");
  }
  httplib::Headers headers = {{"Accept", "application/json, text/csv, text/plain"}};
  if (!options_.token_file.empty()) {
    std::ifstream in(options_.token_file);
    std::ostringstream text;
    text << in.rdbuf();
    const std::string token(absl::StripAsciiWhitespace(text.str()));
    if (!in.good() && !in.eof()) {
      return absl::FailedPreconditionError(
          absl::StrCat(shown_, ": the token file ", options_.token_file, " cannot be read"));
    }
    if (token.empty() || token.find_first_of("\r\n") != std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(
          shown_, ": the token file ", options_.token_file, " holds no token on one line"));
    }
    if (absl::EqualsIgnoreCase(options_.token_header, "Authorization")) {
      headers.emplace("Authorization", absl::StrCat("Bearer ", token));
    } else {
      headers.emplace(options_.token_header, token);
    }
  }
  int status = 0;
  bool too_big = false, too_slow = false;
  std::string body;
  // The whole answer within twice the timeout (httplib's read timeout is per read: a body
  // that trickles in would never end).
  const auto deadline = std::chrono::steady_clock::now() + 2 * options_.timeout;
  httplib::Result result = client.Get(
      target, headers,
      [&](const httplib::Response& response) {
        status = response.status;
        return response.status == 200;
      },
      [&](const char* data, size_t length) {
        if (body.size() + length > kMaxIntensityFileBytes) {
          too_big = true;
          return false;
        }
        if (std::chrono::steady_clock::now() > deadline) {
          too_slow = true;
          return false;
        }
        body.append(data, length);
        return true;
      });
  if (too_slow) {
    return absl::DeadlineExceededError(
        absl::StrCat(shown_, ": the answer took over ", 2 * options_.timeout.count(), " ms"));
  }
  if (too_big) {
    return absl::ResourceExhaustedError(
        absl::StrCat(shown_, ": the answer is over ", kMaxIntensityFileBytes, " bytes"));
  }
  if (status != 0 && status != 200) {
    return absl::UnavailableError(absl::StrCat(shown_, ": HTTP ", status));
  }
  if (!result) {
    return absl::UnavailableError(absl::StrCat(shown_, ": ", httplib::to_string(result.error()),
                                               " (within ", options_.timeout.count(), " ms)"));
  }
  return body;
}

void CarbonIntensitySource::PollLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    absl::StatusOr<std::string> answer = Fetch();
    lock.lock();
    fetched_ = std::move(answer);
    ++fetched_seq_;
    cv_.notify_all();
    cv_.wait_for(lock, options_.poll, [this] { return stopping_; });
  }
}

bool CarbonIntensitySource::DropExpiredLocked(int64_t now_ms) {
  // A kept forecast expires kKeepLastGoodMs after the failure began, or at its end.
  const bool expired =
      snapshot_.series != nullptr && !snapshot_.error.empty() &&
      (now_ms >= failing_since_ms_ + kKeepLastGoodMs || now_ms >= snapshot_.series->end_ms());
  if (!expired) return false;
  spdlog::warn(
      "carbon intensity: {}; the last good forecast is dropped: carbon-aware jobs start "
      "without waiting until it is fixed",
      snapshot_.error);
  snapshot_.series.reset();
  snapshot_.name.clear();
  snapshot_.digest.clear();
  failing_since_ms_ = 0;
  return true;
}

bool CarbonIntensitySource::AcceptLocked(CarbonSnapshot next, int64_t now_ms) {
  if (next.error.empty()) {
    failing_since_ms_ = 0;
    if (next.digest == snapshot_.digest && snapshot_.error.empty()) return false;
    spdlog::info("carbon intensity: read {}: {} points from {} to {}", next.name,
                 next.series->points().size(), UtcMinute(next.series->begin_ms()),
                 UtcMinute(next.series->end_ms()));
    snapshot_ = std::move(next);
    return true;
  }
  if (next.error == snapshot_.error) return false;
  if (snapshot_.series != nullptr && now_ms < snapshot_.series->end_ms()) {
    // Keep planning on the last good forecast for a while: a bad write is often fixed by
    // the next one, an outage by the next poll.
    if (failing_since_ms_ == 0) failing_since_ms_ = now_ms;
    spdlog::warn(
        "carbon intensity: {}; keeping the last good forecast until {} at the latest", next.error,
        UtcMinute(std::min(failing_since_ms_ + kKeepLastGoodMs, snapshot_.series->end_ms())));
    snapshot_.error = std::move(next.error);
    return true;
  }
  spdlog::warn(
      "carbon intensity: {}; carbon-aware jobs start without waiting until it is "
      "fixed",
      next.error);
  snapshot_ = std::move(next);
  return true;
}

bool CarbonIntensitySource::Refresh(int64_t now_ms) {
  if (url_) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!read_) {  // the first call (only) waits for the first answer
      read_ = true;
      cv_.wait_for(lock, 2 * options_.timeout + std::chrono::seconds(1),
                   [this] { return fetched_seq_ > 0 || stopping_; });
    }
    bool changed = DropExpiredLocked(now_ms);
    if (fetched_seq_ == taken_seq_ || !fetched_) return changed;
    taken_seq_ = fetched_seq_;
    absl::StatusOr<std::string> answer = *fetched_;
    lock.unlock();
    CarbonSnapshot next;
    if (answer.ok()) {
      next = ParseText(*answer);
    } else {
      next.error = std::string(answer.status().message());
    }
    lock.lock();
    return AcceptLocked(std::move(next), now_ms) || changed;
  }
  struct stat st {};
  const bool exists = ::stat(path_.c_str(), &st) == 0;
  const int stat_errno = exists ? 0 : errno;
  const int64_t size = exists ? static_cast<int64_t>(st.st_size) : -1;
  const int64_t mtime =
      exists ? static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec : -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (DropExpiredLocked(now_ms)) return true;
    if (read_ && size == size_ && mtime == mtime_ns_) return false;
    if (read_ && (size != seen_size_ || mtime != seen_mtime_ns_)) {
      seen_size_ = size;  // changed since the last look: perhaps still being written
      seen_mtime_ns_ = mtime;
      return false;
    }
  }
  CarbonSnapshot next = Read(stat_errno, st);
  std::lock_guard<std::mutex> lock(mu_);
  read_ = true;
  size_ = seen_size_ = size;
  mtime_ns_ = seen_mtime_ns_ = mtime;
  return AcceptLocked(std::move(next), now_ms);
}

CarbonSnapshot CarbonIntensitySource::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

absl::StatusOr<std::pair<std::string, std::string>> ParseRegionalSource(
    const std::string& arg, const std::string& default_region) {
  std::pair<std::string, std::string> named{default_region, arg};
  if (const size_t eq = arg.find('=');
      eq != std::string::npos && CheckRegionName("", arg.substr(0, eq)).ok()) {
    named = {arg.substr(0, eq), arg.substr(eq + 1)};
  }
  if (named.second.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--carbon-intensity ", arg, ": names no file or URL"));
  }
  return named;
}

int64_t CarbonRunMs(const v1::JobSpec& spec) {
  const double run_seconds = spec.expected_run_seconds();
  return run_seconds > 0 ? std::llround(run_seconds * 1000) : kDefaultRunMs;
}

std::optional<WorkerReservation> ReservationOf(const v1::Job& job, int64_t now_ms) {
  const int workers = job.worker_ids_size() > 0 ? job.worker_ids_size() : job.spec().workers();
  if (HeldByCarbonPlan(job, now_ms)) {
    const int64_t start = job.carbon_plan().planned_start_unix_ms();
    return WorkerReservation{start, start + CarbonRunMs(job.spec()), job.spec().workers()};
  }
  if (job.state() == v1::JOB_STATE_PENDING && job.spec().carbon_aware()) {
    return WorkerReservation{now_ms, now_ms + CarbonRunMs(job.spec()), job.spec().workers()};
  }
  if (job.state() != v1::JOB_STATE_RUNNING) return std::nullopt;
  int64_t end = now_ms + kDefaultRunMs;
  const v1::JobProgress& p = job.progress();
  const int64_t planned_end =
      job.started_unix_ms() > 0 ? job.started_unix_ms() + CarbonRunMs(job.spec()) : 0;
  if (job.spec().carbon_aware() && planned_end > now_ms) {
    end = planned_end;
  } else if (p.samples_per_second() > 0 && p.steps_per_epoch() > 0 && job.spec().epochs() > 0) {
    const double steps_left = std::max<double>(
        0, static_cast<double>(job.spec().epochs()) * static_cast<double>(p.steps_per_epoch()) -
               static_cast<double>(p.step()));
    const double seconds = steps_left * job.spec().global_batch_size() / p.samples_per_second();
    if (std::isfinite(seconds) && seconds < 366 * 86400.0) {
      end = now_ms + std::llround(seconds * 1000);
    }
  }
  return WorkerReservation{now_ms, std::max(end, now_ms + 1), workers};
}

std::string ReservationRegion(const v1::Job& job, int64_t now_ms) {
  if (job.state() == v1::JOB_STATE_PENDING) {
    return now_ms < job.carbon_plan().latest_start_unix_ms() ? job.carbon_plan().region() : "";
  }
  const auto& regions = job.worker_regions();
  if (regions.empty() || std::any_of(regions.begin(), regions.end(),
                                     [&](const std::string& r) { return r != regions[0]; })) {
    return "";
  }
  return regions[0];
}

v1::CarbonPlan PlanCarbonAwareStart(const v1::JobSpec& spec, int64_t now_ms,
                                    const CarbonSnapshot& snapshot, const GangCapacity& gang,
                                    bool* crowded) {
  v1::CarbonPlan plan;
  plan.set_planned_unix_ms(now_ms);
  plan.set_planned_start_unix_ms(now_ms);
  const int64_t run_ms = CarbonRunMs(spec);
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
  request.capacity = gang.workers;
  request.workers = spec.workers();
  request.reserved = gang.reserved;
  const CarbonPlan chosen = PlanGreenestStart(*snapshot.series, request);
  plan.set_planned_start_unix_ms(chosen.start_ms);
  plan.set_planned_gco2_per_kwh(chosen.planned_gco2_per_kwh.value_or(0));
  plan.set_now_gco2_per_kwh(chosen.now_gco2_per_kwh.value_or(0));
  plan.set_note(chosen.why_now);
  if (crowded != nullptr) *crowded = chosen.crowded;
  return plan;
}

RegionalForecast SnapshotRegions(
    const std::map<std::string, std::shared_ptr<CarbonIntensitySource>>& sources,
    bool several_regions) {
  RegionalForecast forecast;
  forecast.several_regions = several_regions;
  std::string digests;
  for (const auto& [region, source] : sources) {
    if (source == nullptr) continue;
    CarbonSnapshot& snapshot = forecast.by_region[region] = source->Get();
    absl::StrAppend(&digests, region, "=", snapshot.digest, ";");
  }
  // One region with a source: its own digest (a plan made before regions existed stays
  // current). Several: of every one's, and a change between the two re-plans.
  if (!several_regions) {
    forecast.digest = forecast.by_region.empty() ? "" : forecast.by_region.begin()->second.digest;
  } else {
    forecast.digest = Fnv1a64(absl::StrCat("regions;", digests));
  }
  return forecast;
}

v1::CarbonPlan PlanCarbonAwareStartInRegions(const v1::JobSpec& spec, int64_t now_ms,
                                             const RegionalForecast& forecast,
                                             const std::map<std::string, GangCapacity>& gangs,
                                             bool* crowded) {
  const auto gang_in = [&](const std::string& region) {
    auto it = gangs.find(region);
    return it != gangs.end() ? it->second : GangCapacity{};
  };
  if (!forecast.several_regions) {
    const CarbonSnapshot snapshot =
        forecast.by_region.empty() ? CarbonSnapshot{} : forecast.by_region.begin()->second;
    v1::CarbonPlan plan = PlanCarbonAwareStart(spec, now_ms, snapshot, gang_in(""), crowded);
    plan.set_forecast_digest(forecast.digest);
    return plan;
  }
  // The regions where its gang fits among the registered workers; else every region with
  // a forecast (none fits now: whichever gets workers first).
  bool any_fits = false;
  for (const auto& [region, snapshot] : forecast.by_region) {
    any_fits =
        any_fits || (snapshot.series != nullptr && gang_in(region).workers >= spec.workers());
  }
  std::optional<v1::CarbonPlan> best, first_failed;
  bool best_crowded = false;
  int best_shortfall = 0;
  std::string failures;
  for (const auto& [region, snapshot] : forecast.by_region) {
    const GangCapacity gang = gang_in(region);
    if (any_fits && gang.workers < spec.workers()) continue;
    bool region_crowded = false;
    v1::CarbonPlan plan = PlanCarbonAwareStart(spec, now_ms, snapshot, gang, &region_crowded);
    plan.set_region(region);
    // Too few workers (none: the plan did not weigh capacity) is crowded, the more so the
    // fewer it has.
    const int shortfall = std::max(0, spec.workers() - gang.workers);
    region_crowded = region_crowded || shortfall > 0;
    if (!plan.note().empty()) {
      absl::StrAppend(&failures, failures.empty() ? "" : "; ", region, ": ", plan.note());
      if (!first_failed) first_failed = std::move(plan);
      continue;
    }
    const auto key = [](const v1::CarbonPlan& p, bool c, int s) {
      return std::tuple(c, s, p.planned_gco2_per_kwh(), p.planned_start_unix_ms(), p.region());
    };
    if (!best || key(plan, region_crowded, shortfall) < key(*best, best_crowded, best_shortfall)) {
      best = std::move(plan);
      best_crowded = region_crowded;
      best_shortfall = shortfall;
    }
  }
  if (!best) {
    // At once, anywhere: the first region's failed plan (its intensity now and source
    // kept), with every region's reason; without sources, the plain plan's.
    if (!first_failed) return PlanCarbonAwareStart(spec, now_ms, CarbonSnapshot{}, {});
    best = std::move(first_failed);
    best->clear_region();
    if (forecast.by_region.size() > 1) best->set_note(absl::StrCat("in no region: ", failures));
  }
  best->set_forecast_digest(forecast.digest);
  if (crowded != nullptr) *crowded = best_crowded;
  return *best;
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
      "carbon-aware: waiting for %s%s, forecast %.0f g/kWh%s; starts by %s at the latest "
      "(forecast: %s)",
      UtcMinute(plan.planned_start_unix_ms()),
      plan.region().empty() ? "" : absl::StrCat(" in ", plan.region()), plan.planned_gco2_per_kwh(),
      now, UtcMinute(plan.latest_start_unix_ms()), plan.source());
}

namespace {

// Energy and CO2 counted in one region (AccountRanks).
struct RegionTally {
  const IntensitySeries* series = nullptr;
  double grams = 0, joules = 0;
};

// Each rank's energy between two power samples of each ended attempt at its region's
// intensity at that interval's middle, into `tally` (by region; a region not in it, or
// with no series, is not counted); `region_of(attempt, rank)` names the rank's region.
template <typename RegionOf>
void AccountRanks(const v1::Job& job, const RegionOf& region_of,
                  std::map<std::string, RegionTally>& tally) {
  for (const v1::AttemptSummary& attempt : job.result().attempts()) {
    if (attempt.started_unix_ms() <= 0) continue;
    for (const v1::RankPower& rank : attempt.power()) {
      auto region = tally.find(region_of(attempt, rank.rank()));
      if (region == tally.end() || region->second.series == nullptr) continue;
      RegionTally& t = region->second;
      double last_seconds = 0, last_joules = 0;
      for (const v1::PowerSample& s : rank.samples()) {
        const double dj = s.joules() - last_joules;
        const double mid = (last_seconds + s.elapsed_seconds()) / 2;
        // Up to a year into the attempt (a garbled elapsed time would overflow Unix ms).
        if (std::isfinite(dj) && dj > 0 && std::isfinite(mid) && mid >= 0 && mid < 366 * 86400.0) {
          const int64_t at = attempt.started_unix_ms() + std::llround(mid * 1000);
          if (std::optional<double> g = t.series->At(at)) {
            t.grams += dj / 3.6e6 * *g;
            t.joules += dj;
          }
        }
        if (std::isfinite(s.joules())) last_joules = std::max(last_joules, s.joules());
        if (std::isfinite(s.elapsed_seconds())) {
          last_seconds = std::max(last_seconds, s.elapsed_seconds());
        }
      }
    }
  }
}

// The account from the tallies: at submit, each region's covered energy at the mean
// intensity over a run as long as the job's started then (else the intensity at that
// instant).
v1::CarbonAccount SumTallies(const v1::Job& job, const std::map<std::string, RegionTally>& tally,
                             const std::string& source) {
  v1::CarbonAccount account;
  account.set_source(source);
  const int64_t run_ms = job.started_unix_ms() > 0 && job.finished_unix_ms() > job.started_unix_ms()
                             ? job.finished_unix_ms() - job.started_unix_ms()
                             : CarbonRunMs(job.spec());
  double grams = 0, joules = 0, at_submit_grams = 0;
  bool at_submit_known = true;  // for every region the job used energy in
  for (const auto& [region, t] : tally) {
    if (t.series == nullptr || t.joules <= 0) continue;
    grams += t.grams;
    joules += t.joules;
    std::optional<double> at_submit =
        t.series->Mean(job.created_unix_ms(), job.created_unix_ms() + run_ms);
    if (!at_submit) at_submit = t.series->At(job.created_unix_ms());
    if (at_submit) {
      at_submit_grams += t.joules / 3.6e6 * *at_submit;
    } else {
      at_submit_known = false;
    }
  }
  account.set_grams(grams);
  account.set_joules_covered(joules);
  account.set_mean_gco2_per_kwh(joules > 0 ? grams / (joules / 3.6e6) : 0);
  if (at_submit_known) account.set_grams_at_submit(at_submit_grams);
  return account;
}

}  // namespace

v1::CarbonAccount AccountCarbon(const v1::Job& job, const IntensitySeries& series,
                                const std::string& source) {
  std::map<std::string, RegionTally> tally;
  tally[""].series = &series;
  AccountRanks(
      job, [](const v1::AttemptSummary&, int32_t) { return std::string(); }, tally);
  return SumTallies(job, tally, source);
}

std::optional<v1::CarbonAccount> AccountCarbonInRegions(const v1::Job& job,
                                                        const RegionalForecast& forecast,
                                                        const std::string& default_region) {
  if (forecast.by_region.empty()) return std::nullopt;
  // One source and every rank in its region (or no regions at all): the one source's.
  const auto& [only_region, only] = *forecast.by_region.begin();
  bool elsewhere = false;
  for (const v1::AttemptSummary& attempt : job.result().attempts()) {
    for (const std::string& region : attempt.rank_regions()) {
      elsewhere = elsewhere || region != only_region;
    }
    elsewhere = elsewhere || (attempt.rank_regions().empty() && default_region != only_region &&
                              forecast.several_regions);
  }
  if (forecast.by_region.size() == 1 && !elsewhere) {
    if (only.series == nullptr) return std::nullopt;
    return AccountCarbon(job, *only.series, only.name);
  }
  std::map<std::string, RegionTally> tally;
  for (const auto& [region, snapshot] : forecast.by_region) {
    tally[region].series = snapshot.series.get();
  }
  std::set<std::string> ran_in;
  const auto region_of = [&](const v1::AttemptSummary& attempt, int32_t rank) {
    std::string region = rank >= 0 && rank < attempt.rank_regions_size()
                             ? attempt.rank_regions(rank)
                             : default_region;
    ran_in.insert(region);
    return region;
  };
  AccountRanks(job, region_of, tally);
  std::string source;
  for (const std::string& region : ran_in) {
    auto it = forecast.by_region.find(region);
    if (it == forecast.by_region.end() || it->second.series == nullptr) continue;
    absl::StrAppend(&source, source.empty() ? "" : "; ", region, ": ", it->second.name);
  }
  if (source.empty()) return std::nullopt;
  return SumTallies(job, tally, source);
}

}  // namespace joule::server
