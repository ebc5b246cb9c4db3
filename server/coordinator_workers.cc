// The coordinator's WorkerService side: workers register, hold a session, send
// heartbeats and reports, and are lost. The job state machine they drive (results,
// failed attempts, scheduling) is in coordinator.cc.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/liveness_datagram.h"
#include "common/names.h"
#include "common/text.h"
#include "server/coordinator.h"
#include "server/job_progress.h"

namespace joule::server {

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  bool epoch_reset = false;
  if (options_.lease_epoch != 0 && request.leader_epoch_seen() > options_.lease_epoch) {
    epoch_reset =
        options_.newer_epoch_claimed && options_.newer_epoch_claimed(request.leader_epoch_seen());
    if (!epoch_reset) {
      spdlog::warn(
          "worker on {} (pid {}) was given leadership epoch {}, newer than this "
          "coordinator's {}: refused while the lease is checked",
          request.host(), request.pid(), request.leader_epoch_seen(), options_.lease_epoch);
      return absl::UnavailableError(absl::StrCat(
          "this coordinator leads epoch ", options_.lease_epoch, ", older than the epoch ",
          request.leader_epoch_seen(), " the worker was given: it may have been superseded"));
    }
    spdlog::warn(
        "worker on {} (pid {}) was given leadership epoch {}, which this store never "
        "had (it holds {}, renewed since): the store was restored or replaced; the "
        "worker takes epoch {}",
        request.host(), request.pid(), request.leader_epoch_seen(), options_.lease_epoch,
        options_.lease_epoch);
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Registered now, a worker mid-attempt would be told it resumes nothing and stop its
  // attempt: refused, it tries again and resumes at the next start.
  if (shutting_down_) return absl::UnavailableError(kShuttingDown);
  v1::RegisterWorkerResponse response;
  response.set_leader_epoch(options_.lease_epoch);
  response.set_epoch_reset(epoch_reset);
  response.set_heartbeat_interval_ms(static_cast<int32_t>(HeartbeatIntervalLocked().count()));
  response.set_heartbeat_timeout_ms(static_cast<int32_t>(options_.heartbeat_timeout.count()));
  for (const std::string& root : options_.data_roots) response.add_data_roots(root);
  if (Worker* back = workers_.Resumable(request); back != nullptr) {
    auto it = active_.find(request.resume_job_id());
    const bool runs = !shutting_down_ && it != active_.end() &&
                      it->second.job.state() == v1::JOB_STATE_RUNNING &&
                      it->second.job.attempt() == request.resume_attempt() &&
                      clock_->Now() - back->last_seen <= options_.heartbeat_timeout;
    if (runs) {
      // Its old stream may still look open here (a pulled cable tells this side nothing):
      // the new session replaces it, and the old one's end is then ignored (CloseSession
      // compares sinks).
      if (back->sink) {
        back->sink->Close("session replaced by the worker's new one");
        back->sink.reset();
      }
      const int64_t lost_ms = back->info.session_lost_unix_ms();
      WorkerRegistry::Touch(*back, clock_->Now(), clock_->UnixMs());
      spdlog::info("worker {} (rank {} of job {} attempt {}) is back{}: it resumes its attempt",
                   back->info.worker_id(), back->info.rank(), request.resume_job_id(),
                   request.resume_attempt(),
                   lost_ms > 0 ? absl::StrCat(" ", clock_->UnixMs() - lost_ms,
                                              " ms after its session ended")
                               : std::string());
      response.set_worker_id(back->info.worker_id());
      response.set_resumed(true);
      GrantLivenessLocked(*back, &response);
      return response;
    }
    // The same process, whose attempt has ended meanwhile: it registers anew below.
    LoseWorkerLocked(back->info.worker_id(), "it registered again after its attempt ended");
  } else if (std::optional<v1::RegisterWorkerResponse> adopted = AdoptLocked(request, response)) {
    return *adopted;
  } else if (Worker* same = workers_.Find(request.resume_worker_id());
             same != nullptr && same->info.host() == request.host() &&
             same->info.pid() == request.pid()) {
    // The same process, claiming an attempt the coordinator has not given it: whatever it
    // held here ends, and it registers anew.
    LoseWorkerLocked(same->info.worker_id(), "it registered again as a new worker");
  }
  const size_t regions_before = workers_.regions_seen().size();
  absl::StatusOr<std::string> id =
      workers_.Register(request, clock_->Now(), clock_->UnixMs());
  if (!id.ok()) return id.status();
  Worker& w = *workers_.Find(*id);
  if (workers_.regions_seen().size() > regions_before && !options_.carbon.empty() &&
      options_.carbon.count(w.info.region()) == 0) {
    spdlog::warn(
        "worker {} is in region {}, which has no --carbon-intensity source (regions are "
        "case-sensitive): its energy's CO2 is not counted at a grid's intensity, and "
        "carbon-aware jobs are not planned there",
        *id, w.info.region());
  }
  spdlog::info("worker {} registered: host {}, pid {}, {} {} cores", *id, w.info.host(),
               w.info.pid(), w.info.cores(), DeviceKindName(w.info.device_kind()));
  response.set_worker_id(*id);
  GrantLivenessLocked(w, &response);
  return response;
}

absl::Status Coordinator::OpenSession(const std::string& worker_id,
                                      std::shared_ptr<SessionSink> sink) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return absl::UnavailableError(kShuttingDown);
  if (absl::Status s = workers_.OpenSession(worker_id, std::move(sink), clock_->Now());
      !s.ok()) {
    return s;
  }
  spdlog::info("worker {}: session open", worker_id);
  // Resumed, but its attempt ended between the grant and this session (a cancel, a peer's
  // failure): the stop it could not be sent then.
  if (Worker* w = workers_.Find(worker_id); w != nullptr && w->info.state() == v1::WORKER_STATE_BUSY) {
    auto it = active_.find(w->info.job_id());
    if (it == active_.end() || it->second.job.state() != v1::JOB_STATE_RUNNING ||
        it->second.job.attempt() != w->attempt) {
      v1::CoordinatorMessage cancel = Stamped();
      cancel.mutable_cancel()->set_job_id(w->info.job_id());
      cancel.mutable_cancel()->set_attempt(w->attempt);
      cancel.mutable_cancel()->set_reason("the attempt ended while this worker was away");
      w->sink->Send(cancel);
      w->stop_deadline = clock_->Now() + options_.stop_timeout;
    }
  }
  ScheduleLocked();
  changed_.notify_all();
  return absl::OkStatus();
}

