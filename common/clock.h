#ifndef JOULE_COMMON_CLOCK_H_
#define JOULE_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace joule {

// The time, as a seam (leveldb's Env idea): durations come from a steady clock, which no
// NTP step or manual change of the system time can bend; timestamps a user reads come
// from the system clock. The coordinator, the worker's agent and its energy meter take
// one; tests inject a fake (tests/testing/fake_clock.h) that moves only when told, so
// heartbeats, expiry and energy intervals are tested without sleeping.
// Implementations are thread-safe.
class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  // For durations and deadlines only.
  virtual TimePoint Now() const = 0;
  // Milliseconds since the Unix epoch, for timestamps only.
  virtual int64_t UnixMs() const = 0;

  // The process's real clocks; never null, never deleted.
  static const Clock* Real();
};

// The real clocks (Clock::Real() is one), for owners that hold a clock by value.
class SystemClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  int64_t UnixMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

// Seconds of a steady-clock duration.
inline double Seconds(Clock::TimePoint::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace joule

#endif  // JOULE_COMMON_CLOCK_H_
