#ifndef JOULE_WORKER_ENERGY_CLOCK_H_
#define JOULE_WORKER_ENERGY_CLOCK_H_

#include <chrono>

namespace joule::worker {

// The time seam of the energy code: the steady clock in production, a hand-driven fake
// (tests/testing/fake_clock.h) in tests. Implementations are thread-safe.
class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

inline double Seconds(Clock::TimePoint::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_CLOCK_H_