void Coordinator::OnWorkerMessage(const std::string& worker_id, const v1::WorkerMessage& message) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker* worker = workers_.Find(worker_id);
  if (worker == nullptr) return;
  WorkerRegistry::Touch(*worker, clock_->Now(), clock_->UnixMs());
  switch (message.kind_case()) {
    case v1::WorkerMessage::kProgress: {
      const v1::ProgressReport& p = message.progress();
      auto it = active_.find(p.job_id());
      if (it == active_.end() || it->second.job.state() != v1::JOB_STATE_RUNNING ||
          it->second.job.attempt() != p.attempt() ||
          !WorkerRegistry::RunsAttempt(*worker, p.job_id(), p.attempt())) {
        return;
      }
      OnProgressLocked(it->second, worker->info.rank(), p.progress(), p.energy_only());
      return;
    }
    case v1::WorkerMessage::kResult:
      HandleResultLocked(*worker, message.result());
      return;
    case v1::WorkerMessage::kLog: {
      // Only from a worker running that attempt, and bounded whatever it sends.
      const v1::LogReport& log = message.log();
      if (!WorkerRegistry::RunsAttempt(*worker, log.job_id(), log.attempt())) return;
      writer_->AppendLog(log.job_id(), worker->info.rank(), log, clock_->UnixMs());
      return;
    }
    case v1::WorkerMessage::kHeartbeat: {
      if (worker->sink) {
        v1::CoordinatorMessage ack = Stamped();
        ack.mutable_heartbeat_ack()->set_unix_ms(clock_->UnixMs());
        ack.mutable_heartbeat_ack()->set_heartbeat_interval_ms(
            static_cast<int32_t>(HeartbeatIntervalLocked().count()));
        worker->sink->Send(ack);
      }
      HeartbeatLocked(*worker, message.heartbeat());
      return;
    }
    default:
      return;
  }
}

