#include "server/ha_coordinator.h"

#include <grpcpp/generic/async_generic_service.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/http_server.h"
#include "server/coordinator_metrics.h"

namespace joule::server {

std::string MakeHolderId() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("%s:%d:%016x", host, getpid(), nonce);
}

// The gRPC server of a coordinator standing by: every call of every service is answered
// UNAVAILABLE, naming the leader; and, on the leader's --metrics-listen address, /metrics
// with joule_build_info, joule_coordinator_leading 0 and the leader's epoch (so a standby
// is scraped, and healthy, as a leader is) and /ready answering 503 (a leader's: 200).
// Thread-safe.
class HaCoordinatorServer::Standby final : public grpc::CallbackGenericService {
 public:
  // Binds `address` (port 0: a free one, written to *port) and, unless empty,
  // `metrics_address`.
  static absl::StatusOr<std::unique_ptr<Standby>> Start(const std::string& address,
                                                        const ServerTls& tls, int* port,
                                                        const std::string& metrics_address) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
        MakeServerCredentials(tls, address);
    if (!creds.ok()) return creds.status();
    auto s = std::unique_ptr<Standby>(new Standby());
    grpc::ServerBuilder builder;
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // Workers' keepalive pings (as CoordinatorServer accepts them).
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 4000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddListeningPort(address, *creds, port);
    builder.RegisterCallbackGenericService(s.get());
    s->server_ = builder.BuildAndStart();
    if (!s->server_ || *port == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
    }
    if (!metrics_address.empty()) {
      s->registry_ = std::make_shared<prometheus::Registry>();
      AddCoordinatorBuildInfo(*s->registry_, JOULE_VERSION);
      s->leadership_ = AddLeadershipMetrics(*s->registry_);
      s->leadership_.leading->Set(0);
      s->http_ = std::make_unique<HttpServer>();
      s->http_->ServeMetrics("/metrics", s->registry_);
      // Not ready: a load balancer (Kubernetes' readiness) sends nothing to a standby.
      Standby* self = s.get();
      s->http_->ServeRequest("/ready", [self](const HttpServer::Request&) {
        HttpServer::FullResponse r;
        r.status = 503;
        std::lock_guard<std::mutex> lock(self->mu_);
        r.body = self->message_ + "\n";
        return r;
      });
      if (absl::Status st = s->http_->Start(metrics_address); !st.ok()) return st;
    }
    return s;
  }

  ~Standby() override {
    http_.reset();  // frees the metrics port for the leader's server
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      server_->Wait();
    }
  }

  // Who leads, as the last campaign found (address "" with `why`: nobody can be named).
  void SetLeader(const std::string& address, int64_t epoch, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    leader_ = address;
    if (leadership_.lease_epoch && !address.empty()) {
      leadership_.lease_epoch->Set(static_cast<double>(epoch));
    }
    message_ = address.empty() ? absl::StrCat("standby coordinator: no leader known (", why, ")")
                               : absl::StrCat("standby coordinator: the leader is at ", address,
                                              " (epoch ", epoch, ")");
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    std::string leader, message;
    {
      std::lock_guard<std::mutex> lock(mu_);
      leader = leader_;
      message = message_;
    }
    class Refusal final : public grpc::ServerGenericBidiReactor {
     public:
      Refusal(grpc::GenericCallbackServerContext* ctx, const std::string& leader,
              const std::string& message) {
        if (!leader.empty()) ctx->AddTrailingMetadata("joule-leader", leader);
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, message));
      }
      void OnDone() override { delete this; }
    };
    return new Refusal(ctx, leader, message);
  }

 private:
  Standby() = default;
  std::mutex mu_;
  std::string leader_;
  std::string message_ = "standby coordinator: no leader known yet";
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<prometheus::Registry> registry_;
  LeadershipGauges leadership_;
  std::unique_ptr<HttpServer> http_;
};

