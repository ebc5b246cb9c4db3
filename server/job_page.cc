#include "server/job_page.h"

#include <algorithm>
#include <optional>

namespace joule::server {

v1::ListJobsResponse MergeJobPage(std::vector<v1::Job> stored, const JobPageQuery& query,
                                  const JobsInMemory& memory) {
  const int limit = std::max(1, query.limit);
  const auto state_wanted = [&](const v1::Job& j) {
    return query.states.empty() ||
           std::find(query.states.begin(), query.states.end(), j.state()) != query.states.end();
  };
  const auto labels_match = [&](const v1::Job& j) {
    for (const auto& [k, v] : query.labels) {
      auto it = j.spec().labels().find(k);
      if (it == j.spec().labels().end() || it->second != v) return false;
    }
    return true;
  };
  // A page ends where the store's did: jobs older than its last row are the next page's.
  const int64_t oldest =
      static_cast<int>(stored.size()) >= limit && !stored.empty() ? stored.back().id() : 0;
  const int64_t before = query.before_id > 0 ? query.before_id : INT64_MAX;
  v1::ListJobsResponse response;
  int64_t last = 0;  // the oldest job of the page before the label filter
  int taken = 0;
  size_t row = 0;    // the next stored row
  // Stored rows newer than `id` (those not in memory) go first; false once the page is full.
  const auto take_stored_above = [&](int64_t id) {
    for (; row < stored.size() && stored[row].id() > id; ++row) {
      v1::Job& job = stored[row];
      if (job.id() < oldest || job.id() >= before) continue;
      if (memory.Contains(job.id())) continue;  // its state in memory stands
      if (taken == limit) return false;
      ++taken;
      last = job.id();
      if (labels_match(job)) *response.add_jobs() = std::move(job);
    }
    return taken < limit;
  };
  memory.VisitBefore(before, [&](const v1::Job& job) {
    if (job.id() < oldest) return false;
    if (!take_stored_above(job.id())) return false;
    if (!state_wanted(job) || !labels_match(job)) return true;
    ++taken;
    last = job.id();
    *response.add_jobs() = job;
    return taken < limit;
  });
  if (taken < limit) take_stored_above(INT64_MIN);
  if (taken == limit) {
    response.set_next_before_id(last);
  } else if (oldest > 0) {
    response.set_next_before_id(oldest);
  }
  return response;
}

}  // namespace joule::server