void Coordinator::HeartbeatLocked(Worker& w, const v1::Heartbeat& h) {
  // Rank 0's phase is the job's (evaluating and checkpointing send no progress).
  if (h.job_id() == 0 || w.info.rank() != 0 ||
      !WorkerRegistry::RunsAttempt(w, h.job_id(), h.attempt())) {
    return;
  }
  auto it = active_.find(h.job_id());
  if (it == active_.end() || it->second.job.state() != v1::JOB_STATE_RUNNING) return;
  const v1::JobPhase phase = JobPhaseOf(h.phase());
  if (it->second.job.progress().phase() != phase) {
    it->second.job.mutable_progress()->set_phase(phase);
    ChangedLocked(it->second);
  }
}

void Coordinator::OnLivenessDatagrams(const std::vector<LivenessListener::Datagram>& in,
                                      std::vector<std::string>* replies) {
  // First, without the coordinator's lock (anyone may send datagrams): each one's tag,
  // checked with the key its worker id names.
  struct Verified {
    size_t index;
    v1::LivenessBeat beat;
    std::string key;
  };
  std::vector<Verified> verified;
  {
    std::lock_guard<std::mutex> keys(liveness_keys_mu_);
    for (size_t i = 0; i < in.size(); ++i) {
      const std::string* key = nullptr;
      absl::StatusOr<v1::LivenessBeat> beat =
          OpenLivenessBeat(in[i].bytes, [&](const std::string& id) -> const std::string* {
            auto it = liveness_keys_.find(id);
            key = it == liveness_keys_.end() ? nullptr : &it->second;
            return key;
          });
      if (beat.ok()) verified.push_back({i, *std::move(beat), *key});
    }
  }
  // Then one lock for the genuine ones: a lookup and a map update each.
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  const auto now = clock_->Now();
  const int64_t now_unix_ms = clock_->UnixMs();
  const int32_t interval_ms = static_cast<int32_t>(HeartbeatIntervalLocked().count());
  uint64_t taken = 0;
  for (Verified& v : verified) {
    Worker* worker = workers_.Find(v.beat.worker_id());
    // Only a worker in a session, under the registration that key was given for: one
    // whose session ended proves nothing by UDP (it must register again), and its
    // attempt's wait for it runs on. A replayed or stale beat (seq not above the last
    // taken) is refused.
    if (worker == nullptr || !worker->sink || worker->liveness_key != v.key ||
        v.beat.seq() <= worker->liveness_seq) {
      continue;
    }
    worker->liveness_seq = v.beat.seq();
    WorkerRegistry::Touch(*worker, now, now_unix_ms);
    HeartbeatLocked(*worker, v.beat.heartbeat());
    v1::LivenessAck ack;
    ack.set_seq(v.beat.seq());
    ack.set_unix_ms(now_unix_ms);
    ack.set_heartbeat_interval_ms(interval_ms);
    ack.set_leader_epoch(options_.lease_epoch);
    (*replies)[v.index] = SealLivenessAck(ack, v.key);
    ++taken;
  }
  metrics_.LivenessDatagrams(taken, in.size() - taken);
}

void Coordinator::GrantLivenessLocked(Worker& w, v1::RegisterWorkerResponse* response) {
  const int port = liveness_port_.load();
  if (port <= 0) return;
  w.liveness_key = NewLivenessKey();
  w.liveness_seq = 0;
  {
    std::lock_guard<std::mutex> keys(liveness_keys_mu_);
    liveness_keys_[w.info.worker_id()] = w.liveness_key;
  }
  response->set_liveness_port(port);
  response->set_liveness_key(w.liveness_key);
}