absl::StatusOr<std::unique_ptr<HaCoordinatorServer>> HaCoordinatorServer::Start(
    CoordinatorServerOptions options, HaOptions ha) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (ha.lease < std::chrono::milliseconds(300) || ha.lease > std::chrono::minutes(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease ", ha.lease.count(), " ms is outside [300 ms, 10 min]"));
  }
  if (ha.holder.empty()) ha.holder = MakeHolderId();
  if (options.coordinator.store == ":memory:" || options.coordinator.store == "sqlite::memory:") {
    return absl::InvalidArgumentError(
        "standby coordinators need a store they share (postgresql://...), not :memory:");
  }
  std::unique_ptr<HaCoordinatorServer> s(new HaCoordinatorServer());
  // A renewal never waits longer than a third of the lease for the store. A store that
  // does not answer yet (started after this process, restarting) is waited for: Run opens
  // it, standing by meanwhile; anything else it refuses is an error now.
  absl::StatusOr<std::unique_ptr<JobStore>> election = s->OpenElectionStore(options, ha);
  if (election.ok()) {
    s->election_ = *std::move(election);
  } else if (!absl::IsUnavailable(election.status())) {
    return election.status();
  } else {
    s->store_error_ = std::string(election.status().message());
  }
  int port = 0;
  absl::StatusOr<std::unique_ptr<Standby>> standby =
      Standby::Start(options.address, options.tls, &port, options.metrics_address);
  if (!standby.ok()) return standby.status();
  s->standby_ = *std::move(standby);
  s->address_ = absl::StrCat(options.address.substr(0, options.address.rfind(':')), ":", port);
  options.address = s->address_;
  if (ha.advertise.empty()) {
    const std::string host = s->address_.substr(0, s->address_.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("listening on ", s->address_,
                                                     " names no host clients can reach: give "
                                                     "--advertise-address HOST:PORT"));
    }
    ha.advertise = s->address_;
  }
  s->options_ = std::move(options);
  s->ha_ = std::move(ha);
  spdlog::info("standing by on {} as {} (lease {} ms, job store {})", s->address_, s->ha_.holder,
               s->ha_.lease.count(), s->election_ ? s->election_->Describe() : "not reachable yet");
  if (!s->election_) {
    spdlog::warn("job store unreachable: {}; standing by until it answers", s->store_error_);
    s->store_error_logged_ = std::chrono::steady_clock::now();
    s->standby_->SetLeader("", 0, "job store unreachable: " + s->store_error_);
  }
  s->runner_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

HaCoordinatorServer::~HaCoordinatorServer() {
  Shutdown();
  Wait();
}

std::string HaCoordinatorServer::metrics_address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return server_ ? server_->metrics_address() : "";
}

void HaCoordinatorServer::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  wake_.notify_all();
}

void HaCoordinatorServer::Wait() {
  std::lock_guard<std::mutex> lock(join_mu_);
  if (runner_.joinable()) runner_.join();
}

bool HaCoordinatorServer::Sleep(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  wake_.wait_for(lock, d, [&] { return stopping_; });
  return !stopping_;
}

void HaCoordinatorServer::Run() {
  const auto third = ha_.lease / 3;
  std::chrono::milliseconds pause{0};  // Lead's: stand by this long before campaigning
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    if (!standby_) {
      int port = 0;
      absl::StatusOr<std::unique_ptr<Standby>> standby =
          Standby::Start(address_, options_.tls, &port, options_.metrics_address);
      if (!standby.ok()) {
        spdlog::error("cannot stand by: {}", standby.status().ToString());
        if (!Sleep(third)) break;
        continue;
      }
      standby_ = *std::move(standby);
    }
    if (pause.count() > 0) {
      // After a leadership that could not serve: the standby answers meanwhile.
      standby_->SetLeader("", 0, "this coordinator could not serve its leadership; standing by");
      const auto wait = pause;
      pause = std::chrono::milliseconds(0);
      if (!Sleep(wait)) break;
      continue;
    }
    if (!election_ && !OpenElectionStoreOrWait()) continue;
    const auto asked = std::chrono::steady_clock::now();
    absl::StatusOr<Leadership> lead =
        election_->Campaign(ha_.holder, ha_.advertise, ha_.lease.count());
    if (!lead.ok()) {
      spdlog::warn("campaign: {}", lead.status().ToString());
      standby_->SetLeader("", 0, std::string(lead.status().message()));
    } else if (!lead->ours) {
      standby_->SetLeader(lead->address, lead->epoch, "");
    } else {
      pause = Lead(lead->epoch, asked);
      continue;
    }
    if (!Sleep(third)) break;
  }
  standby_.reset();
  if (!election_) return;  // never campaigned: nothing to resign
  if (absl::Status s = election_->Resign(ha_.holder); !s.ok()) {
    spdlog::warn("resign: {}", s.ToString());
  }
}

