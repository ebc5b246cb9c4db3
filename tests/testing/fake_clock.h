#ifndef JOULE_TESTS_TESTING_FAKE_CLOCK_H_
#define JOULE_TESTS_TESTING_FAKE_CLOCK_H_

#include <atomic>
#include <chrono>

#include "worker/energy/clock.h"
#include "worker/energy/cpu_times.h"

namespace joule::testing {

// A clock that moves only when the test says. Thread-safe.
class FakeClock final : public worker::Clock {
 public:
  TimePoint Now() const override { return TimePoint(std::chrono::nanoseconds(ns_.load())); }
  void Advance(double seconds) { ns_ += static_cast<int64_t>(seconds * 1e9); }

 private:
  std::atomic<int64_t> ns_{1'000'000'000};
};

// CPU-time counters the test sets. Thread-safe enough for single-threaded tests.
class FakeCpuTimes final : public worker::CpuTimes {
 public:
  absl::StatusOr<double> ProcessSeconds() override { return process; }
  absl::StatusOr<double> SystemBusySeconds() override { return system_busy; }
  double process = 0;
  double system_busy = 0;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FAKE_CLOCK_H_
