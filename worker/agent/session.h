#ifndef JOULE_WORKER_AGENT_SESSION_H_
#define JOULE_WORKER_AGENT_SESSION_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "joule/v1/worker.grpc.pb.h"
#include "worker/agent/attempt_control.h"

namespace joule::worker {

class LivenessSender;

struct SessionOptions {
  std::string coordinator;  // host:port, for log lines
  std::string join_token;   // the bearer token WorkerService asks of workers
  // What the worker registers as (host, device kind, cores, pid, metrics address, energy
  // sources); the session adds the memory available at each registration and, when it
  // asks to resume, the worker and attempt it was.
  v1::RegisterWorkerRequest registration;
  // Reconnect backoff after a lost session: starts here, doubles, capped at 5 s.
  std::chrono::milliseconds reconnect_backoff{200};
  const Clock* clock = Clock::Real();  // heartbeats' timestamps; not owned
};

// The worker's session with the coordinator (WorkerService): registers, opens the stream,
// says hello and sends again the results earlier sessions may not have delivered, sends a
// heartbeat every interval the coordinator asked for (with the attempt in flight and its
// phase) and the attempt's log lines, and hands assignments and cancels to the attempt.
// Run() reconnects with backoff until Stop().
//
// A session that breaks mid-attempt (a link outage) does not stop the attempt: its
// collectives are peer to peer. The session is abandoned when no word (a heartbeat's ack)
// came for a third of the heartbeat timeout, and the next registration, on a new channel,
// asks to resume; the attempt is stopped when the coordinator refuses (it has ended) or
// when there has been no session for longer than the heartbeat timeout (the coordinator
// has failed it by then).
//
// Also the attempt's outbox (AttemptOutbox). Thread-safe: Run on one thread; Stop and
// the outbox from any.
class CoordinatorSession final : public AttemptOutbox {
 public:
  // `new_channel` makes a channel to the coordinator (null with a caller's stub: then the
  // session keeps `stub` throughout); `channel` is the one `stub` uses, or null.
  CoordinatorSession(SessionOptions options,
                     std::shared_ptr<v1::WorkerService::StubInterface> stub,
                     std::function<std::shared_ptr<grpc::Channel>()> new_channel,
                     std::shared_ptr<grpc::Channel> channel);
  // The attempt it drives; set once, before Run.
  void set_attempts(AttemptControl* attempts) { attempts_ = attempts; }

  // Sessions until Stop(); then the attempt's thread is joined.
  void Run();
  void Stop();

  // The stub of the current channel (the attempt's rendezvous KV uses it).
  std::shared_ptr<v1::WorkerService::StubInterface> stub();

  // AttemptOutbox.
  void SendProgress(const v1::WorkerMessage& message) override { Send(message); }
  // Sends an attempt's result, and keeps it: a write gRPC accepted may still be lost with
  // the connection (a coordinator killed or restarted), so the kept results are sent again
  // at the start of every session, and the coordinator counts each rank once. Keeps the
  // newest kMaxKeptResults. Strings are made valid UTF-8 first (they quote user data).
  void SendResult(v1::WorkerMessage message) override;
  void FlushLog() override {
    while (SendJobLog()) {
    }
  }
  static constexpr size_t kMaxKeptResults = 16;

