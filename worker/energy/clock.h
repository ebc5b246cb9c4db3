#ifndef JOULE_WORKER_ENERGY_CLOCK_H_
#define JOULE_WORKER_ENERGY_CLOCK_H_

#include "common/clock.h"

namespace joule::worker {

// The energy code's time seam is the project's (common/clock.h): the steady clock in
// production, a hand-driven fake (tests/testing/fake_clock.h) in tests.
using Clock = joule::Clock;
using SteadyClock = joule::SystemClock;
using joule::Seconds;

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_CLOCK_H_
