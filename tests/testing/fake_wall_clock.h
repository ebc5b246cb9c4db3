#ifndef JOULE_TESTS_TESTING_FAKE_WALL_CLOCK_H_
#define JOULE_TESTS_TESTING_FAKE_WALL_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/clock.h"

namespace joule::testing {

// A joule::Clock whose steady and system times move only when the test says, and
// independently: Step() moves the system clock alone (an NTP step), Advance() both.
// Thread-safe.
class FakeWallClock final : public Clock {
 public:
  std::chrono::steady_clock::time_point SteadyNow() const override {
    return std::chrono::steady_clock::time_point(std::chrono::milliseconds(steady_ms_.load()));
  }
  int64_t UnixMs() const override { return unix_ms_.load(); }
  void Advance(std::chrono::milliseconds d) {
    steady_ms_ += d.count();
    unix_ms_ += d.count();
  }
  void Step(std::chrono::milliseconds d) { unix_ms_ += d.count(); }

 private:
  std::atomic<int64_t> steady_ms_{1'000'000};
  std::atomic<int64_t> unix_ms_{1'800'000'000'000};  // January 2027
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FAKE_WALL_CLOCK_H_
