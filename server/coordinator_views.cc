// The coordinator's read side: jobs, logs, power and workers as clients see them, and
// what /metrics and /http_sd serve. Nothing here changes a job.
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "server/admission.h"
#include "server/coordinator.h"
#include "server/http_sd.h"
#include "server/job_page.h"
#include "server/usage.h"

namespace joule::server {

std::string Coordinator::CapacityWarning(const v1::JobSpec& spec) {
  const v1::DeviceKind kind =
      spec.device_kind() == v1::DEVICE_KIND_GPU ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU;
  std::lock_guard<std::mutex> lock(mu_);
  int registered = 0;
  for (const v1::WorkerInfo& w : workers_.List()) registered += w.device_kind() == kind ? 1 : 0;
  return server::CapacityWarning(spec, registered);
}

absl::StatusOr<v1::Job> Coordinator::GetJob(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find(id);
    if (it != active_.end()) {
      v1::Job job = it->second.job;
      // A state the user can see that is not stored yet says so (issue 23).
      if (it->second.stored_version < it->second.version) {
        job.set_store_error(it->second.store_error);
      }
      return job;
    }
  }
  return store_->Get(id);
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request) {
  int limit = request.page_size() <= 0 ? 100 : std::min(request.page_size(), 1000);
  std::vector<v1::JobState> states;
  for (int st : request.states()) {
    if (!v1::JobState_IsValid(st) || st == v1::JOB_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("no job state has the value ", st));
    }
    states.push_back(static_cast<v1::JobState>(st));
  }
  if (!v1::JobState_IsValid(request.state())) {
    return absl::InvalidArgumentError(absl::StrCat("no job state has the value ", request.state()));
  }
  if (request.state() != v1::JOB_STATE_UNSPECIFIED) states.push_back(request.state());
  if (request.labels_size() > 64) {
    return absl::InvalidArgumentError("at most 64 label filters");
  }
  JobPageQuery query;
  query.labels.insert(request.labels().begin(), request.labels().end());
  // Filtered by the store's indexes: a page holds page_size jobs at any depth.
  absl::StatusOr<std::vector<v1::Job>> jobs =
      store_->List(states, query.labels, request.before_id(), limit);
  if (!jobs.ok()) return jobs.status();
  query.states = std::move(states);
  query.before_id = request.before_id();
  query.limit = limit;
  // The jobs in memory, newest first from `before`: an ordered walk, no copies.
  class ActiveJobs : public JobsInMemory {
   public:
    explicit ActiveJobs(const std::map<int64_t, ActiveJob>& active) : active_(active) {}
    bool Contains(int64_t id) const override { return active_.count(id) > 0; }
    void VisitBefore(int64_t before,
                     const std::function<bool(const v1::Job&)>& visit) const override {
      for (auto it = std::make_reverse_iterator(active_.lower_bound(before));
           it != active_.rend(); ++it) {
        if (!visit(it->second.job)) return;
      }
    }

   private:
    const std::map<int64_t, ActiveJob>& active_;
  };
  std::lock_guard<std::mutex> lock(mu_);
  return MergeJobPage(*std::move(jobs), query, ActiveJobs(active_));
}

absl::StatusOr<v1::UsageResponse> Coordinator::Usage(const v1::UsageRequest& request) {
  if (absl::Status s = UsageTally::Validate(request); !s.ok()) return s;
  UsageTally tally(request, options_.grid_gco2_per_kwh);
  v1::ListJobsRequest page;
  page.mutable_states()->CopyFrom(request.states());
  page.set_page_size(1000);
  while (true) {
    absl::StatusOr<v1::ListJobsResponse> jobs = ListJobs(page);
    if (!jobs.ok()) return jobs.status();
    bool older = false;
    for (const v1::Job& job : jobs->jobs()) {
      // Ids follow creation times only roughly (a submit stamps its time before its insert
      // takes an id; coordinators' clocks differ): an hour's slack before stopping, and
      // the tally keeps to the window exactly.
      if (request.since_unix_ms() > 0 &&
          job.created_unix_ms() < request.since_unix_ms() - 3600 * 1000) {
        older = true;
        break;
      }
      tally.Add(job);
    }
    if (older || jobs->next_before_id() <= 0) break;
    page.set_before_id(jobs->next_before_id());
  }
  return tally.Finish();
}

