#include "common/clock.h"

namespace joule {
namespace {

class RealClock final : public Clock {
 public:
  std::chrono::steady_clock::time_point SteadyNow() const override {
    return std::chrono::steady_clock::now();
  }
  int64_t UnixMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

const Clock* Clock::Real() {
  static const RealClock* const clock = new RealClock();
  return clock;
}

}  // namespace joule
