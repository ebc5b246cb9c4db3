#include "worker/agent/session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/security.h"
#include "common/text.h"
#include "worker/agent/job_log.h"
#include "worker/agent/liveness_sender.h"

namespace joule::worker {
namespace {

// A channel's connectivity state as words, for log lines.
const char* ConnectivityName(grpc_connectivity_state state) {
  switch (state) {
    case GRPC_CHANNEL_IDLE: return "idle";
    case GRPC_CHANNEL_CONNECTING: return "connecting";
    case GRPC_CHANNEL_READY: return "ready";
    case GRPC_CHANNEL_TRANSIENT_FAILURE: return "failed";
    case GRPC_CHANNEL_SHUTDOWN: return "shut down";
  }
  return "unknown";
}

// Milliseconds on the steady clock: how long the session has been silent.
int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// MemAvailable of /proc/meminfo, bytes: what a job may allocate without swapping
// (proc(5)); 0 when it cannot be read.
int64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

CoordinatorSession::CoordinatorSession(SessionOptions options,
                                       std::shared_ptr<v1::WorkerService::StubInterface> stub,
                                       std::function<std::shared_ptr<grpc::Channel>()> new_channel,
                                       std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      stub_(std::move(stub)),
      new_channel_(std::move(new_channel)),
      channel_(std::move(channel)) {
  (void)ProcessJobLog();  // installed before the session's threads log
}

std::shared_ptr<v1::WorkerService::StubInterface> CoordinatorSession::stub() {
  std::lock_guard<std::mutex> lock(mu_);
  return stub_;
}

void CoordinatorSession::StopAttempt() {
  attempts_->Cancel();
  attempts_->Join();
}

void CoordinatorSession::Stop() {
  attempts_->Cancel();
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  if (session_ctx_) session_ctx_->TryCancel();
  cv_.notify_all();
}

void CoordinatorSession::Run() {
  auto backoff = options_.reconnect_backoff;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    auto started = std::chrono::steady_clock::now();
    absl::Status s = RunSession();
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) break;
    if (std::chrono::steady_clock::now() - started > std::chrono::seconds(10)) {
      backoff = options_.reconnect_backoff;  // the session was healthy for a while
    }
    if (session_lost_at_) {
      const auto without = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - *session_lost_at_);
      if (without <= heartbeat_timeout_) {
        // An attempt waits on us: try again soon (the channel's own backoff paces the
        // connection attempts, AgentOptions' reconnect arguments).
        spdlog::warn("session with {} ended: {}; {} ms since the coordinator was heard, of "
                     "the {} its attempt waits; reconnecting",
                     options_.coordinator, s.ToString(), without.count(),
                     heartbeat_timeout_.count());
        cv_.wait_for(lock, options_.reconnect_backoff, [&] { return stopping_; });
        continue;
      }
      session_lost_at_.reset();
      lock.unlock();
      if (attempts_->active()) {
        spdlog::warn("job {} attempt {}: the coordinator unheard for {} ms, longer than its "
                     "heartbeat timeout ({} ms): it has ended the attempt; stopping it",
                     attempts_->job_id(), attempts_->attempt(), without.count(),
                     heartbeat_timeout_.count());
        StopAttempt();
      }
      lock.lock();
      if (stopping_) break;
    }
    spdlog::warn("session with {} ended: {}; reconnecting in {} ms", options_.coordinator,
                 s.ToString(), backoff.count());
    cv_.wait_for(lock, backoff, [&] { return stopping_; });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
  attempts_->Join();
}

void CoordinatorSession::Send(const v1::WorkerMessage& message) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stream_) stream_->Write(message);
}

