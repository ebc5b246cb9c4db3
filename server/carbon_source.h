#ifndef JOULE_SERVER_CARBON_SOURCE_H_
#define JOULE_SERVER_CARBON_SOURCE_H_
// Where the coordinator reads the grid's carbon intensity (joule-coordinator
// --carbon-intensity FILE, issue 31), and what it does with it: plan a carbon-aware job's
// start (JobSpec.carbon_aware), say why it waits, and count a job's CO2 over its run.

#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/carbon_intensity.h"
#include "joule/v1/job.pb.h"

namespace joule::server {

// What the source holds now. `series` is null where it failed (`error` says why) or was
// never read.
struct CarbonSnapshot {
  std::shared_ptr<const IntensitySeries> series;
  std::string name;    // "FILE (FORMAT)"
  std::string digest;  // of the file's content (FNV-1a 64, hex): equal text, equal digest
  std::string error;   // why the last read failed; empty when it did not
};

// How an HTTP(S) source is fetched (joule-coordinator --carbon-intensity URL).
struct CarbonSourceOptions {
  // Polled every `poll` (the first at once); each fetch given `timeout` to connect and
  // for each read, and twice it for the whole answer. Redirects are followed only
  // without a token (one would carry it to wherever it points).
  std::chrono::milliseconds poll{5 * 60 * 1000};
  std::chrono::milliseconds timeout{10'000};
  // A token read from this file at each fetch (surrounding whitespace dropped), sent as
  // `Authorization: Bearer TOKEN`, or as `token_header: TOKEN` where token_header is
  // another header (Electricity Maps' `auth-token`). Never logged nor put in an error.
  std::string token_file, token_header = "Authorization";
  // The CA certificates an https source is checked against; empty: the system's bundle.
  std::string ca_file;
};

// The grid's intensity over time, from a file or an HTTP(S) endpoint. Thread-safe.
//
// A file is re-read when its size or modification time changes (Refresh). A change is
// read once two Refresh calls in a row see the same size and time (a file still being
// written is not read half-way; write the new forecast to a temporary file and rename it
// over this one, as curl -o F.tmp && mv F.tmp F does, to be safe from a writer that
// pauses).
//
// A URL (http:// or https://) is fetched by a thread of the source's own every
// options.poll, never on the caller's thread (a slow endpoint holds nothing up); Refresh
// takes the newest answer. A status other than 200, a timeout, a body over
// kMaxIntensityFileBytes or one that does not parse fails the fetch. The name shown is the
// URL without its query (which may hold a key).
//
// A source that cannot be read or parsed fails with the reason (logged once per change).
// The last good forecast is kept for kKeepLastGoodMs after the failure began, while it
// still covers that time: a bad write or a short outage re-plans nothing. After that the
// source has no forecast until a good one replaces it: carbon-aware jobs then start as
// others do, their plan's note says why.
class CarbonIntensitySource {
 public:
  static constexpr int64_t kKeepLastGoodMs = 10 * 60 * 1000;

  explicit CarbonIntensitySource(std::string source, CarbonSourceOptions options = {});
  ~CarbonIntensitySource();
  CarbonIntensitySource(const CarbonIntensitySource&) = delete;
  CarbonIntensitySource& operator=(const CarbonIntensitySource&) = delete;

  // Re-reads a file that changed, or takes a URL's newest answer (outside any
  // coordinator lock: a large forecast takes a while to parse); `now_ms` (Unix ms) times
  // the last good forecast's keeping. A file's first call reads at once (the coordinator
  // refuses a bad file at start); a URL's waits for the first answer, up to twice
  // options.timeout. True when the snapshot changed.
  bool Refresh(int64_t now_ms);
  CarbonSnapshot Get() const;
  const std::string& path() const { return path_; }
  bool is_url() const { return url_; }

 private:
  // The file's content parsed, or why it cannot be (stat_errno: stat's error, 0 if none).
  CarbonSnapshot Read(int stat_errno, const struct stat& st) const;
  // `text` parsed as `name`'s.
  CarbonSnapshot ParseText(const std::string& text) const;
  // One GET of the URL: the body, or why not.
  absl::StatusOr<std::string> Fetch() const;
  void PollLoop();
  // Drops a kept forecast whose time is up; true if it did.
  bool DropExpiredLocked(int64_t now_ms);
  // Takes `next` (a new forecast, or a failure that keeps the last good one a while).
  bool AcceptLocked(CarbonSnapshot next, int64_t now_ms);

