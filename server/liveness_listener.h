#ifndef JOULE_SERVER_LIVENESS_LISTENER_H_
#define JOULE_SERVER_LIVENESS_LISTENER_H_

#include <sys/socket.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace joule::server {

// The coordinator's UDP socket for heartbeats (common/liveness_datagram.h): one thread
// receives datagrams in batches (recvmmsg, up to kBatch a call), hands each batch to the
// handler, and sends the replies it returns (sendmmsg). A heartbeat then costs a share of
// one system call each way and no HTTP/2 frame, stream or wakeup of gRPC's own: at 10,000
// workers the coordinator's liveness cost falls from tens of percent of a core to a few
// (bench/README.md, "Liveness of many workers").
//
// The listener knows nothing of keys or workers: the handler checks every datagram.
// Thread-safe: the handler runs on the listener's thread only.
class LivenessListener {
 public:
  static constexpr int kBatch = 64;
  static constexpr int kMaxBatchesPerWake = 16;

  struct Datagram {
    // Its first kMaxLivenessDatagram + 1 bytes (common/liveness_datagram.h): a longer
    // one is cut there, and so refused by its size.
    std::string bytes;
    sockaddr_storage from{};
    socklen_t from_len = 0;
  };
  // Called with each batch received; sets (*replies)[i] to the datagram to send back to
  // in[i]'s source, or leaves it empty for none. `replies` comes sized to `in`.
  using Handler =
      std::function<void(const std::vector<Datagram>& in, std::vector<std::string>* replies)>;

  // Binds UDP `host`:`port` (an IPv4 or IPv6 literal, or a name; "" or "0.0.0.0": every
  // IPv4 address; port 0: a free one) and starts the thread.
  // Errors: UNAVAILABLE naming the address when it cannot be resolved or bound.
  static absl::StatusOr<std::unique_ptr<LivenessListener>> Start(const std::string& host, int port,
                                                                 Handler handler);
  // Stops the thread (after the batches in hand: at most kMaxBatchesPerWake) and closes
  // the socket.
  ~LivenessListener();
  LivenessListener(const LivenessListener&) = delete;
  LivenessListener& operator=(const LivenessListener&) = delete;

  int port() const { return port_; }

 private:
  LivenessListener(int fd, int wake_fd, int port, Handler handler);
  void Run();

  const int fd_;
  const int wake_fd_;  // an eventfd: the destructor's stop
  const int port_;
  const Handler handler_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_LIVENESS_LISTENER_H_