 private:
  // Registers (asking to resume the attempt it holds with `resume`) and keeps the data
  // roots and heartbeat timeout of the answer. Errors: the RPC's; with no answer at all,
  // the channel's state too.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(bool resume);
  // One session, from registration to the stream's end. Returns how it ended.
  absl::Status RunSession();
  // After a registration that asked to resume: goes on with the attempt when granted,
  // stops it otherwise.
  void FinishResume(const v1::RegisterWorkerResponse& registered);
  void OnCoordinatorMessage(const v1::CoordinatorMessage& message, const std::string& worker_id);
  // The stream ended, `last_heard_ms` (steady) after the coordinator's last message: keeps
  // the attempt for a resume, or stops it.
  void EndSession(int64_t last_heard_ms);
  // The session's first messages: the worker's id, then the kept results.
  void SendHello(const std::string& worker_id);
  void Send(const v1::WorkerMessage& message);
  // Sends the attempt's log lines that wait (at most JobLogSink::kMaxTake); false when
  // there were none or no session is open (they wait for the next).
  bool SendJobLog();
  void StopAttempt();
  // The pace of one session: the heartbeat interval the coordinator gave last (it may change
  // it with each ack as the cluster grows), kept within [100 ms, max(1 s, a quarter of its
  // heartbeat timeout)] whatever it says, and when (steady ms) it was last heard from.
  struct SessionPace {
    SessionPace(int32_t heartbeat_timeout_ms, int32_t heartbeat_interval_ms);
    void SetInterval(int64_t ms);
    // No word from the coordinator (its acks to our heartbeats) for this long: the session
    // is abandoned and a new connection made, rather than waiting for TCP to retransmit
    // into a link that came back (its backoff reaches seconds) while the coordinator's
    // heartbeat timeout runs: a third of the timeout, or two intervals. 0 (off) for a
    // coordinator that does not acknowledge heartbeats.
    int64_t SilenceLimitMs() const;
    const int32_t timeout_ms;
    const int64_t longest_interval_ms;
    std::atomic<int64_t> interval_ms{0};
    std::atomic<int64_t> last_heard_ms{0};
  };
  // The session's heartbeat thread: wakes at least every second to send the attempt's log
  // lines and check the coordinator's silence (cancelling `ctx` past the limit), and
  // heartbeats once an interval, until `session_done` or Stop.
  // With `udp` (the coordinator offered a liveness port), heartbeats go over UDP and
  // their acks count as the coordinator's word; a beat also goes on the stream until the
  // first ack, and whenever none came for two intervals.
  void HeartbeatLoop(SessionPace& pace, grpc::ClientContext& ctx,
                     const std::atomic<bool>& session_done, LivenessSender* udp);

  const SessionOptions options_;
  AttemptControl* attempts_ = nullptr;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  grpc::ClientContext* session_ctx_ = nullptr;
  std::shared_ptr<v1::WorkerService::StubInterface> stub_;
  // Makes a new channel (null with a caller's stub), the channel of stub_ when made here
  // (its state goes into a failed registration's error), and whether the next
  // registration uses a new one (a session was abandoned for silence).
  std::function<std::shared_ptr<grpc::Channel>()> new_channel_;
  std::shared_ptr<grpc::Channel> channel_;
  bool fresh_channel_ = false;
  std::vector<std::string> coordinator_roots_;  // the data roots it sent
  // The id the coordinator gave at the last registration, and its heartbeat timeout (0:
  // a coordinator that neither acknowledges heartbeats nor resumes attempts).
  std::string worker_id_;
  std::chrono::milliseconds heartbeat_timeout_{0};
  // The coordinator's address as gRPC saw it at the last registration (ClientContext::
  // peer()): where heartbeats over UDP go.
  std::string registered_peer_;
  // The highest leadership epoch a coordinator has given (v1::RegisterWorkerResponse.
  // leader_epoch): a coordinator, or a message, of an older one is refused.
  int64_t leader_epoch_seen_ = 0;
  // Set when a session ended mid-attempt: the attempt goes on, and the next registration
  // asks to resume it, until heartbeat_timeout_ has passed.
  std::optional<std::chrono::steady_clock::time_point> session_lost_at_;

  std::mutex write_mu_;
  grpc::ClientReaderWriterInterface<v1::WorkerMessage, v1::CoordinatorMessage>* stream_ =
      nullptr;                                 // write_mu_
  std::deque<v1::WorkerMessage> kept_results_;  // write_mu_
  // A result was sent in the current session (it may not arrive if the session breaks).
  bool result_in_session_ = false;  // write_mu_
  std::mutex log_send_mu_;          // SendJobLog's take-and-send
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_AGENT_SESSION_H_
