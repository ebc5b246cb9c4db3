#include "common/clock.h"

namespace joule {

const Clock* Clock::Real() {
  static const SystemClock* const clock = new SystemClock();
  return clock;
}

}  // namespace joule
