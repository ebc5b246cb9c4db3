#include "common/runtime.h"

#include "absl/synchronization/mutex.h"

namespace joule {

void InitProcessRuntime() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace joule
