#include "common/liveness_datagram.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace joule {
namespace {

v1::LivenessBeat SomeBeat() {
  v1::LivenessBeat beat;
  beat.set_worker_id("w12.1a2b");
  beat.set_seq(7);
  beat.mutable_heartbeat()->set_unix_ms(1'790'000'000'000);
  beat.mutable_heartbeat()->set_job_id(42);
  beat.mutable_heartbeat()->set_attempt(2);
  beat.mutable_heartbeat()->set_phase(v1::RANK_PHASE_FORWARD);
  return beat;
}

struct Keys {
  std::string key = NewLivenessKey();
  const std::string* operator()(const std::string& id) const {
    return id == "w12.1a2b" ? &key : nullptr;
  }
};

TEST(LivenessDatagramTest, KeysAreRandomAndOfTheirSize) {
  std::set<std::string> keys;
  for (int i = 0; i < 100; ++i) {
    const std::string key = NewLivenessKey();
    EXPECT_EQ(key.size(), kLivenessKeyBytes);
    keys.insert(key);
  }
  EXPECT_EQ(keys.size(), 100u);
}

TEST(LivenessDatagramTest, ABeatAndAnAckRoundTrip) {
  Keys keys;
  absl::StatusOr<v1::LivenessBeat> beat =
      OpenLivenessBeat(SealLivenessBeat(SomeBeat(), keys.key), keys);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->SerializeAsString(), SomeBeat().SerializeAsString());

  v1::LivenessAck ack;
  ack.set_seq(7);
  ack.set_unix_ms(5);
  ack.set_heartbeat_interval_ms(2500);
  ack.set_leader_epoch(3);
  absl::StatusOr<v1::LivenessAck> opened =
      OpenLivenessAck(SealLivenessAck(ack, keys.key), keys.key);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->SerializeAsString(), ack.SerializeAsString());
}

// Every single bit flipped anywhere (kind, body or tag) is refused: the tag covers it all.
TEST(LivenessDatagramTest, EveryFlippedBitIsRefused) {
  Keys keys;
  const std::string sealed = SealLivenessBeat(SomeBeat(), keys.key);
  for (size_t i = 0; i < sealed.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string forged = sealed;
      forged[i] = static_cast<char>(forged[i] ^ (1 << bit));
      EXPECT_FALSE(OpenLivenessBeat(forged, keys).ok()) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(LivenessDatagramTest, AnotherKeyAnUnknownWorkerAndAReflectedBeatAreRefused) {
  Keys keys;
  const std::string other = NewLivenessKey();
  EXPECT_FALSE(OpenLivenessBeat(SealLivenessBeat(SomeBeat(), other), keys).ok());
  v1::LivenessBeat stranger = SomeBeat();
  stranger.set_worker_id("w13.1a2b");
  absl::StatusOr<v1::LivenessBeat> unknown =
      OpenLivenessBeat(SealLivenessBeat(stranger, keys.key), keys);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("no worker"), std::string::npos);
  // A beat sent back to the worker is not an ack, nor an ack a beat, with the same key.
  EXPECT_FALSE(OpenLivenessAck(SealLivenessBeat(SomeBeat(), keys.key), keys.key).ok());
  v1::LivenessAck ack;
  ack.set_seq(1);
  EXPECT_FALSE(OpenLivenessBeat(SealLivenessAck(ack, keys.key), keys).ok());
  // The same bytes with the kind changed carry a tag made for the other kind.
  std::string turned = SealLivenessBeat(SomeBeat(), keys.key);
  turned[0] = 'A';
  EXPECT_FALSE(OpenLivenessAck(turned, keys.key).ok());
}

// The class of malformed input: every truncation, empty, oversized and random bytes; each
// a one-line error, never a crash.
TEST(LivenessDatagramTest, TruncatedOversizedAndRandomDatagramsAreRefused) {
  Keys keys;
  const std::string sealed = SealLivenessBeat(SomeBeat(), keys.key);
  for (size_t n = 0; n < sealed.size(); ++n) {
    absl::StatusOr<v1::LivenessBeat> cut = OpenLivenessBeat(sealed.substr(0, n), keys);
    ASSERT_FALSE(cut.ok()) << n;
    EXPECT_EQ(cut.status().message().find('\n'), std::string::npos);
    EXPECT_FALSE(OpenLivenessAck(sealed.substr(0, n), keys.key).ok());
  }
  std::string huge = sealed;
  huge.insert(1, kMaxLivenessDatagram, 'x');
  EXPECT_NE(OpenLivenessBeat(huge, keys).status().message().find("longer"), std::string::npos);
  std::mt19937 random(11);
  for (int i = 0; i < 2000; ++i) {
    std::string noise(random() % 200, '\0');
    for (char& c : noise) c = static_cast<char>(random());
    if (!noise.empty() && i % 2 == 0) noise[0] = 'B';  // past the kind check, too
    EXPECT_FALSE(OpenLivenessBeat(noise, keys).ok());
    EXPECT_FALSE(OpenLivenessAck(noise, keys.key).ok());
  }
}

}  // namespace
}  // namespace joule
