#include "server/liveness_listener.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/liveness_datagram.h"

namespace joule::server {

absl::StatusOr<std::unique_ptr<LivenessListener>> LivenessListener::Start(const std::string& host,
                                                                          int port,
                                                                          Handler handler) {
  const std::string where = absl::StrCat(host.empty() ? "0.0.0.0" : host, ":", port);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("liveness UDP ", where, ": cannot resolve: ", gai_strerror(rc)));
  }
  int fd = -1;
  int error = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      error = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("liveness UDP ", where, ": cannot bind: ", std::strerror(error)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  // Room for a burst of beats from thousands of workers while the handler waits for the
  // coordinator's lock. The kernel caps it at net.core.rmem_max (often 208 KiB: a few
  // hundred datagrams, as each takes about 768 bytes of buffer): said when it does.
  const int buffer = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  int granted = 0;
  socklen_t granted_len = sizeof(granted);
  if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &granted, &granted_len) == 0 && granted < buffer) {
    spdlog::info(
        "liveness UDP: receive buffer {} KiB (asked {} KiB; raise net.core.rmem_max for "
        "bursts from thousands of workers)",
        granted / 1024, buffer / 1024);
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("liveness UDP: eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<LivenessListener>(
      new LivenessListener(fd, wake, bound_port, std::move(handler)));
}

LivenessListener::LivenessListener(int fd, int wake_fd, int port, Handler handler)
    : fd_(fd), wake_fd_(wake_fd), port_(port), handler_(std::move(handler)) {
  thread_ = std::thread([this] { Run(); });
}

LivenessListener::~LivenessListener() {
  stop_ = true;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(fd_);
  close(wake_fd_);
}

void LivenessListener::Run() {
  // One byte more than a datagram may have: a longer one arrives cut to this, too long.
  constexpr size_t kRoom = kMaxLivenessDatagram + 1;
  std::vector<char> buffers(kBatch * kRoom);
  std::vector<mmsghdr> messages(kBatch);
  std::vector<iovec> iovs(kBatch);
  std::vector<sockaddr_storage> sources(kBatch);
  std::vector<Datagram> in;
  std::vector<std::string> replies;
  std::vector<mmsghdr> out(kBatch);
  std::vector<iovec> out_iovs(kBatch);
  while (!stop_) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, 100) < 0 && errno != EINTR) {
      // ENOMEM (the others cannot happen with these arguments): tried again shortly, so
      // the port offered to workers keeps being served.
      spdlog::warn("liveness UDP: poll: {}", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (stop_) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    // Until the socket is drained, or kMaxBatchesPerWake batches (then the stop is looked
    // at, and poll says whether more wait).
    for (int batch = 0; batch < kMaxBatchesPerWake && !stop_; ++batch) {
      for (int i = 0; i < kBatch; ++i) {
        iovs[i] = {buffers.data() + i * kRoom, kRoom};
        messages[i] = {};
        messages[i].msg_hdr.msg_iov = &iovs[i];
        messages[i].msg_hdr.msg_iovlen = 1;
        messages[i].msg_hdr.msg_name = &sources[i];
        messages[i].msg_hdr.msg_namelen = sizeof(sources[i]);
      }
      const int n = recvmmsg(fd_, messages.data(), kBatch, MSG_DONTWAIT, nullptr);
      if (n <= 0) break;  // EAGAIN: drained (other errors, ICMP reports among them, too)
      in.clear();
      for (int i = 0; i < n; ++i) {
        Datagram d;
        d.bytes.assign(buffers.data() + i * kRoom, std::min<size_t>(messages[i].msg_len, kRoom));
        d.from = sources[i];
        d.from_len = messages[i].msg_hdr.msg_namelen;
        in.push_back(std::move(d));
      }
      if (in.empty()) continue;
      replies.assign(in.size(), std::string());
      handler_(in, &replies);
      int m = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        if (replies[i].empty()) continue;
        out_iovs[m] = {replies[i].data(), replies[i].size()};
        out[m] = {};
        out[m].msg_hdr.msg_iov = &out_iovs[m];
        out[m].msg_hdr.msg_iovlen = 1;
        out[m].msg_hdr.msg_name = const_cast<sockaddr_storage*>(&in[i].from);
        out[m].msg_hdr.msg_namelen = in[i].from_len;
        ++m;
      }
      // A reply that cannot be sent now (a full buffer) is dropped: the worker's next beat
      // gets the next one, and one lost ack is within its silence limit.
      for (int sent = 0; sent < m;) {
        const int k = sendmmsg(fd_, out.data() + sent, m - sent, MSG_DONTWAIT);
        if (k > 0) {
          sent += k;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          break;  // the buffer is full: the rest are dropped
        } else if (errno != EINTR) {
          ++sent;  // that one destination fails (unreachable): the others are still sent
        }
      }
      if (n < kBatch) break;
    }
  }
}

}  // namespace joule::server
