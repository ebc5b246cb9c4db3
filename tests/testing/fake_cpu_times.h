#ifndef JOULE_TESTS_TESTING_FAKE_CPU_TIMES_H_
#define JOULE_TESTS_TESTING_FAKE_CPU_TIMES_H_

#include "worker/energy/cpu_times.h"

namespace joule::testing {

// CPU-time counters the test sets. Thread-safe enough for single-threaded tests.
class FakeCpuTimes final : public worker::CpuTimes {
 public:
  absl::StatusOr<double> ProcessSeconds() override { return process; }
  absl::StatusOr<double> SystemBusySeconds() override { return system_busy; }
  double process = 0;
  double system_busy = 0;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FAKE_CPU_TIMES_H_