void Coordinator::CloseSession(const std::string& worker_id, const SessionSink* sink,
                               const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker* w = workers_.Find(worker_id);
  if (w == nullptr || w->sink.get() != sink) return;
  // Mid-attempt and not the coordinator's own shutdown: the attempt's collectives go on
  // without the coordinator, so the worker has until its heartbeat timeout to connect
  // again and resume (RegisterWorker); past it, CheckHeartbeats declares it lost.
  if (w->info.state() == v1::WORKER_STATE_BUSY && !shutting_down_) {
    auto it = active_.find(w->info.job_id());
    if (it != active_.end() && it->second.job.state() == v1::JOB_STATE_RUNNING &&
        it->second.job.attempt() == w->attempt) {
      spdlog::warn("worker {} (rank {} of job {} attempt {}): session ended: {}; its attempt "
                   "waits up to {} ms from its last heartbeat for it to return",
                   worker_id, w->info.rank(), w->info.job_id(), w->attempt, reason,
                   options_.heartbeat_timeout.count());
      WorkerRegistry::Detach(*w, clock_->UnixMs());
      changed_.notify_all();
      return;
    }
  }
  LoseWorkerLocked(worker_id, reason);
}

std::chrono::milliseconds Coordinator::HeartbeatIntervalLocked() const {
  const std::chrono::milliseconds floor = options_.heartbeat_interval;
  if (options_.max_heartbeats_per_second <= 0) return floor;
  // Workers each heartbeat once an interval: N workers at rate R need N / R seconds.
  const auto spread = std::chrono::milliseconds(static_cast<int64_t>(workers_.all().size()) * 1000 /
                                                options_.max_heartbeats_per_second);
  // At most a quarter of the timeout: three heartbeats may be late before a worker is lost.
  return std::max(floor, std::min(spread, options_.heartbeat_timeout / 4));
}

void Coordinator::CheckHeartbeats(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  for (const auto& [id, why] :
       workers_.Expired(now, options_.heartbeat_timeout, options_.stop_timeout)) {
    LoseWorkerLocked(id, why);
  }
  // Attempts found running at start whose ranks did not all come back in time.
  bool requeued = false;
  // Only the jobs still being adopted (not every active job: this runs twice a second, and
  // the queue may hold tens of thousands).
  for (auto it = adopting_.begin(); it != adopting_.end();) {
    auto found = active_.find(*it);
    if (found == active_.end() || !found->second.adopt_until) {  // adopted or ended
      it = adopting_.erase(it);
      continue;
    }
    ActiveJob& active = found->second;
    if (now < *active.adopt_until) {
      ++it;
      continue;
    }
    it = adopting_.erase(it);
    if (active.job.state() != v1::JOB_STATE_RUNNING) {  // ended meanwhile: nothing to wait for
      active.adopt_until.reset();
      active.reattached.clear();
      continue;
    }
    const std::string why = absl::StrCat(
        active.reattached.size(), " of the ", active.job.worker_ids_size(), " ranks of attempt ",
        active.job.attempt(), " came back to this coordinator within ",
        options_.reattach_window.count(), " ms");
    StopRanksLocked(active.job, why);
    RequeueInterruptedLocked(active, absl::StrCat("interrupted: only ", why),
                             absl::StrCat("re-queued: only ", why));
    requeued = true;
  }
  if (requeued) {
    ScheduleLocked();
    changed_.notify_all();
  }
}