absl::StatusOr<v1::Job> Coordinator::WaitForJobChange(
    int64_t id, v1::Job* last, std::chrono::steady_clock::time_point deadline, bool* final) {
  std::unique_lock<std::mutex> lock(mu_);
  if (final != nullptr) *final = false;
  while (true) {
    if (shutting_down_) return absl::UnavailableError(kShuttingDown);
    auto it = active_.find(id);
    if (it == active_.end()) {
      // Ended and stored: read it without the lock; it does not change any more.
      lock.unlock();
      absl::StatusOr<v1::Job> stored = store_->Get(id);
      if (!stored.ok()) return stored.status();
      if (final != nullptr) *final = IsTerminal(stored->state());
      *last = *stored;
      return *std::move(stored);
    }
    const v1::Job& current = it->second.job;
    // An end is final once stored: until then a crash would run the job again.
    const bool ended = IsTerminal(current.state()) &&
                       it->second.stored_version == it->second.version;
    const bool same = last->id() == id &&
                      google::protobuf::util::MessageDifferencer::Equals(current, *last);
    if (!same || ended || stopping_ || std::chrono::steady_clock::now() >= deadline) {
      if (final != nullptr) *final = ended;
      *last = current;
      return current;
    }
    changed_.wait_until(lock, deadline);
  }
}

absl::StatusOr<std::vector<v1::RankPower>> Coordinator::JobPower(int64_t id) {
  std::vector<v1::RankPower> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find(id);
    if (it != active_.end() && it->second.job.state() == v1::JOB_STATE_RUNNING) {
      return it->second.live.Power();
    }
  }
  absl::StatusOr<v1::Job> job = GetJob(id);
  if (!job.ok()) return job.status();
  const auto& attempts = job->result().attempts();
  for (int i = attempts.size() - 1; i >= 0; --i) {
    if (attempts[i].power_size() == 0) continue;
    out.assign(attempts[i].power().begin(), attempts[i].power().end());
    break;
  }
  return out;
}

absl::StatusOr<v1::GetJobLogResponse> Coordinator::GetJobLog(
    const v1::GetJobLogRequest& request) {
  if (request.limit() < 0 || request.limit() > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit ", request.limit(), " is out of range [0, 10000]"));
  }
  absl::StatusOr<v1::Job> job = GetJob(request.job_id());
  if (!job.ok()) return job.status();
  const int limit = request.limit() == 0 ? 1000 : request.limit();
  absl::StatusOr<std::vector<v1::LogLine>> lines = store_->ReadLog(
      request.job_id(), request.rank() < 0 ? -1 : request.rank(),
      std::max<int64_t>(request.after_seq(), -limit), limit);
  if (!lines.ok()) return lines.status();
  v1::GetJobLogResponse response;
  response.set_state(job->state());
  if (IsTerminal(job->state())) {
    // Its last lines may still wait for the writer: not ended for a follower until stored.
    if (writer_->LogPending(request.job_id())) response.set_state(v1::JOB_STATE_RUNNING);
  }
  response.set_last_seq(std::max<int64_t>(0, request.after_seq()));
  for (v1::LogLine& l : *lines) {
    response.set_last_seq(l.seq());
    *response.add_lines() = std::move(l);
  }
  return response;
}

std::vector<v1::WorkerInfo> Coordinator::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::WorkerInfo> workers = workers_.List();
  for (v1::WorkerInfo& w : workers) {
    if (w.state() != v1::WORKER_STATE_BUSY) continue;
    auto it = active_.find(w.job_id());
    if (it == active_.end()) continue;
    const ActiveJob& active = it->second;
    w.set_job_energy_joules(active.job.progress().job_energy_joules());
    if (auto r = active.live.rank_joules().find(w.rank());
        r != active.live.rank_joules().end()) {
      w.set_rank_energy_joules(r->second);
    }
  }
  return workers;
}

void Coordinator::RefreshMetrics() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<v1::JobState, int> jobs;
  for (const auto& [id, a] : active_) {
    if (!IsTerminal(a.job.state())) ++jobs[a.job.state()];
  }
  metrics_.SetCounts(jobs, workers_.List());
}

std::string Coordinator::HttpSdJson() {
  std::vector<v1::WorkerInfo> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    targets = workers_.ScrapeTargets();
  }
  return server::HttpSdJson(targets);
}

}  // namespace joule::server
