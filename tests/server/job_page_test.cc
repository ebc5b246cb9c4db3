// MergeJobPage against the merge it replaced (a copy of every job in memory, then a sort),
// over random stores, memories, filters and page sizes; and that it copies only what the
// page holds (issue 23: listing copied every pending job for every page).
#include "server/job_page.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>

namespace joule::server {
namespace {

class FakeMemory : public JobsInMemory {
 public:
  std::map<int64_t, v1::Job> jobs;
  mutable int visited = 0;
  bool Contains(int64_t id) const override { return jobs.count(id) > 0; }
  void VisitBefore(int64_t before,
                   const std::function<bool(const v1::Job&)>& visit) const override {
    for (auto it = std::make_reverse_iterator(jobs.lower_bound(before)); it != jobs.rend(); ++it) {
      ++visited;
      if (!visit(it->second)) return;
    }
  }
};

// The previous implementation, as it was in Coordinator::ListJobs.
v1::ListJobsResponse Reference(std::vector<v1::Job> stored, const JobPageQuery& q,
                               const std::map<int64_t, v1::Job>& memory) {
  const auto state_wanted = [&](const v1::Job& j) {
    return q.states.empty() || std::find(q.states.begin(), q.states.end(), j.state()) != q.states.end();
  };
  const auto labels_match = [&](const v1::Job& j) {
    for (const auto& [k, v] : q.labels) {
      auto it = j.spec().labels().find(k);
      if (it == j.spec().labels().end() || it->second != v) return false;
    }
    return true;
  };
  const int64_t before = q.before_id > 0 ? q.before_id : INT64_MAX;
  std::map<int64_t, v1::Job, std::greater<>> page;
  for (v1::Job& job : stored) {
    if (memory.count(job.id())) continue;
    page[job.id()] = job;
  }
  for (const auto& [id, j] : memory) {
    if (id < before && state_wanted(j) && labels_match(j)) page[id] = j;
  }
  const int64_t oldest = static_cast<int>(stored.size()) == q.limit ? stored.back().id() : 0;
  v1::ListJobsResponse response;
  int64_t last = 0;
  int taken = 0;
  for (auto& [id, job] : page) {
    if (id < oldest || taken == q.limit) break;
    ++taken;
    last = id;
    if (labels_match(job)) *response.add_jobs() = job;
  }
  if (taken == q.limit) {
    response.set_next_before_id(last);
  } else if (oldest > 0) {
    response.set_next_before_id(oldest);
  }
  return response;
}

v1::Job MakeJob(int64_t id, v1::JobState state, const std::string& team) {
  v1::Job j;
  j.set_id(id);
  j.set_state(state);
  if (!team.empty()) (*j.mutable_spec()->mutable_labels())["team"] = team;
  return j;
}

TEST(JobPageTest, AgreesWithTheFullMergeOnRandomPages) {
  std::mt19937 rng(23);
  const v1::JobState kStates[] = {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING,
                                  v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED};
  for (int trial = 0; trial < 3000; ++trial) {
    SCOPED_TRACE(trial);
    const int n = 1 + rng() % 60;
    // Every job is stored (with a state that may be stale); some are also in memory.
    std::vector<v1::Job> all;
    FakeMemory memory;
    for (int id = 1; id <= n; ++id) {
      const std::string team = rng() % 3 == 0 ? "a" : (rng() % 2 ? "b" : "");
      all.push_back(MakeJob(id, kStates[rng() % 4], team));
      if (rng() % 3 == 0) {
        v1::Job newer = all.back();
        newer.set_state(kStates[rng() % 4]);
        memory.jobs[id] = newer;
      }
    }
    JobPageQuery q;
    if (rng() % 2) q.states.push_back(kStates[rng() % 4]);
    if (rng() % 4 == 0) q.states.push_back(kStates[rng() % 4]);
    if (rng() % 3 == 0) q.labels["team"] = rng() % 2 ? "a" : "b";
    q.before_id = rng() % 3 == 0 ? 1 + rng() % (n + 1) : 0;
    q.limit = 1 + rng() % 12;
    // The store's page: its states as stored, below before, newest first, at most limit.
    std::vector<v1::Job> stored;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (q.before_id > 0 && it->id() >= q.before_id) continue;
      if (!q.states.empty() &&
          std::find(q.states.begin(), q.states.end(), it->state()) == q.states.end()) {
        continue;
      }
      if (static_cast<int>(stored.size()) == q.limit) break;
      stored.push_back(*it);
    }
    const v1::ListJobsResponse want = Reference(stored, q, memory.jobs);
    const v1::ListJobsResponse got = MergeJobPage(stored, q, memory);
    ASSERT_EQ(got.SerializeAsString(), want.SerializeAsString())
        << "got " << got.ShortDebugString() << "\nwant " << want.ShortDebugString();
  }
}

TEST(JobPageTest, APageOfPendingJobsVisitsOnlyWhatItHolds) {
  FakeMemory memory;
  for (int id = 1; id <= 20000; ++id) memory.jobs[id] = MakeJob(id, v1::JOB_STATE_PENDING, "");
  JobPageQuery q;
  q.states = {v1::JOB_STATE_PENDING};
  q.limit = 50;
  std::vector<v1::Job> stored;
  for (int id = 20000; id > 19950; --id) stored.push_back(MakeJob(id, v1::JOB_STATE_PENDING, ""));
  const v1::ListJobsResponse page = MergeJobPage(stored, q, memory);
  ASSERT_EQ(page.jobs_size(), 50);
  EXPECT_EQ(page.jobs(0).id(), 20000);
  EXPECT_EQ(page.jobs(49).id(), 19951);
  EXPECT_EQ(page.next_before_id(), 19951);
  EXPECT_LE(memory.visited, 51);
  // The next page starts where this one ended.
  memory.visited = 0;
  q.before_id = page.next_before_id();
  stored.clear();
  for (int id = 19950; id > 19900; --id) stored.push_back(MakeJob(id, v1::JOB_STATE_PENDING, ""));
  const v1::ListJobsResponse next = MergeJobPage(stored, q, memory);
  ASSERT_EQ(next.jobs_size(), 50);
  EXPECT_EQ(next.jobs(0).id(), 19950);
  EXPECT_LE(memory.visited, 51);
}

}  // namespace
}  // namespace joule::server
