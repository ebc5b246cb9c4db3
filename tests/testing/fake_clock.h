#ifndef JOULE_TESTS_TESTING_FAKE_CLOCK_H_
#define JOULE_TESTS_TESTING_FAKE_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/clock.h"

namespace joule::testing {

// A clock that moves only when the test says: Advance() moves the steady and the system
// clock together, Step() the system clock alone (an NTP step). Thread-safe.
class FakeClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(std::chrono::nanoseconds(ns_.load())); }
  int64_t UnixMs() const override { return unix_ms_.load(); }
  void Advance(double seconds) {
    ns_ += static_cast<int64_t>(seconds * 1e9);
    unix_ms_ += static_cast<int64_t>(seconds * 1e3);
  }
  void Advance(std::chrono::milliseconds d) { Advance(d.count() / 1e3); }
  void Step(std::chrono::milliseconds d) { unix_ms_ += d.count(); }

 private:
  std::atomic<int64_t> ns_{1'000'000'000};
  std::atomic<int64_t> unix_ms_{1'800'000'000'000};  // January 2027
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FAKE_CLOCK_H_