absl::StatusOr<std::unique_ptr<JobStore>> HaCoordinatorServer::OpenElectionStore(
    const CoordinatorServerOptions& options, const HaOptions& ha) {
  return JobStore::Open(options.coordinator.store, static_cast<int>(ha.lease.count() / 3));
}

bool HaCoordinatorServer::OpenElectionStoreOrWait() {
  absl::StatusOr<std::unique_ptr<JobStore>> election = OpenElectionStore(options_, ha_);
  if (election.ok()) {
    election_ = *std::move(election);
    spdlog::info("job store {} answers: campaigning", election_->Describe());
    return true;
  }
  if (!absl::IsUnavailable(election.status())) {
    // Not a store that is down: one this process must not use (a newer schema, someone
    // else's database). Stop, as Start would have.
    spdlog::error("job store: {}; stopping", election.status().ToString());
    std::lock_guard<std::mutex> lock(mu_);
    fatal_ = election.status();
    stopping_ = true;
    return false;
  }
  const std::string error(election.status().message());
  // The same error once a minute, a new one at once: a store down for hours is a few
  // lines, not thousands.
  const auto now = std::chrono::steady_clock::now();
  if (error != store_error_ || now - store_error_logged_ >= std::chrono::minutes(1)) {
    spdlog::warn("job store unreachable: {}; standing by until it answers", error);
    store_error_logged_ = now;
  }
  store_error_ = error;
  standby_->SetLeader("", 0, "job store unreachable: " + error);
  Sleep(ha_.lease / 3);
  return false;
}

void HaCoordinatorServer::Renew(int64_t epoch, Renewal& state) {
  using SteadyClock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(state.mu);
  // The first renewal a third of the lease after the campaign that won it began.
  SteadyClock::time_point asked = state.renewed;
  SteadyClock::time_point next = asked + ha_.lease / 3;
  while (!state.done) {
    state.cv.wait_until(lock, next, [&] { return state.done || state.renew_now; });
    if (state.done) break;
    if (state.renew_now) {
      // At once, but never more often than every tenth of the lease, whoever asks.
      state.renew_now = false;
      next = std::min(next, asked + ha_.lease / 10);
    }
    if (SteadyClock::now() < next) continue;
    lock.unlock();
    asked = SteadyClock::now();
    absl::StatusOr<Leadership> lead =
        election_->Campaign(ha_.holder, ha_.advertise, ha_.lease.count());
    lock.lock();
    next = asked + ha_.lease / 3;
    if (lead.ok() && lead->ours && lead->epoch == epoch) {
      state.renewed = std::max(state.renewed, asked);
    } else if (lead.ok()) {
      state.lost = lead->ours ? absl::StrCat("the lease lapsed (epoch ", lead->epoch, " now)")
                              : absl::StrCat("the leader is ", lead->holder, " at ", lead->address,
                                             " (epoch ", lead->epoch, ")");
      state.cv.notify_all();
      break;
    } else {
      spdlog::warn("lease renewal failed: {}", lead.status().ToString());
      next = asked + ha_.lease / 10;  // again soon: the lease runs out meanwhile
    }
  }
}

bool HaCoordinatorServer::NewerEpochClaimed(Renewal& state, int64_t seen) {
  std::lock_guard<std::mutex> lock(state.mu);
  auto it = state.claims.find(seen);
  if (it == state.claims.end()) {
    if (state.claims.size() >= Renewal::kMaxClaims) state.claims.clear();  // hostile claims
    it = state.claims.emplace(seen, std::chrono::steady_clock::now()).first;
  }
  const auto now = std::chrono::steady_clock::now();
  if (state.renewed > it->second && now < state.renewed + state.usable && state.lost.empty()) {
    return true;
  }
  state.renew_now = true;
  state.cv.notify_all();
  return false;
}

