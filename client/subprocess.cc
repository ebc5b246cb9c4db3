#include "client/subprocess.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace joule::client {
namespace {

absl::Status CannotRun(const std::string& program, int error) {
  const std::string why =
      absl::StrCat("cannot run ", SanitizeUtf8(program, 300), ": ", std::strerror(error));
  switch (error) {
    case ENOENT: return absl::NotFoundError(why);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(why);
    default: return absl::UnavailableError(why);
  }
}

// In a child between fork and exec: descriptors 0-2 survive the exec. dup2 onto the same
// number (a CLI started with stdout closed opens its log as 1) keeps close-on-exec.
void KeepStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) fcntl(fd, F_SETFD, 0);
}

// Forks; the child runs `setup` (only async-signal-safe calls: it runs between fork and
// exec) and execs `argv`. Returns the child's pid once the exec succeeded; a failed exec's
// errno comes back through a close-on-exec pipe (the child has then exited, and is reaped).
absl::StatusOr<pid_t> ForkExec(const std::vector<std::string>& argv,
                               const std::function<void()>& setup) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return CannotRun(argv[0], errno);
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(report[0]);
    close(report[1]);
    return CannotRun(argv[0], e);
  }
  if (pid == 0) {
    close(report[0]);
    setup();
    execvp(args[0], args.data());
    const int e = errno;
    (void)!write(report[1], &e, sizeof e);
    _exit(127);
  }
  close(report[1]);
  int e = 0;
  ssize_t n;
  do {
    n = read(report[0], &e, sizeof e);
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == static_cast<ssize_t>(sizeof e)) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return CannotRun(argv[0], e);
  }
  return pid;
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log) {
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", SanitizeUtf8(log, 300), ": ", std::strerror(errno)));
  }
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  absl::StatusOr<pid_t> pid = ForkExec(argv, [fd, null] {
    setsid();
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    if (null >= 0) dup2(null, STDIN_FILENO);
    KeepStandardDescriptors();
  });
  close(fd);
  if (null >= 0) close(null);
  return pid;
}

absl::StatusOr<int> RunProgram(const std::vector<std::string>& argv, std::string* output) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  absl::StatusOr<pid_t> pid = ForkExec(argv, [&out] {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    KeepStandardDescriptors();
  });
  close(out[1]);
  if (!pid.ok()) {
    close(out[0]);
    return pid.status();
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0 && output->size() < (1 << 20)) output->append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 127;
}

}  // namespace joule::client
