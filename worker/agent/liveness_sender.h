#ifndef JOULE_WORKER_AGENT_LIVENESS_SENDER_H_
#define JOULE_WORKER_AGENT_LIVENESS_SENDER_H_

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "joule/v1/worker.pb.h"

namespace joule::worker {

// The worker's side of heartbeats over UDP (common/liveness_datagram.h): a socket that
// sends to the coordinator's liveness port, beats sealed with this registration's key,
// and the coordinator's acks read back. One per session. Not thread-safe (the session's
// heartbeat thread owns it).
class LivenessSender {
 public:
  // `peer`: the coordinator as gRPC saw it on the registration (ClientContext::peer():
  // "ipv4:10.0.0.1:7070", "ipv6:[fd00::1]:7070", or percent-encoded as gRPC 1.48 and later
  // write it, "ipv6:%5Bfd00::1%5D:7070"); `port` and `key` from its
  // RegisterWorkerResponse; `leader_epoch` the response's (acks of another are ignored).
  // Errors: INVALID_ARGUMENT for a peer that is not an IP address (a Unix socket), a port
  // outside 1-65535 or a key of the wrong size; UNAVAILABLE when the socket cannot be made.
  static absl::StatusOr<std::unique_ptr<LivenessSender>> Open(const std::string& encoded_peer,
                                                              int port, std::string key,
                                                              std::string worker_id,
                                                              int64_t leader_epoch);
  ~LivenessSender();
  LivenessSender(const LivenessSender&) = delete;
  LivenessSender& operator=(const LivenessSender&) = delete;

  // Sends `heartbeat` as the next beat (a send that fails is as good as lost: the session
  // falls back to its stream while no ack comes).
  void Send(const v1::Heartbeat& heartbeat);
  static constexpr int kMaxAcksPerTake = 64;
  // Reads the datagrams waiting (at most kMaxAcksPerTake), without blocking; the newest
  // genuine ack, if any came: of a beat sent with this sender, newer than every ack taken
  // before (a replayed ack counts for nothing).
  std::optional<v1::LivenessAck> TakeAcks();
  // The last beat sent has been acknowledged (by the acks TakeAcks has read).
  bool LastBeatAcked() const { return seq_ > 0 && acked_seq_ >= seq_; }
  // "ip:port" it sends to.
  const std::string& target() const { return target_; }

 private:
  LivenessSender(int fd, const sockaddr_storage& to, socklen_t to_len, std::string target,
                 std::string key, std::string worker_id, int64_t leader_epoch)
      : fd_(fd),
        to_(to),
        to_len_(to_len),
        target_(std::move(target)),
        key_(std::move(key)),
        worker_id_(std::move(worker_id)),
        leader_epoch_(leader_epoch) {}

  const int fd_;
  const sockaddr_storage to_;
  const socklen_t to_len_;
  const std::string target_;
  const std::string key_;
  const std::string worker_id_;
  const int64_t leader_epoch_;
  uint64_t seq_ = 0;        // of the last beat sent
  uint64_t acked_seq_ = 0;  // of the newest beat acknowledged
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_AGENT_LIVENESS_SENDER_H_
