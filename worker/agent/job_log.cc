#include "worker/agent/job_log.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>

#include "common/text.h"

namespace joule::worker {

void JobLogSink::Bind(int64_t job_id, int32_t attempt) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_id_ = job_id;
  attempt_ = attempt;
  if (pending_job_ != job_id || pending_attempt_ != attempt) {
    pending_.clear();  // an earlier attempt's lines nobody took
    dropped_ = 0;
  }
  pending_job_ = job_id;
  pending_attempt_ = attempt;
}

void JobLogSink::Unbind() {
  std::lock_guard<std::mutex> lock(mutex_);
  job_id_ = 0;
  attempt_ = 0;
}

JobLogSink::Taken JobLogSink::Take() {
  std::lock_guard<std::mutex> lock(mutex_);
  Taken t;
  t.job_id = pending_job_;
  t.attempt = pending_attempt_;
  t.dropped = dropped_;
  dropped_ = 0;
  const size_t n = std::min(kMaxTake, pending_.size());
  t.lines.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    t.lines.push_back(std::move(pending_.front()));
    pending_.pop_front();
  }
  return t;
}

void JobLogSink::sink_it_(const spdlog::details::log_msg& msg) {
  if (job_id_ == 0) return;
  if (pending_.size() >= kMaxPending) {
    pending_.pop_front();
    ++dropped_;
  }
  v1::LogLine line;
  line.set_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                       msg.time.time_since_epoch())
                       .count());
  const char* level = spdlog::level::to_short_c_str(msg.level);
  line.set_text(std::string(level) + " " +
                SanitizeUtf8(std::string_view(msg.payload.data(), msg.payload.size()),
                             kMaxLineBytes));
  pending_.push_back(std::move(line));
}

JobLogSink& ProcessJobLog() {
  static const std::shared_ptr<JobLogSink> sink = [] {
    auto created = std::make_shared<JobLogSink>();
    spdlog::default_logger()->sinks().push_back(created);
    return created;
  }();
  return *sink;
}

}  // namespace joule::worker