  const std::string path_;
  const CarbonSourceOptions options_;
  const bool url_;
  const std::string shown_;  // the name in snapshots and errors (a URL without its query)
  mutable std::mutex mu_;
  CarbonSnapshot snapshot_;            // mu_
  bool read_ = false;                  // mu_: a first Refresh ran
  int64_t size_ = -1, mtime_ns_ = -1;  // mu_: what the last read saw
  // mu_: a change seen by the last Refresh, read when the next one sees it unchanged.
  int64_t seen_size_ = -1, seen_mtime_ns_ = -1;
  // mu_: since when (Unix ms) the source has failed while keeping the last good
  // forecast; 0 when it has not.
  int64_t failing_since_ms_ = 0;
  // A URL's: the newest answer (mu_), its number and the one Refresh took last, the
  // poller's wake-up and stop.
  std::optional<absl::StatusOr<std::string>> fetched_;
  uint64_t fetched_seq_ = 0, taken_seq_ = 0;
  bool stopping_ = false;
  std::condition_variable cv_;
  std::thread poller_;
};

// A --carbon-intensity argument: "REGION=SOURCE" where the text before the first '=' is a
// region name (CheckRegionName), else the whole of it a source of `default_region` (a URL's
// query, "?zone=DE", is not a region; write a file named "a=b.csv" as ./a=b.csv).
// INVALID_ARGUMENT for an empty source.
absl::StatusOr<std::pair<std::string, std::string>> ParseRegionalSource(
    const std::string& arg, const std::string& default_region);
// Whether `source` is an http(s) URL (else a file), and a URL's scheme://host[:port],
// lowercased, without credentials (to tell two endpoints apart).
bool IsUrlSource(const std::string& source);
std::string UrlOrigin(const std::string& url);

// The workers of one kind and what is promised of them (CarbonPlanRequest.capacity and
// reserved).
struct GangCapacity {
  int workers = 0;  // registered; 0: not considered
  std::vector<WorkerReservation> reserved;
};

// The run a carbon-aware job plans for, ms: spec.expected_run_seconds, else an hour.
int64_t CarbonRunMs(const v1::JobSpec& spec);

// What `job` holds of its kind's workers from `now_ms` on: a running job its gang until
// its expected end (a carbon-aware one's run length from its start while that lies
// ahead, else the rest of its epochs at its reported speed, else an hour from now); a
// carbon-aware job held by its plan its gang over the planned run, and one whose start
// has come but still queues over a run from now. None for others: a queued job that is
// not carbon-aware promises nothing (it starts when it can, by priority).
std::optional<WorkerReservation> ReservationOf(const v1::Job& job, int64_t now_ms);

// The region `job`'s reservation (ReservationOf) lies in at `now_ms`: a pending
// carbon-aware job's plan's before its latest start (then none: it may run anywhere), a running
// job's workers' (Job.worker_regions) where they are all in one; empty where not known or several
// (it then counts against every region's workers: a caller with worker_regions counts those in
// each).
std::string ReservationRegion(const v1::Job& job, int64_t now_ms);

// The plan of a carbon-aware job submitted or re-planned at `now_ms`: the greenest start
// before its deadline over the run it expects (CarbonRunMs), from `snapshot`, where its
// gang fits beside `gang`'s reservations (where none does, where the fewest workers are
// overbooked: *crowded set);
// at once (with the reason in `note`) without a usable forecast. `spec` must be
// carbon_aware and valid.
v1::CarbonPlan PlanCarbonAwareStart(const v1::JobSpec& spec, int64_t now_ms,
                                    const CarbonSnapshot& snapshot, const GangCapacity& gang = {},
                                    bool* crowded = nullptr);

// Every region's forecast as the coordinator plans with it (--carbon-intensity
// [REGION=]SOURCE, issue 31).
struct RegionalForecast {
  std::map<std::string, CarbonSnapshot> by_region;  // each region with a source
  // Of every region's digest: a change in any region's forecast re-plans held jobs.
  std::string digest;
  // The cluster spans several regions (workers or sources in more than one): a plan picks
  // one (CarbonPlan.region) and the job runs on its workers. Otherwise plans leave the
  // region empty, the one source (if any) stands for every worker.
  bool several_regions = false;
};

// Collects `sources`' snapshots (each source's Get) and their digest.
RegionalForecast SnapshotRegions(
    const std::map<std::string, std::shared_ptr<CarbonIntensitySource>>& sources,
    bool several_regions);

// A carbon-aware job's plan over every region: with one region, PlanCarbonAwareStart on
// its forecast beside gangs[""]; with several, the same in each region with a forecast
// whose gangs[REGION] has the job's workers (any region's when none has them: workers may
// come), and the one planned greenest kept (uncrowded first, then the fewest workers
// short of its gang, then the lowest forecast mean over its run, then the earliest start,
// then by name), its region set. No
// region with a usable forecast: at once, anywhere, with the reason in `note`.
// forecast_digest is forecast.digest. Pure.
v1::CarbonPlan PlanCarbonAwareStartInRegions(const v1::JobSpec& spec, int64_t now_ms,
                                             const RegionalForecast& forecast,
                                             const std::map<std::string, GangCapacity>& gangs,
                                             bool* crowded = nullptr);

// Whether `job` (PENDING, carbon-aware) is held at `now_ms` by its plan.
bool HeldByCarbonPlan(const v1::Job& job, int64_t now_ms);

// Why a held job waits: "waiting for 2026-12-06 02:00 UTC, forecast 118 g/kWh against
// 341 now; starts by 04:10 UTC at the latest (forecast: FILE (FORMAT))".
std::string CarbonWaitingReason(const v1::CarbonPlan& plan);

// The job's CO2 over its run from `series`: each rank's energy between two power samples
// of each ended attempt (AttemptSummary.power) at the intensity at that interval's middle.
// Energy at a time the points do not cover is not counted (joules_covered says what was);
// grams_at_submit is the covered energy at the mean intensity over a run as long as the
// job's (its first start to its end; CarbonRunMs before it has both) started at submit,
// from the same series (else the intensity at the submit instant; 0 where the series
// covers neither). Pure.
v1::CarbonAccount AccountCarbon(const v1::Job& job, const IntensitySeries& series,
                                const std::string& source);
// The same over regions: each rank's energy at its worker's region's intensity
// (AttemptSummary.rank_regions; `default_region` where an attempt has none), and at submit
// in the same regions; the source names each region counted ("REGION: NAME; ...") where
// `forecast` has several regions, else the one source's name. None where no rank's region
// has a forecast. Pure.
std::optional<v1::CarbonAccount> AccountCarbonInRegions(const v1::Job& job,
                                                        const RegionalForecast& forecast,
                                                        const std::string& default_region);

}  // namespace joule::server

#endif  // JOULE_SERVER_CARBON_SOURCE_H_
