#pragma once

#include "absl/status/status.h"

namespace joule {

// SIGINT and SIGTERM as a request to stop, whichever thread the kernel delivers them to.
//
// Why not sigwait with the signals blocked in main: threads that libraries start before
// main runs (OpenBLAS starts its pool when it is loaded) do not block them, so the kernel
// may deliver a process-directed SIGTERM to one of those. Its default action then killed
// the worker mid-attempt with no stop, and in a container, where the worker is PID 1, the
// kernel dropped it instead (`podman stop` waited its timeout, then sent SIGKILL). A
// handler, unlike a mask, applies to every thread, whenever it was started.
//
// The handler only writes the signal's number to a pipe (async-signal-safe, errno kept);
// WaitForShutdownSignal reads it. SA_RESTART: other threads' system calls resume.
//
// Thread-safety: InstallShutdownSignals once, before WaitForShutdownSignal; one thread
// waits. A second signal while stopping is read by no one: the process goes on stopping
// (a SIGKILL ends it).

// Installs the handlers. Errors: INTERNAL when the pipe or sigaction fails (errno's text).
absl::Status InstallShutdownSignals();

// Blocks until SIGINT or SIGTERM arrives; returns its number.
int WaitForShutdownSignal();

}  // namespace joule