std::chrono::milliseconds HaCoordinatorServer::Lead(int64_t epoch,
                                                    std::chrono::steady_clock::time_point renewed) {
  using SteadyClock = std::chrono::steady_clock;
  // The lease as this process may count on it: from the start of the last renewal that
  // succeeded (the store's expiry is later: the statement ran after it began), less a tenth
  // for the two clocks' rates. Past it this process serves nothing, whatever a renewal in
  // flight will say.
  const auto usable = ha_.lease - ha_.lease / 10;
  Renewal state;
  state.renewed = renewed;
  state.usable = usable;
  // Renewals on their own thread, from the moment the lease is won (a slow start of the
  // coordinator does not delay them), every third of the lease.
  std::thread renewer([&] { Renew(epoch, state); });
  // Only then the standby's server is stopped, which frees the port for the leader's: its
  // stop waits for the calls and connections it still has, which must not eat the lease.
  standby_.reset();
  CoordinatorServerOptions options = options_;
  options.coordinator.lease_epoch = epoch;
  // A worker given a newer epoch: the store says whether this leadership still holds.
  options.coordinator.newer_epoch_claimed = [&state](int64_t seen) {
    return NewerEpochClaimed(state, seen);
  };
  // Lost while the standby stopped (a renewal that found another leader, or none in
  // time): no server is started for a leadership that is gone.
  std::string lost;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    lost = !state.lost.empty() ? state.lost
           : SteadyClock::now() >= state.renewed + usable
               ? absl::StrCat("no renewal for ", usable.count(), " ms before it could serve")
               : "";
  }
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      lost.empty() ? CoordinatorServer::Start(options) : absl::AbortedError(lost);
  std::string why = "shutting down";
  if (!lost.empty()) {
    why = lost;
  } else if (!server.ok()) {
    why = absl::StrCat("it failed to start: ", server.status().ToString());
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      server_ = *std::move(server);
    }
    epoch_ = epoch;
    failed_starts_ = 0;
    spdlog::info("leading (epoch {}) on {}", epoch, address_);
    for (;;) {
      SteadyClock::time_point deadline;
      {
        std::lock_guard<std::mutex> lock(state.mu);
        if (!state.lost.empty()) {
          why = state.lost;
          break;
        }
        deadline = state.renewed + usable;
      }
      if (SteadyClock::now() >= deadline) {
        why = absl::StrCat("no renewal for ", usable.count(), " ms (lease ", ha_.lease.count(),
                           " ms)");
        break;
      }
      // Woken by Shutdown, or at the deadline (or sooner, to see a renewal or a loss).
      if (!Sleep(std::min<std::chrono::milliseconds>(
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()) +
                  std::chrono::milliseconds(1),
              ha_.lease / 10))) {
        break;
      }
    }
  }
  epoch_ = 0;
  std::unique_ptr<CoordinatorServer> stopped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped = std::move(server_);
  }
  if (stopped) {
    stopped->Shutdown();
    stopped->Wait();
    stopped.reset();
  }
  {
    std::lock_guard<std::mutex> lock(state.mu);
    state.done = true;
    state.cv.notify_all();
  }
  renewer.join();
  if (why != "shutting down") {
    spdlog::error("stepped down from epoch {}: {}", epoch, why);
    (void)election_->Resign(ha_.holder);  // if it is still ours, a standby need not wait
    if (lost.empty() && !server.ok()) {
      // It cannot serve (a port taken, a store it cannot use): a standby that can should
      // win the next campaign (standbys campaign every third of the lease), so this one
      // stands by a lease, doubling while it keeps failing, up to 30 s or the lease.
      ++failed_starts_;
      const auto wait = std::min<std::chrono::milliseconds>(
          ha_.lease * (int64_t{1} << std::min(failed_starts_ - 1, 6)),
          std::max<std::chrono::milliseconds>(ha_.lease, std::chrono::seconds(30)));
      spdlog::warn("standing by for {} ms before campaigning again ({} failed start(s) in a row)",
                   wait.count(), failed_starts_);
      return wait;
    }
    if (!server.ok()) return ha_.lease / 3;  // not at once into the same loss
  }
  return std::chrono::milliseconds(0);
}

}  // namespace joule::server
