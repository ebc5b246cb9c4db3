#pragma once

namespace joule {

// Settings of the libraries' runtime that every long-lived Joule process (coordinator,
// worker) makes once at start, before it starts threads:
// - Abseil's mutex deadlock detector off. Debian builds Abseil without NDEBUG, so every
//   absl::Mutex (gRPC's locks are) keeps a global lock-order graph: with 10,000 worker
//   sessions it took 10% of the coordinator's CPU (bench/README "Liveness of many
//   workers"). Joule's own locks are std::mutex, which it never checked.
// Not thread-safe: call it first thing in main.
void InitProcessRuntime();

}  // namespace joule
