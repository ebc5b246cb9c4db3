#ifndef JOULE_COMMON_CLOCK_H_
#define JOULE_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace joule {

// The time, as a seam (leveldb's Env idea): durations come from a steady clock, which no
// NTP step or manual change of the system time can bend; timestamps a user reads come
// from the system clock. Tests inject a fake (tests/testing/fake_clock.h) to move either.
// Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // For durations and deadlines only.
  virtual std::chrono::steady_clock::time_point SteadyNow() const = 0;
  // Milliseconds since the Unix epoch, for timestamps only.
  virtual int64_t UnixMs() const = 0;

  // The process's real clocks; never null, never deleted.
  static const Clock* Real();
};

}  // namespace joule

#endif  // JOULE_COMMON_CLOCK_H_
