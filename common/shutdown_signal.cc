#include "common/shutdown_signal.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace joule {
namespace {

int g_pipe[2] = {-1, -1};

void OnShutdownSignal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  // A full pipe means a stop is already requested: nothing to add.
  [[maybe_unused]] ssize_t n = write(g_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

absl::Status InstallShutdownSignals() {
  if (g_pipe[0] < 0 && pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("shutdown signals: pipe: ", std::strerror(errno)));
  }
  // The reading end blocks; the writing end never does (the handler must not).
  const int flags = fcntl(g_pipe[0], F_GETFL);
  if (flags < 0 || fcntl(g_pipe[0], F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("shutdown signals: fcntl: ", std::strerror(errno)));
  }
  struct sigaction action = {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM}) {
    if (sigaction(sig, &action, nullptr) != 0) {
      return absl::InternalError(
          absl::StrCat("shutdown signals: sigaction(", sig, "): ", std::strerror(errno)));
    }
  }
  // A mask inherited from the parent (a shell, a supervisor) would keep them pending.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
  return absl::OkStatus();
}

int WaitForShutdownSignal() {
  unsigned char byte = 0;
  while (true) {
    const ssize_t n = read(g_pipe[0], &byte, 1);
    if (n == 1) return byte;
    if (n < 0 && errno == EINTR) continue;
    // The pipe is ours and never closed: only a broken process gets here. Stop.
    return SIGTERM;
  }
}

}  // namespace joule