void CoordinatorSession::SendResult(v1::WorkerMessage message) {
  // Text in a result quotes user data (a CSV cell, a file name): the coordinator cannot
  // parse a message whose strings are not UTF-8 and would drop the whole session.
  v1::RankResult* r = message.mutable_result()->mutable_result();
  r->set_error(SanitizeUtf8(r->error(), 4096));
  for (std::string& w : *r->mutable_energy_warnings()) w = SanitizeUtf8(w, 1024);
  for (v1::EnergyRecord& e : *r->mutable_energy()) {
    e.set_device(SanitizeUtf8(e.device(), 128));
  }
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stream_) stream_->Write(message);
  result_in_session_ = true;
  kept_results_.push_back(std::move(message));
  while (kept_results_.size() > kMaxKeptResults) kept_results_.pop_front();
}

bool CoordinatorSession::SendJobLog() {
  // Taken and sent as one step: the training thread's last drain must not overtake lines
  // the heartbeat thread took (they would reach the coordinator after the result).
  std::lock_guard<std::mutex> lock(log_send_mu_);
  {
    // Without a session the lines wait for the next one (a resumed attempt's).
    std::lock_guard<std::mutex> write(write_mu_);
    if (stream_ == nullptr) return false;
  }
  JobLogSink::Taken t = ProcessJobLog().Take();
  if (t.lines.empty() && t.dropped == 0) return false;
  v1::WorkerMessage m;
  v1::LogReport* r = m.mutable_log();
  r->set_job_id(t.job_id);
  r->set_attempt(t.attempt);
  r->set_dropped(t.dropped);
  for (v1::LogLine& l : t.lines) *r->add_lines() = std::move(l);
  Send(m);
  return true;
}

absl::StatusOr<v1::RegisterWorkerResponse> CoordinatorSession::Register(bool resume) {
  v1::RegisterWorkerRequest reg = options_.registration;
  if (resume) {
    std::lock_guard<std::mutex> lock(mu_);
    reg.set_resume_worker_id(worker_id_);
    reg.set_resume_job_id(attempts_->job_id());
    reg.set_resume_attempt(attempts_->attempt());
  }
  reg.set_memory_bytes(AvailableMemoryBytes());
  {
    std::lock_guard<std::mutex> lock(mu_);
    reg.set_leader_epoch_seen(leader_epoch_seen_);
  }
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext ctx;
    AddBearer(&ctx, options_.join_token);
    // Resuming: no later than the attempt's deadline, so that the worker stops an attempt
    // the coordinator has ended on time (Run), not a connection timeout later.
    // Each try is short (1.5 s) and, after a failed one, on a new channel: a new
    // connection attempt, whose SYN goes out as soon as the link is back, instead of one
    // waiting out its own retransmission backoff.
    std::chrono::milliseconds wait = std::chrono::seconds(5);
    if (resume) {
      std::lock_guard<std::mutex> lock(mu_);
      if (session_lost_at_) {
        wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                              *session_lost_at_ + heartbeat_timeout_ -
                              std::chrono::steady_clock::now()),
                          std::chrono::milliseconds(100), std::chrono::milliseconds(1500));
      }
    }
    ctx.set_deadline(std::chrono::system_clock::now() + wait);
    ctx.set_wait_for_ready(true);
    std::shared_ptr<v1::WorkerService::StubInterface> stub;
    std::shared_ptr<grpc::Channel> channel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fresh_channel_ && new_channel_) {
        channel_ = new_channel_();
        stub_ = v1::WorkerService::NewStub(channel_);
      }
      fresh_channel_ = false;
      stub = stub_;
      channel = channel_;
    }
    grpc::Status s = stub->RegisterWorker(&ctx, reg, &registered);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      registered_peer_ = ctx.peer();
    }
    if (!s.ok()) {
      // Several coordinators: the next try goes to the next one (this one is a standby,
      // or lost).
      if (resume || options_.coordinator.find(',') != std::string::npos) {
        std::lock_guard<std::mutex> lock(mu_);
        fresh_channel_ = true;
      }
      absl::Status failed = FromGrpcStatus(s);
      if (channel == nullptr ||
          (!absl::IsUnavailable(failed) && !absl::IsDeadlineExceeded(failed))) {
        return failed;  // the coordinator answered: its refusal says why
      }
      // No answer: whether a connection was made at all (a link still down and a
      // coordinator that does not answer look alike otherwise).
      return absl::Status(failed.code(), absl::StrCat(failed.message(), " (connection ",
                                                      ConnectivityName(channel->GetState(false)),
                                                      ")"));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (registered.epoch_reset() && registered.leader_epoch() < leader_epoch_seen_) {
      spdlog::warn(
          "the coordinator's store holds leadership epoch {}, older than epoch {} this "
          "worker was given, and its lease was renewed since: the store was restored "
          "or replaced; taking epoch {}",
          registered.leader_epoch(), leader_epoch_seen_, registered.leader_epoch());
      leader_epoch_seen_ = registered.leader_epoch();
    }
    if (registered.leader_epoch() != 0 && registered.leader_epoch() < leader_epoch_seen_) {
      // A leader that was superseded and does not know it yet (it was paused): fenced out.
      fresh_channel_ = true;
      return absl::UnavailableError(absl::StrCat(
          "the coordinator leads epoch ", registered.leader_epoch(), ", older than epoch ",
          leader_epoch_seen_, " this worker was given: it has been superseded"));
    }
    leader_epoch_seen_ = std::max(leader_epoch_seen_, registered.leader_epoch());
    coordinator_roots_.assign(registered.data_roots().begin(), registered.data_roots().end());
    worker_id_ = registered.worker_id();
    heartbeat_timeout_ = std::chrono::milliseconds(std::max(0, registered.heartbeat_timeout_ms()));
  }
  return registered;
}

