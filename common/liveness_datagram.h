#ifndef JOULE_COMMON_LIVENESS_DATAGRAM_H_
#define JOULE_COMMON_LIVENESS_DATAGRAM_H_

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "joule/v1/worker.pb.h"

namespace joule {

// Heartbeats over UDP, sealed with a key the coordinator gave the worker at registration
// (over the gRPC channel, so under its TLS). A datagram is
//
//   kind (1 byte: 'B' a LivenessBeat, 'A' a LivenessAck) | body (the message, protobuf
//   binary) | tag (the first 16 bytes of HMAC-SHA256(key, kind | body))
//
// The tag authenticates the body and its kind (a beat reflected back is no ack); the
// body is not secret. HMAC: RFC 2104; SHA-256 truncated to 128 bits as RFC 4868 allows.
// Replays are refused by the receiver (LivenessBeat.seq grows; an ack names its beat).
// Pure functions; thread-safe.

inline constexpr size_t kLivenessKeyBytes = 32;
inline constexpr size_t kLivenessTagBytes = 16;
// Larger datagrams are refused unread (a beat with a 253-byte worker id is under 320).
inline constexpr size_t kMaxLivenessDatagram = 1024;

// 32 bytes from OpenSSL's CSPRNG (RAND_bytes). Aborts if the generator fails: a key that
// is not random would let anyone keep a dead worker alive.
std::string NewLivenessKey();

std::string SealLivenessBeat(const v1::LivenessBeat& beat, std::string_view key);
std::string SealLivenessAck(const v1::LivenessAck& ack, std::string_view key);

// The beat in `datagram`, its tag checked with the key `key_of` gives for the worker id it
// claims (nullptr: none known). Errors, all INVALID_ARGUMENT with a one-line reason: too
// short or too long, not a beat, a body that does not parse, an unknown worker, a tag that
// does not match (compared in constant time).
absl::StatusOr<v1::LivenessBeat> OpenLivenessBeat(
    std::string_view datagram,
    const std::function<const std::string*(const std::string& worker_id)>& key_of);
// The ack in `datagram`, sealed with `key`. Errors as OpenLivenessBeat's.
absl::StatusOr<v1::LivenessAck> OpenLivenessAck(std::string_view datagram, std::string_view key);

}  // namespace joule

#endif  // JOULE_COMMON_LIVENESS_DATAGRAM_H_
