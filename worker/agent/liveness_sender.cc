#include "worker/agent/liveness_sender.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/liveness_datagram.h"

namespace joule::worker {

namespace {

// `text` with each %XX replaced by its byte (gRPC's URI-encoded peer addresses).
std::string PercentDecoded(const std::string& text) {
  const auto hex = [&](size_t i) {
    return std::isxdigit(static_cast<unsigned char>(text[i])) != 0;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(i + 1) && hex(i + 2)) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LivenessSender>> LivenessSender::Open(
    const std::string& encoded_peer, int port, std::string key, std::string worker_id,
    int64_t leader_epoch) {
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("liveness UDP: no port ", port));
  }
  if (key.size() != kLivenessKeyBytes) {
    return absl::InvalidArgumentError("liveness UDP: the key is not 32 bytes");
  }
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string host;
  const std::string peer = PercentDecoded(encoded_peer);
  if (absl::StartsWith(peer, "ipv4:")) {
    host = peer.substr(5, peer.rfind(':') - 5);
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1) host.clear();
    len = sizeof(sockaddr_in);
  } else if (absl::StartsWith(peer, "ipv6:[")) {
    host = peer.substr(6, peer.find(']') - 6);
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    // A zone ("fe80::1%eth0") is not taken: link-local coordinators use the stream.
    if (inet_pton(AF_INET6, host.c_str(), &a->sin6_addr) != 1) host.clear();
    len = sizeof(sockaddr_in6);
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("liveness UDP: the coordinator's address is not an IP address"));
  }
  const int fd = socket(addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("liveness UDP: socket: ", std::strerror(errno)));
  }
  // Not connected: an ack is taken from whichever address the coordinator's host answers
  // from (a host with several addresses on one interface, a floating address, may reply
  // from another than the one the beat went to). Its tag, not its source, makes it genuine.
  const std::string target = addr.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                                        : absl::StrCat(host, ":", port);
  return std::unique_ptr<LivenessSender>(new LivenessSender(fd, addr, len, target, std::move(key),
                                                            std::move(worker_id), leader_epoch));
}

LivenessSender::~LivenessSender() { close(fd_); }

void LivenessSender::Send(const v1::Heartbeat& heartbeat) {
  v1::LivenessBeat beat;
  beat.set_worker_id(worker_id_);
  beat.set_seq(++seq_);
  *beat.mutable_heartbeat() = heartbeat;
  const std::string datagram = SealLivenessBeat(beat, key_);
  (void)!sendto(fd_, datagram.data(), datagram.size(), MSG_DONTWAIT,
                reinterpret_cast<const sockaddr*>(&to_), to_len_);
}

std::optional<v1::LivenessAck> LivenessSender::TakeAcks() {
  std::optional<v1::LivenessAck> newest;
  char buffer[kMaxLivenessDatagram + 1];
  // Bounded: the socket takes datagrams from anyone, and a flood must not hold the
  // heartbeat thread (the rest waits for the next call, or is dropped by the kernel).
  for (int read = 0; read < kMaxAcksPerTake; ++read) {
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return newest;  // EAGAIN: drained
    }
    absl::StatusOr<v1::LivenessAck> ack =
        OpenLivenessAck(std::string_view(buffer, static_cast<size_t>(n)), key_);
    // Forged, a replay of an ack already taken, of no beat sent yet, or of another
    // leadership: ignored.
    if (!ack.ok() || ack->seq() <= acked_seq_ || ack->seq() > seq_ ||
        ack->leader_epoch() != leader_epoch_) {
      continue;
    }
    acked_seq_ = ack->seq();
    newest = *std::move(ack);
  }
  return newest;
}

}  // namespace joule::worker