std::optional<v1::RegisterWorkerResponse> Coordinator::AdoptLocked(
    const v1::RegisterWorkerRequest& request, v1::RegisterWorkerResponse response) {
  if (request.resume_worker_id().empty() || shutting_down_) return std::nullopt;
  auto it = active_.find(request.resume_job_id());
  if (it == active_.end()) return std::nullopt;
  ActiveJob& active = it->second;
  const v1::Job& job = active.job;
  if (!active.adopt_until || clock_->Now() >= *active.adopt_until ||
      job.state() != v1::JOB_STATE_RUNNING || job.attempt() != request.resume_attempt()) {
    return std::nullopt;
  }
  int32_t rank = -1;
  for (int32_t r = 0; r < job.worker_ids_size(); ++r) {
    if (job.worker_ids(r) == request.resume_worker_id()) rank = r;
  }
  if (rank < 0 || active.reattached.count(rank) != 0) return std::nullopt;
  // The process that ran the rank, as it registered then (attempts started by an older
  // coordinator have no record of it).
  if (rank < job.worker_pids_size() && rank < job.worker_hosts_size() &&
      (job.worker_hosts(rank) != request.host() || job.worker_pids(rank) != request.pid())) {
    spdlog::warn(
        "job {}: a worker on {} (pid {}) claims rank {} of attempt {}, which ran on {} (pid "
        "{}): not adopted",
        job.id(), SanitizeUtf8(request.host(), 253), request.pid(), rank, job.attempt(),
        job.worker_hosts(rank), job.worker_pids(rank));
    return std::nullopt;
  }
  absl::StatusOr<Worker*> adopted = workers_.Adopt(request, clock_->Now(), clock_->UnixMs());
  if (!adopted.ok()) {
    spdlog::warn("job {}: rank {} cannot be adopted: {}", job.id(), rank,
                 adopted.status().ToString());
    return std::nullopt;
  }
  WorkerRegistry::Assign(**adopted, job.id(), rank, job.attempt());
  WorkerRegistry::Detach(**adopted, clock_->UnixMs());  // busy; its session opens next
  active.reattached.insert(rank);
  spdlog::info("worker {} (rank {} of job {} attempt {}) came back: adopted ({} of {} ranks)",
               request.resume_worker_id(), rank, job.id(), job.attempt(), active.reattached.size(),
               job.worker_ids_size());
  if (static_cast<int>(active.reattached.size()) == job.worker_ids_size()) {
    active.adopt_until.reset();
    active.reattached.clear();
    spdlog::info("job {}: attempt {} adopted: every rank is back", job.id(), job.attempt());
  }
  response.set_worker_id(request.resume_worker_id());
  response.set_resumed(true);
  GrantLivenessLocked(**adopted, &response);
  return response;
}

void Coordinator::LoseWorkerLocked(const std::string& worker_id, const std::string& reason) {
  std::optional<Worker> worker = workers_.Remove(worker_id);
  {
    std::lock_guard<std::mutex> keys(liveness_keys_mu_);
    liveness_keys_.erase(worker_id);
  }
  if (!worker) return;
  if (shutting_down_) {
    spdlog::info("worker {}: session ended ({})", worker_id, reason);
  } else {
    spdlog::warn("worker {} lost: {}", worker_id, reason);
  }
  if (worker->sink)
    worker->sink->Close(absl::StrCat("session closed by the coordinator: ", reason));
  if (worker->info.state() == v1::WORKER_STATE_BUSY && !shutting_down_) {
    auto it = active_.find(worker->info.job_id());
    if (it != active_.end() && it->second.job.state() == v1::JOB_STATE_RUNNING &&
        it->second.job.attempt() == worker->attempt) {
      FailAttemptLocked(it->second,
                        absl::StrCat("worker ", worker_id, " (rank ", worker->info.rank(),
                                     ") was lost: ", reason),
                        absl::StatusCode::kUnknown);  // retryable, and a cause of its own
    }
  }
  ScheduleLocked();
  changed_.notify_all();
}

std::string Coordinator::HostOfRankLocked(const v1::Job& job, int32_t rank) {
  if (rank < 0 || rank >= job.worker_ids_size()) return "";
  const Worker* w = workers_.Find(job.worker_ids(rank));
  return w == nullptr ? "" : w->info.host();
}

}  // namespace joule::server
