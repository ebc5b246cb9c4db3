#include "server/scheduler.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace joule::server {

namespace {

// The idle workers of one device kind, and which are taken or held back.
struct KindPool {
  std::vector<const WorkerSlot*> idle;  // in `workers` order
  std::vector<bool> used;
  int registered = 0;
  std::map<std::string, int> registered_in;          // by region
  std::map<std::string, int64_t> region_blocked_by;  // a region's idle workers held back
  int64_t blocked_by = 0;                            // every one held back (0: none)

  bool Usable(size_t i, const std::string& region) const {
    return !used[i] && region_blocked_by.count(idle[i]->region) == 0 &&
           (region.empty() || idle[i]->region == region);
  }
  // The idle workers `job` can take now: in its region, or for a job with none in the
  // first region with enough, else wherever they are.
  std::vector<size_t> Candidates(const PendingJob& job) const {
    if (job.region.empty() && !job.preferred_region.empty()) {
      std::vector<size_t> preferred;
      for (size_t i = 0; i < idle.size(); ++i) {
        if (Usable(i, job.preferred_region)) preferred.push_back(i);
      }
      if (preferred.size() >= static_cast<size_t>(job.workers)) return preferred;
    }
    std::vector<size_t> any;
    std::map<std::string, std::vector<size_t>> by_region;
    for (size_t i = 0; i < idle.size(); ++i) {
      if (!Usable(i, job.region)) continue;
      any.push_back(i);
      std::vector<size_t>& in = by_region[idle[i]->region];
      in.push_back(i);
      if (job.region.empty() && in.size() == static_cast<size_t>(job.workers)) return in;
    }
    return any;
  }
};

}  // namespace

ScheduleDecision Schedule(std::vector<PendingJob> pending,
                          const std::vector<WorkerSlot>& workers) {
  std::sort(pending.begin(), pending.end(), [](const PendingJob& a, const PendingJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.id < b.id;
  });
  std::map<v1::DeviceKind, KindPool> pools;
  for (const WorkerSlot& w : workers) {
    KindPool& pool = pools[w.kind];
    ++pool.registered;
    ++pool.registered_in[w.region];
    if (w.idle) {
      pool.idle.push_back(&w);
      pool.used.push_back(false);
    }
  }

  ScheduleDecision decision;
  for (const PendingJob& job : pending) {
    const std::string kind = DeviceKindName(job.kind);
    KindPool& pool = pools[job.kind];
    const std::string in = job.region.empty() ? "" : absl::StrCat(" in region ", job.region);
    auto region_blocked = pool.region_blocked_by.find(job.region);
    const int64_t blocker = pool.blocked_by != 0 ? pool.blocked_by
                            : !job.region.empty() && region_blocked != pool.region_blocked_by.end()
                                ? region_blocked->second
                                : 0;
    if (blocker != 0) {
      decision.waiting[job.id] =
          absl::StrCat("queued behind job ", blocker, " for ", kind, " workers", in);
      continue;
    }
    const std::vector<size_t> candidates = pool.Candidates(job);
    if (candidates.size() >= static_cast<size_t>(job.workers)) {
      Placement p;
      p.job_id = job.id;
      for (int r = 0; r < job.workers; ++r) {
        pool.used[candidates[r]] = true;
        p.workers.push_back(pool.idle[candidates[r]]->id);
      }
      decision.placements.push_back(std::move(p));
      continue;
    }
    const int registered = job.region.empty() ? pool.registered : pool.registered_in[job.region];
    decision.waiting[job.id] =
        absl::StrCat("waiting for ", job.workers, " idle ", kind, " workers", in, ": ", registered,
                     " registered, ", candidates.size(), " idle");
    if (registered >= job.workers) {
      if (job.region.empty()) {
        pool.blocked_by = job.id;
      } else {
        pool.region_blocked_by.emplace(job.region, job.id);
      }
    }
  }
  return decision;
}

}  // namespace joule::server
