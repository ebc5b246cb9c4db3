#include "common/liveness_datagram.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

namespace joule {
namespace {

constexpr char kBeat = 'B';
constexpr char kAck = 'A';

// The first kLivenessTagBytes of HMAC-SHA256(key, kind | body).
std::string Tag(char kind, std::string_view body, std::string_view key) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  std::string message(1, kind);
  message.append(body);
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &mac_len) == nullptr ||
      mac_len < kLivenessTagBytes) {
    return std::string();  // matches no datagram's tag (Open compares lengths first)
  }
  return std::string(reinterpret_cast<const char*>(mac), kLivenessTagBytes);
}

std::string Seal(char kind, const google::protobuf::MessageLite& message, std::string_view key) {
  const std::string body = message.SerializeAsString();
  std::string out(1, kind);
  out += body;
  out += Tag(kind, body, key);
  return out;
}

// The body of `datagram` if it is of `kind` and of a possible size.
absl::StatusOr<std::string_view> Body(std::string_view datagram, char kind) {
  if (datagram.size() > kMaxLivenessDatagram) {
    return absl::InvalidArgumentError("liveness datagram: longer than 1024 bytes");
  }
  if (datagram.size() < 1 + kLivenessTagBytes) {
    return absl::InvalidArgumentError("liveness datagram: shorter than a kind and a tag");
  }
  if (datagram[0] != kind) {
    return absl::InvalidArgumentError(kind == kBeat ? "liveness datagram: not a beat"
                                                    : "liveness datagram: not an ack");
  }
  return datagram.substr(1, datagram.size() - 1 - kLivenessTagBytes);
}

absl::Status CheckTag(std::string_view datagram, char kind, std::string_view body,
                      std::string_view key) {
  const std::string want = Tag(kind, body, key);
  const std::string_view got = datagram.substr(datagram.size() - kLivenessTagBytes);
  if (want.size() != got.size() || CRYPTO_memcmp(want.data(), got.data(), got.size()) != 0) {
    return absl::InvalidArgumentError("liveness datagram: the tag does not match");
  }
  return absl::OkStatus();
}

}  // namespace

std::string NewLivenessKey() {
  std::string key(kLivenessKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), static_cast<int>(key.size())) != 1) {
    std::fputs("joule: OpenSSL's RAND_bytes failed: no random liveness key\n", stderr);
    std::abort();
  }
  return key;
}

std::string SealLivenessBeat(const v1::LivenessBeat& beat, std::string_view key) {
  return Seal(kBeat, beat, key);
}

std::string SealLivenessAck(const v1::LivenessAck& ack, std::string_view key) {
  return Seal(kAck, ack, key);
}

absl::StatusOr<v1::LivenessBeat> OpenLivenessBeat(
    std::string_view datagram,
    const std::function<const std::string*(const std::string& worker_id)>& key_of) {
  absl::StatusOr<std::string_view> body = Body(datagram, kBeat);
  if (!body.ok()) return body.status();
  v1::LivenessBeat beat;
  if (!beat.ParseFromArray(body->data(), static_cast<int>(body->size()))) {
    return absl::InvalidArgumentError("liveness datagram: the beat does not parse");
  }
  const std::string* key = key_of(beat.worker_id());
  if (key == nullptr || key->empty()) {
    return absl::InvalidArgumentError("liveness datagram: from no worker in a session here");
  }
  if (absl::Status s = CheckTag(datagram, kBeat, *body, *key); !s.ok()) return s;
  return beat;
}

absl::StatusOr<v1::LivenessAck> OpenLivenessAck(std::string_view datagram, std::string_view key) {
  absl::StatusOr<std::string_view> body = Body(datagram, kAck);
  if (!body.ok()) return body.status();
  if (absl::Status s = CheckTag(datagram, kAck, *body, key); !s.ok()) return s;
  v1::LivenessAck ack;
  if (!ack.ParseFromArray(body->data(), static_cast<int>(body->size()))) {
    return absl::InvalidArgumentError("liveness datagram: the ack does not parse");
  }
  return ack;
}

}  // namespace joule