void CoordinatorSession::SendHello(const std::string& worker_id) {
  v1::WorkerMessage hello;
  hello.set_hello_worker_id(worker_id);
  Send(hello);
  // Results an earlier session may not have delivered (the attempt ended with it).
  std::lock_guard<std::mutex> lock(write_mu_);
  for (const v1::WorkerMessage& m : kept_results_) {
    if (stream_ == nullptr || !stream_->Write(m)) break;
  }
}

void CoordinatorSession::FinishResume(const v1::RegisterWorkerResponse& registered) {
  std::chrono::milliseconds without{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    without = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - *session_lost_at_);
    session_lost_at_.reset();
  }
  if (registered.resumed()) {
    spdlog::info("job {} attempt {}: resumed as worker {} after {} ms without a session",
                 attempts_->job_id(), attempts_->attempt(), registered.worker_id(),
                 without.count());
  } else if (attempts_->active()) {
    spdlog::warn("job {} attempt {}: the coordinator did not resume it (it has ended); "
                 "stopping it",
                 attempts_->job_id(), attempts_->attempt());
    StopAttempt();
  }
}

void CoordinatorSession::OnCoordinatorMessage(const v1::CoordinatorMessage& message,
                                              const std::string& worker_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (message.leader_epoch() != 0 && message.leader_epoch() < leader_epoch_seen_) {
      spdlog::warn(
          "ignoring a message from a superseded coordinator (epoch {}, this worker "
          "was given epoch {}); leaving its session",
          message.leader_epoch(), leader_epoch_seen_);
      fresh_channel_ = true;
      if (session_ctx_) session_ctx_->TryCancel();
      return;
    }
  }
  if (message.has_assignment()) {
    const v1::Assignment& a = message.assignment();
    std::vector<std::string> roots;
    {
      std::lock_guard<std::mutex> lock(mu_);
      roots = coordinator_roots_;
    }
    if (absl::Status s = attempts_->Start(a, std::move(roots)); !s.ok()) {
      v1::WorkerMessage m;
      m.mutable_result()->set_job_id(a.job_id());
      m.mutable_result()->set_attempt(a.attempt());
      m.mutable_result()->mutable_result()->set_ok(false);
      m.mutable_result()->mutable_result()->set_error(
          absl::StrCat("worker ", worker_id, " is ", s.message()));
      Send(m);
    }
  } else if (message.has_cancel()) {
    attempts_->Apply(message.cancel());
  }
}

