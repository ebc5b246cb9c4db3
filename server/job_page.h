#ifndef JOULE_SERVER_JOB_PAGE_H_
#define JOULE_SERVER_JOB_PAGE_H_
// One page of ListJobs: the job store's rows merged with the jobs the coordinator holds in
// memory, whose state is newer than the stored one (a change may not be stored yet): the
// state filter applies to the state a user sees. Pure; thread-compatible (the caller holds
// the lock that guards the jobs in memory while it runs).
//
// Cost (issue 23: a page copied every job in memory, 20,000 pending jobs per page): it
// walks the jobs in memory newest first from `before`, copies at most `limit` jobs, and
// stops at the page's end; a job in memory that the filter drops costs a state compare.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule::server {

struct JobPageQuery {
  std::vector<v1::JobState> states;                   // empty: every state
  std::map<std::string, std::string> labels;          // every one must match
  int64_t before_id = 0;                              // jobs with id below it; 0: newest
  int limit = 100;                                    // >= 1
};

// The coordinator's jobs in memory, by id.
class JobsInMemory {
 public:
  virtual ~JobsInMemory() = default;
  virtual bool Contains(int64_t id) const = 0;
  // Calls `visit` for each job with id < `before`, newest first, until it returns false.
  virtual void VisitBefore(int64_t before,
                           const std::function<bool(const v1::Job&)>& visit) const = 0;
};

// `stored`: the store's page for `query` (its states and labels, newest first, at most
// query.limit rows; a full page means older rows exist). Returns the jobs newest first:
// stored rows not in memory, and jobs in memory in a wanted state with the labels, each
// counted towards the limit (a stored row the labels do not match, from a store that did
// not filter them, is counted and dropped); next_before_id where the next page starts (0:
// no more).
v1::ListJobsResponse MergeJobPage(std::vector<v1::Job> stored, const JobPageQuery& query,
                                  const JobsInMemory& memory);

}  // namespace joule::server

#endif  // JOULE_SERVER_JOB_PAGE_H_
