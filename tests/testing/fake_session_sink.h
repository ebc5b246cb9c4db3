#ifndef JOULE_TESTS_TESTING_FAKE_SESSION_SINK_H_
#define JOULE_TESTS_TESTING_FAKE_SESSION_SINK_H_

#include <mutex>
#include <vector>

#include "server/coordinator.h"

namespace joule::testing {

// Records what the coordinator sends to one worker's session. Thread-safe.
class FakeSessionSink final : public server::SessionSink {
 public:
  void Send(const v1::CoordinatorMessage& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.push_back(message);
  }
  void Close(std::string_view) override {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  std::vector<v1::CoordinatorMessage> sent() {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_;
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

 private:
  std::mutex mu_;
  std::vector<v1::CoordinatorMessage> sent_;
  bool closed_ = false;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_FAKE_SESSION_SINK_H_
