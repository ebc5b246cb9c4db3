#include "server/liveness_listener.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>

#include "common/liveness_datagram.h"

namespace joule::server {
namespace {

// A UDP socket on loopback that sends to `port` and waits (up to 10 s) for replies.
class UdpPeer {
 public:
  explicit UdpPeer(int port) : fd_(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  }
  ~UdpPeer() { close(fd_); }
  void Send(const std::string& bytes) {
    ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  // The next datagram, or "" after 10 s without one.
  std::string Receive() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 10'000) != 1) return "";
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  }

 private:
  const int fd_;
};

TEST(LivenessListenerTest, RepliesGoBackToEachSourceAndLongDatagramsArriveCut) {
  std::mutex mu;
  std::vector<size_t> sizes;
  auto listener = LivenessListener::Start(
      "127.0.0.1", 0,
      [&](const std::vector<LivenessListener::Datagram>& in, std::vector<std::string>* replies) {
        std::lock_guard<std::mutex> lock(mu);
        for (size_t i = 0; i < in.size(); ++i) {
          sizes.push_back(in[i].bytes.size());
          if (in[i].bytes.rfind("ping", 0) == 0) (*replies)[i] = "re:" + in[i].bytes;
        }
      });
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_GT((*listener)->port(), 0);
  UdpPeer a((*listener)->port()), b((*listener)->port());
  a.Send("ping a");
  b.Send("ping b");
  EXPECT_EQ(a.Receive(), "re:ping a");
  EXPECT_EQ(b.Receive(), "re:ping b");
  a.Send(std::string(3000, 'x'));  // no reply: it only shows, cut, to the handler
  a.Send("ping again");            // after it, so its reply says the long one was handled
  EXPECT_EQ(a.Receive(), "re:ping again");
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(sizes.size(), 4u);
  EXPECT_EQ(sizes[2], kMaxLivenessDatagram + 1);
}

TEST(LivenessListenerTest, ABusyPortIsAOneLineError) {
  auto first = LivenessListener::Start("127.0.0.1", 0, [](const auto&, auto*) {});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = LivenessListener::Start("127.0.0.1", (*first)->port(), [](const auto&, auto*) {});
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status()));
  EXPECT_NE(second.status().message().find("cannot bind"), std::string::npos) << second.status();
}

}  // namespace
}  // namespace joule::server
