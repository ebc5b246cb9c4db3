#ifndef JOULE_WORKER_AGENT_JOB_LOG_H_
#define JOULE_WORKER_AGENT_JOB_LOG_H_

#include <spdlog/sinks/base_sink.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule::worker {

// What a worker logs while it runs an attempt, kept for the coordinator (`joule logs`):
// an spdlog sink on the worker's logger that, while an attempt is bound, keeps each line
// (its message, not the worker's prefix; cut to kMaxLineBytes, made valid UTF-8 on one
// line) with its time. At most kMaxPending lines wait to be taken; older ones are dropped
// and counted. Thread-safe (spdlog's sink mutex guards it all).
class JobLogSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  static constexpr size_t kMaxPending = 2000;
  static constexpr size_t kMaxLineBytes = 2048;
  static constexpr size_t kMaxTake = 500;  // lines per LogReport

  // Lines logged from now on belong to (job, attempt), until Unbind.
  void Bind(int64_t job_id, int32_t attempt);
  void Unbind();
  struct Taken {
    int64_t job_id = 0;
    int32_t attempt = 0;
    std::vector<v1::LogLine> lines;  // unix_ms and text set
    int64_t dropped = 0;
  };
  // Takes up to kMaxTake waiting lines (of the attempt they were logged in).
  Taken Take();

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  int64_t job_id_ = 0;  // 0: no attempt bound
  int32_t attempt_ = 0;
  int64_t pending_job_ = 0;  // the attempt the waiting lines belong to
  int32_t pending_attempt_ = 0;
  std::deque<v1::LogLine> pending_;
  int64_t dropped_ = 0;
};

// The process's job-log sink, added to spdlog's default logger at the first call (one
// whatever the number of agents: tests run several). Thread-safe.
JobLogSink& ProcessJobLog();

}  // namespace joule::worker

#endif  // JOULE_WORKER_AGENT_JOB_LOG_H_
