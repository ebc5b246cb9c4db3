#include "tests/testing/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace joule::testing {
namespace {

std::vector<char*> Argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args = Argv(argv);
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

int ChildProcess::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

bool ChildProcess::running() {
  if (reaped_) return false;
  int status;
  if (waitpid(pid_, &status, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

int RunCommand(const std::vector<std::string>& argv, std::string* output) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return -1;
  std::vector<char*> args = Argv(argv);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  std::array<char, 4096> buf;
  ssize_t n;
  output->clear();
  while ((n = read(pipefd[0], buf.data(), buf.size())) > 0) output->append(buf.data(), n);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string HttpGet(const std::string& url, const std::string& query) {
  std::vector<std::string> argv = {"/usr/bin/curl", "-sf", "--max-time", "5", url};
  if (!query.empty()) {
    argv.insert(argv.end(), {"-G", "--data-urlencode", "query=" + query});
  }
  std::string out;
  if (RunCommand(argv, &out) != 0) return "";
  return out;
}

KeptAliveConnection::KeptAliveConnection(int port, const std::string& path) {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n";
  if (send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return;
  }
  std::string in;
  char buf[4096];
  for (;;) {
    const size_t end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t at = in.find("Content-Length: ");
      if (at == std::string::npos || at > end) return;
      const size_t length = std::strtoul(in.c_str() + at + 16, nullptr, 10);
      if (in.size() >= end + 4 + length) {
        response_ = std::move(in);
        return;
      }
    }
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return;
    in.append(buf, static_cast<size_t>(n));
  }
}

KeptAliveConnection::~KeptAliveConnection() {
  if (fd_ >= 0) close(fd_);
}

bool KeptAliveConnection::ClosedByServer() {
  char byte;
  return fd_ >= 0 && recv(fd_, &byte, 1, 0) == 0;
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace joule::testing
