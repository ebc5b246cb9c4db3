#ifndef JOULE_SERVER_SESSION_SINK_H_
#define JOULE_SERVER_SESSION_SINK_H_

#include <string_view>

#include "joule/v1/worker.pb.h"

namespace joule::server {

// Where the coordinator sends messages for one worker's session. Implementations must
// not block (queue and return) and must be thread-safe.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void Send(const v1::CoordinatorMessage& message) = 0;
  // Ends the session from the coordinator's side (the worker was declared lost, or the
  // coordinator stops); the worker's stream ends with UNAVAILABLE and `why`.
  virtual void Close(std::string_view why) = 0;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_SESSION_SINK_H_
