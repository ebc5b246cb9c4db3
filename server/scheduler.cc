#include "server/scheduler.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace joule::server {

ScheduleDecision Schedule(std::vector<PendingJob> pending,
                          const std::vector<WorkerSlot>& workers) {
  std::sort(pending.begin(), pending.end(), [](const PendingJob& a, const PendingJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.id < b.id;
  });
  std::map<v1::DeviceKind, std::vector<std::string>> idle;
  std::map<v1::DeviceKind, int> registered;
  for (const WorkerSlot& w : workers) {
    ++registered[w.kind];
    if (w.idle) idle[w.kind].push_back(w.id);
  }
  std::map<v1::DeviceKind, size_t> next;  // first unused idle worker per kind
  std::map<v1::DeviceKind, int64_t> blocked_by;

  ScheduleDecision decision;
  for (const PendingJob& job : pending) {
    const std::string kind = DeviceKindName(job.kind);
    auto blocked = blocked_by.find(job.kind);
    if (blocked != blocked_by.end()) {
      decision.waiting[job.id] = absl::StrCat("queued behind job ", blocked->second,
                                              " for ", kind, " workers");
      continue;
    }
    const std::vector<std::string>& free = idle[job.kind];
    size_t available = free.size() - next[job.kind];
    if (available >= static_cast<size_t>(job.workers)) {
      Placement p;
      p.job_id = job.id;
      p.workers.assign(free.begin() + next[job.kind],
                       free.begin() + next[job.kind] + job.workers);
      next[job.kind] += job.workers;
      decision.placements.push_back(std::move(p));
      continue;
    }
    decision.waiting[job.id] = absl::StrCat(
        "waiting for ", job.workers, " idle ", kind, " workers: ", registered[job.kind],
        " registered, ", available, " idle");
    if (registered[job.kind] >= job.workers) blocked_by[job.kind] = job.id;
  }
  return decision;
}

}  // namespace joule::server