void CoordinatorSession::EndSession(int64_t last_heard_ms) {
  // The session is over. An attempt in flight goes on while the worker connects again to
  // resume it (the coordinator waits its heartbeat timeout for that), unless the worker is
  // stopping or the coordinator resumes nothing.
  bool keep = false;
  bool sent_result = false;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    sent_result = result_in_session_;
  }
  const bool training = attempts_->active();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Also when the attempt ended in this session: its result may not have arrived, and
    // only the worker the coordinator still waits on can deliver it in time.
    keep = (training || sent_result) && !stopping_ && heartbeat_timeout_.count() > 0;
    // Timed from the last word heard, as the coordinator times its heartbeat timeout from
    // the last heartbeat it heard.
    if (keep) {
      session_lost_at_ =
          std::chrono::steady_clock::time_point(std::chrono::milliseconds(last_heard_ms));
    }
  }
  if (keep) {
    spdlog::warn("job {} attempt {}: the session ended mid-attempt; {} while the worker "
                 "connects again to resume it (within {} ms)",
                 attempts_->job_id(), attempts_->attempt(),
                 training ? "training goes on" : "its result is kept",
                 heartbeat_timeout_.count());
  } else {
    StopAttempt();
  }
}

CoordinatorSession::SessionPace::SessionPace(int32_t heartbeat_timeout_ms,
                                             int32_t heartbeat_interval_ms)
    : timeout_ms(heartbeat_timeout_ms),
      longest_interval_ms(std::max<int64_t>(1000, heartbeat_timeout_ms / 4)),
      last_heard_ms(SteadyMs()) {
  SetInterval(heartbeat_interval_ms);
}

void CoordinatorSession::SessionPace::SetInterval(int64_t ms) {
  interval_ms = std::clamp<int64_t>(ms, 100, longest_interval_ms);
}

int64_t CoordinatorSession::SessionPace::SilenceLimitMs() const {
  if (timeout_ms <= 0) return 0;
  return std::max<int64_t>(2 * interval_ms, timeout_ms / 3);
}

void CoordinatorSession::HeartbeatLoop(SessionPace& pace, grpc::ClientContext& ctx,
                                       const std::atomic<bool>& session_done, LivenessSender* udp) {
  constexpr int64_t kLogPeriodMs = 1000;
  int64_t last_beat_ms = SteadyMs();
  // Whether the beats go over UDP only: from the first ack, until a beat finds the one
  // before it unacknowledged (then beats also go on the stream, whose acks keep the
  // session heard, until UDP acks again).
  bool on_udp = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!session_done && !stopping_) {
    const int64_t until_beat = last_beat_ms + pace.interval_ms - SteadyMs();
    cv_.wait_for(lock, std::chrono::milliseconds(std::clamp<int64_t>(until_beat, 1, kLogPeriodMs)));
    if (session_done || stopping_) break;
    if (udp != nullptr) {
      lock.unlock();  // the acks are read outside the session's lock (anyone may send some)
      if (std::optional<v1::LivenessAck> ack = udp->TakeAcks()) {
        pace.last_heard_ms = SteadyMs();
        if (ack->heartbeat_interval_ms() > 0) pace.SetInterval(ack->heartbeat_interval_ms());
      }
      lock.lock();
      if (session_done || stopping_) break;
    }
    if (const int64_t silent = SteadyMs() - pace.last_heard_ms, limit = pace.SilenceLimitMs();
        limit > 0 && silent > limit) {
      spdlog::warn(
          "no word from {} for {} ms (the limit is {} ms: a third of its {} ms "
          "heartbeat timeout, or two heartbeat intervals): abandoning the session "
          "to connect again",
          options_.coordinator, silent, limit, pace.timeout_ms);
      ctx.TryCancel();
      fresh_channel_ = true;  // under mu_: the next registration connects anew
      break;
    }
    lock.unlock();
    if (const int64_t now = SteadyMs(); now - last_beat_ms >= pace.interval_ms) {
      last_beat_ms = now;
      v1::WorkerMessage m;
      m.mutable_heartbeat()->set_unix_ms(options_.clock->UnixMs());
      if (attempts_->active()) {
        m.mutable_heartbeat()->set_job_id(attempts_->job_id());
        m.mutable_heartbeat()->set_attempt(attempts_->attempt());
        m.mutable_heartbeat()->set_phase(attempts_->phase());
      }
      // The beat one interval ago was acknowledged over UDP (its ack, read at the latest
      // just now): this one goes there only. Else on the stream as well, at once, so the
      // coordinator's silence never reaches the worker's limit (two intervals) on UDP's
      // account.
      const bool udp_answers = udp != nullptr && udp->LastBeatAcked();
      if (udp_answers != on_udp && udp != nullptr) {
        if (udp_answers) {
          spdlog::info("heartbeats go over UDP to {}", udp->target());
        } else {
          spdlog::warn(
              "no ack over UDP from {} to the last heartbeat: heartbeats go on the "
              "stream too",
              udp->target());
        }
        on_udp = udp_answers;
      }
      if (udp != nullptr) udp->Send(m.heartbeat());
      if (!udp_answers) Send(m);
    }
    SendJobLog();
    lock.lock();
  }
}

