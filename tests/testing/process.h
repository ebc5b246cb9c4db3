#ifndef JOULE_TESTS_TESTING_PROCESS_H_
#define JOULE_TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace joule::testing {

// A child process started by a test: real programs on loopback. Killed (SIGKILL) and
// reaped on destruction, so a failing test leaves nothing behind. Not thread-safe.
class ChildProcess {
 public:
  // Starts argv[0] (a path) with stdout and stderr appended to `log`.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits up to `timeout` for the process to exit; returns its wait status or -1.
  int Wait(std::chrono::milliseconds timeout);
  bool running();

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// Runs a command to completion, capturing stdout; returns the exit code.
int RunCommand(const std::vector<std::string>& argv, std::string* output);

// GET `url` with curl (5 s at most), the Prometheus HTTP API's `query` parameter added when
// `query` is not empty; the body, or "" on any failure.
std::string HttpGet(const std::string& url, const std::string& query = "");

// An HTTP/1.1 connection to 127.0.0.1:`port` that asks for keep-alive and then stays open
// and idle, as Prometheus's scrape connections do between scrapes. Not thread-safe.
class KeptAliveConnection {
 public:
  // Connects and sends one GET of `path`, reading its whole response (headers and a
  // Content-Length body); ok() is false when any of that failed.
  KeptAliveConnection(int port, const std::string& path);
  ~KeptAliveConnection();
  KeptAliveConnection(const KeptAliveConnection&) = delete;
  KeptAliveConnection& operator=(const KeptAliveConnection&) = delete;

  bool ok() const { return !response_.empty(); }
  // Status line, headers and body as received.
  const std::string& response() const { return response_; }
  // Whether the server has closed the connection (a read sees end of file); blocks until
  // it does or sends something.
  bool ClosedByServer();

 private:
  int fd_ = -1;
  std::string response_;
};

// A TCP port free now on 127.0.0.1 (bound and released: a server that binds it later may
// race another); 0 when none could be bound.
int FreeLoopbackPort();

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_PROCESS_H_
