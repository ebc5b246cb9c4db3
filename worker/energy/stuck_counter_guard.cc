#include "worker/energy/stuck_counter_guard.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_format.h"

namespace joule::worker {

StuckCounterGuard::StuckCounterGuard(std::unique_ptr<PowerSource> counters,
                                     std::unique_ptr<PowerSource> fallback, CpuTimes* cpu)
    : counters_(std::move(counters)), fallback_(std::move(fallback)), cpu_(cpu) {
  channels_ = counters_->channels();
  channels_.insert(channels_.end(), fallback_->channels().begin(), fallback_->channels().end());
  if (!counters_->channels().empty()) counter_name_ = counters_->channels().front().source;
  if (!fallback_->channels().empty()) fallback_name_ = fallback_->channels().front().source;
  pending_.assign(fallback_->channels().size(), 0.0);
  if (absl::StatusOr<double> s = cpu_->ProcessSeconds(); s.ok()) last_cpu_ = *s;
}

absl::Status StuckCounterGuard::Read(Clock::TimePoint now, std::vector<double>* joules) {
  joules->clear();
  const size_t nc = counters_->channels().size(), nf = fallback_->channels().size();
  std::vector<double> c, f;
  const absl::Status counted = counters_->Read(now, &c);
  const absl::Status fell_back = fallback_->Read(now, &f);
  const bool fallback_read = f.size() == nf;
  if (!fallback_read) f.assign(nf, 0.0);  // the fallback lost this interval: nothing to add
  double cpu_seconds = 0;
  if (absl::StatusOr<double> s = cpu_->ProcessSeconds(); s.ok()) {
    if (last_cpu_ >= 0) cpu_seconds = std::max(0.0, *s - last_cpu_);
    last_cpu_ = *s;
  }
  // A failed read is a still interval: the counter source carries its energy into its
  // next good read (which, while counting, clears what the fallback held for it), and
  // reads that keep failing end as a stuck counter, not as energy lost.
  const bool counter_read = c.size() == nc;
  if (!counter_read) {
    c.assign(nc, 0.0);
    ++failed_reads_;
  }
  const bool advanced = std::any_of(c.begin(), c.end(), [](double j) { return j > 0; });
  std::vector<double> out(nc + nf, 0.0);
  last_all_.clear();
  if (state_ == State::kCounting && counter_read && fallback_read) {
    last_all_ = c;
    last_all_.insert(last_all_.end(), f.begin(), f.end());
  }
  if (state_ == State::kCounting) {
    std::copy(c.begin(), c.end(), out.begin());
    if (advanced) {
      still_intervals_ = busy_still_intervals_ = failed_reads_ = 0;
      still_cpu_ = 0;
      std::fill(pending_.begin(), pending_.end(), 0.0);
    } else {
      if (still_intervals_++ == 0) {
        still_since_ = last_read_ == Clock::TimePoint{} ? now : last_read_;
      }
      if (cpu_seconds > 0) ++busy_still_intervals_;
      still_cpu_ += cpu_seconds;
      for (size_t i = 0; i < nf; ++i) pending_[i] += f[i];
      const double still_seconds = Seconds(now - still_since_);
      if ((busy_still_intervals_ >= kStuckIntervals && still_cpu_ >= kMinCpuSeconds) ||
          (still_intervals_ >= kStuckIntervals && still_seconds >= kStuckSeconds)) {
        state_ = State::kStuck;
        advancing_ = 0;
        reason_code_ = failed_reads_ == still_intervals_ ? "unreadable" : "no_advance";
        reason_ = absl::StrFormat(
            "%s: no counter advanced in %d intervals (%.1f s%s) while this process used %.2f "
            "s of CPU: stuck; its energy is charged to %s from the first of them until it "
            "advances again",
            counter_name_, still_intervals_, still_seconds,
            failed_reads_ > 0 ? absl::StrFormat(", %d of them unreadable", failed_reads_) : "",
            still_cpu_, fallback_name_);
        for (size_t i = 0; i < nf; ++i) out[nc + i] = pending_[i];
        std::fill(pending_.begin(), pending_.end(), 0.0);
      }
    }
  } else {
    for (size_t i = 0; i < nf; ++i) out[nc + i] = f[i];
    if (!advanced) {
      advancing_ = 0;
      state_ = State::kStuck;
    } else if (++advancing_ >= kConfirmIntervals) {
      state_ = State::kCounting;
      still_intervals_ = busy_still_intervals_ = failed_reads_ = 0;
      still_cpu_ = 0;
      spdlog::info("energy: {}: counting again after {} advancing intervals; {} stands by",
                   counter_name_, advancing_, fallback_name_);
      reason_.clear();
    } else {
      state_ = State::kConfirming;
    }
  }
  last_read_ = now;
  *joules = std::move(out);
  // A warning of whichever source is charged (joules filled: figures kept).
  if (state_ == State::kCounting) return counted;
  return fell_back;
}

void StuckCounterGuard::ProbeAtStart(std::chrono::milliseconds wait, const Clock& clock) {
  std::vector<double> j;
  (void)counters_->Read(clock.Now(), &j);  // from Open until now: not charged
  std::this_thread::sleep_for(wait);
  const Clock::TimePoint now = clock.Now();
  if (!counters_->Read(now, &j).ok() || j.size() != counters_->channels().size()) return;
  last_read_ = now;
  if (std::any_of(j.begin(), j.end(), [](double v) { return v > 0; })) return;
  state_ = State::kStuck;
  advancing_ = 0;
  reason_code_ = "still_at_start";
  reason_ = absl::StrFormat(
      "%s: no counter advanced in %lld ms at start (a powered host's RAPL counters advance "
      "every millisecond): stuck; its energy is charged to %s until it advances again",
      counter_name_, static_cast<long long>(wait.count()), fallback_name_);
}

bool StuckCounterGuard::LastReadAll(std::vector<double>* joules) const {
  if (last_all_.empty()) return false;
  *joules = last_all_;
  return true;
}

void StuckCounterGuard::AppendNotes(std::vector<std::string>* out) const {
  counters_->AppendNotes(out);
  fallback_->AppendNotes(out);
  if (state_ != State::kCounting) out->push_back(reason_);
}

void StuckCounterGuard::AppendStatus(std::vector<DeviceStatus>* out) {
  counters_->AppendStatus(out);
}

void StuckCounterGuard::AppendSourceStates(std::vector<SourceState>* out) const {
  if (state_ == State::kCounting) {
    out->push_back({counter_name_, "counting", ""});
    out->push_back({fallback_name_, "standby", "fallback"});
    return;
  }
  // Labels: a fixed code, not the message (its figures would make a series per episode).
  out->push_back({counter_name_, "stuck", reason_code_});
  out->push_back({fallback_name_, "standing_in", counter_name_ + "_stuck"});
}

}  // namespace joule::worker