absl::Status CoordinatorSession::RunSession() {
  bool resume = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resume = session_lost_at_.has_value();
  }
  absl::StatusOr<v1::RegisterWorkerResponse> registered_or = Register(resume);
  if (!registered_or.ok()) return registered_or.status();
  const v1::RegisterWorkerResponse& registered = *registered_or;
  const std::string worker_id = registered.worker_id();
  SessionPace pace(registered.heartbeat_timeout_ms(), registered.heartbeat_interval_ms());
  if (resume) FinishResume(registered);
  std::unique_ptr<LivenessSender> udp;
  if (registered.liveness_port() > 0) {
    std::string peer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      peer = registered_peer_;
    }
    absl::StatusOr<std::unique_ptr<LivenessSender>> opened =
        LivenessSender::Open(peer, registered.liveness_port(), registered.liveness_key(), worker_id,
                             registered.leader_epoch());
    if (opened.ok()) {
      udp = *std::move(opened);
    } else {
      spdlog::info("heartbeats on the stream only: {}", std::string(opened.status().message()));
    }
  }

  grpc::ClientContext ctx;
  AddBearer(&ctx, options_.join_token);
  auto stream = stub()->Session(&ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::CancelledError("stopping");
    session_ctx_ = &ctx;
  }
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_ = stream.get();
    result_in_session_ = false;
  }
  SendHello(worker_id);
  spdlog::info("registered with {} as {}", options_.coordinator, worker_id);

  std::atomic<bool> session_done{false};
  std::thread heartbeats([&] { HeartbeatLoop(pace, ctx, session_done, udp.get()); });

  v1::CoordinatorMessage message;
  while (stream->Read(&message)) {
    pace.last_heard_ms = SteadyMs();
    if (message.has_heartbeat_ack() && message.heartbeat_ack().heartbeat_interval_ms() > 0) {
      pace.SetInterval(message.heartbeat_ack().heartbeat_interval_ms());
    }
    OnCoordinatorMessage(message, worker_id);
  }
  EndSession(pace.last_heard_ms.load());
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_done = true;
    session_ctx_ = nullptr;
    cv_.notify_all();
  }
  heartbeats.join();
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_ = nullptr;
  }
  grpc::Status s = stream->Finish();
  return s.ok() ? absl::UnavailableError("the coordinator closed the session")
                : FromGrpcStatus(s);
}

}  // namespace joule::worker
