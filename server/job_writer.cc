#include "server/job_writer.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/text.h"
#include "server/attempt.h"

namespace joule::server {

JobWriter::JobWriter(JobStore* store, double grid_gco2_per_kwh, Hooks hooks)
    : store_(store), grid_gco2_per_kwh_(grid_gco2_per_kwh), hooks_(std::move(hooks)) {
  thread_ = std::thread([this] { Loop(); });
}

JobWriter::~JobWriter() { Stop(std::chrono::steady_clock::now()); }

void JobWriter::MarkDirty(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  dirty_.insert(id);
  wake_.notify_one();
}

bool JobWriter::AddLateResult(LateResult late) {
  std::lock_guard<std::mutex> lock(mu_);
  if (late_.size() >= kMaxLateResults) {
    spdlog::warn("dropping a late result for job {}: {} are waiting for the store already",
                 late.report.job_id(), late_.size());
    return false;
  }
  late_.emplace_back(std::move(late), 0);
  wake_.notify_one();
  return true;
}

int JobWriter::AppendLog(int64_t job_id, int32_t rank, const v1::LogReport& report,
                         int64_t now_unix_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t& job_pending = logs_by_job_[job_id];
  const auto room = [&] {
    return logs_.size() < kMaxPendingLogLines && job_pending < kMaxPendingLogLinesPerJob;
  };
  int taken = 0;
  if (report.dropped() > 0 && room()) {
    ++job_pending;
    ++taken;
    v1::LogLine note;
    note.set_rank(rank);
    note.set_attempt(report.attempt());
    note.set_unix_ms(now_unix_ms);
    note.set_text(absl::StrCat("W (", std::min<int64_t>(report.dropped(), 1'000'000'000),
                               " lines dropped by the worker: it logged faster than it "
                               "could send)"));
    logs_.emplace_back(job_id, std::move(note));
  }
  int lines = 0;
  for (const v1::LogLine& in : report.lines()) {
    if (!room() || ++lines > kMaxLinesPerReport) break;
    ++job_pending;
    ++taken;
    v1::LogLine l;
    l.set_rank(rank);
    l.set_attempt(report.attempt());
    l.set_unix_ms(in.unix_ms());
    l.set_text(SanitizeUtf8(in.text(), 2048));
    logs_.emplace_back(job_id, std::move(l));
  }
  if (job_pending == 0) logs_by_job_.erase(job_id);
  if (taken > 0) wake_.notify_one();
  return taken;
}

bool JobWriter::LogPending(int64_t job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return logs_by_job_.count(job_id) > 0 || logs_writing_.count(job_id) > 0;
}

bool JobWriter::WaitStored(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return stored_.wait_until(lock, deadline, [&] { return IdleLocked() || stop_; }) &&
         IdleLocked();
}

bool JobWriter::Stop(std::chrono::steady_clock::time_point deadline) {
  const bool stored = WaitStored(deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  stored_.notify_all();
  if (thread_.joinable()) thread_.join();
  return stored;
}

void JobWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::chrono::milliseconds backoff{0};
  constexpr std::chrono::milliseconds kMaxBackoff{2000};
  while (true) {
    // After a failure: wait before retrying, unless told to stop.
    if (backoff.count() > 0) wake_.wait_for(lock, backoff, [&] { return stop_; });
    wake_.wait(lock, [&] { return stop_ || !dirty_.empty() || !late_.empty() || !logs_.empty(); });
    if (stop_) return;
    // Take what is to be written; write it without the lock.
    const std::vector<int64_t> ids(dirty_.begin(), dirty_.end());
    dirty_.clear();
    std::deque<std::pair<LateResult, int>> late;
    late.swap(late_);
    std::vector<std::pair<int64_t, v1::LogLine>> logs;
    logs.swap(logs_);
    for (const auto& [id, n] : logs_by_job_) logs_writing_.insert(id);
    logs_by_job_.clear();
    writing_ = true;
    lock.unlock();

    bool failed = false;
    std::vector<int64_t> retry_ids;
    const std::vector<std::pair<v1::Job, uint64_t>> jobs =
        ids.empty() ? std::vector<std::pair<v1::Job, uint64_t>>() : hooks_.snapshot(ids);
    for (const auto& [job, version] : jobs) {
      const absl::Status st = store_->Update(job);
      if (!st.ok()) {
        failed = true;
        retry_ids.push_back(job.id());
      }
      hooks_.on_stored(job.id(), version, st);
    }
    std::deque<std::pair<LateResult, int>> retry_late = StoreLateResults(std::move(late));
    failed = failed || !retry_late.empty();
    std::map<int64_t, std::vector<v1::LogLine>> by_job;
    for (auto& [id, line] : logs) by_job[id].push_back(std::move(line));
    for (const auto& [id, lines] : by_job) {
      if (absl::Status st = store_->AppendLog(id, lines, kMaxLogLinesPerJob); !st.ok()) {
        spdlog::warn("job {}: dropping {} log lines: {}", id, lines.size(), st.ToString());
      }
    }

    lock.lock();
    writing_ = false;
    logs_writing_.clear();
    dirty_.insert(retry_ids.begin(), retry_ids.end());
    for (auto& l : retry_late) late_.push_back(std::move(l));
    backoff = failed ? std::min(kMaxBackoff, std::max(std::chrono::milliseconds(50), 2 * backoff))
                     : std::chrono::milliseconds(0);
    stored_.notify_all();
  }
}

std::deque<std::pair<JobWriter::LateResult, int>> JobWriter::StoreLateResults(
    std::deque<std::pair<LateResult, int>> late) {
  std::deque<std::pair<LateResult, int>> retry;
  auto again = [&](std::pair<LateResult, int>& l, const absl::Status& why) {
    if (++l.second < kLateResultTries) {
      retry.push_back(std::move(l));
    } else {
      spdlog::error("job {}: dropping a late result of rank {} after {} tries: {}",
                    l.first.report.job_id(), l.first.rank, l.second, why.ToString());
    }
  };
  for (auto& entry : late) {
    const LateResult& l = entry.first;
    absl::StatusOr<v1::Job> stored = store_->Get(l.report.job_id());
    if (!stored.ok()) {
      if (stored.status().code() != absl::StatusCode::kNotFound) again(entry, stored.status());
      continue;
    }
    // A job the caller no longer holds has ended; one that has not is not ours (another
    // coordinator on the same database), and a uid that differs names another job.
    if (!IsTerminal(stored->state()) ||
        (!l.report.job_uid().empty() && l.report.job_uid() != stored->uid())) {
      continue;
    }
    const double before = stored->result().energy().total_joules();
    if (!MergeLateResult(*stored, l.rank, l.worker_id, l.report, grid_gco2_per_kwh_)) continue;
    if (absl::Status st = store_->Update(*stored); !st.ok()) {
      again(entry, st);
      continue;
    }
    hooks_.on_late_result_stored(*stored, stored->result().energy().total_joules() - before);
  }
  return retry;
}

}  // namespace joule::server
