#ifndef JOULE_SERVER_HA_COORDINATOR_H_
#define JOULE_SERVER_HA_COORDINATOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "server/coordinator_server.h"
#include "server/job_store.h"

namespace joule::server {

// Standby coordinators: several coordinator processes share one job store (PostgreSQL);
// the one holding the store's lease (JobStore::Campaign) leads and serves, the others
// stand by on the same gRPC address and answer every call UNAVAILABLE with the leader's
// address (the message and the "joule-leader" trailing metadata), and take over when the
// lease lapses.
struct HaOptions {
  // Unique per coordinator process: the lease's holder. Default: host:pid:random.
  std::string holder;
  // The gRPC address clients and workers reach this coordinator at, given to them by
  // standbys. Default: the address it is bound to.
  std::string advertise;
  // The lease's term; the leader renews it every third of it and steps down once a whole
  // term passed without a renewal (a pause, a partition from the store), before the store
  // lets another take it. Between 300 ms and 10 minutes.
  std::chrono::milliseconds lease{5000};
};

// A coordinator process that leads only while it holds the lease. Leading is a
// CoordinatorServer started with its store fenced at the lease's epoch (every store write
// of an old leader is refused once another leads); stepping down shuts it down (its
// running attempts stay as stored, for the next leader). Thread-safe.
class HaCoordinatorServer {
 public:
  // Binds options.address (its port fixed from then on: the standby and each leadership
  // serve on it) and begins campaigning. Errors: INVALID_ARGUMENT (options), UNAVAILABLE
  // (the address cannot be bound), or the store's refusal of the location (a malformed
  // one, a newer schema, not a Joule store). A store that does not answer (UNAVAILABLE:
  // not started yet, restarting, a refused login) is retried every third of the lease
  // while this process stands by, each new error logged (the same one once a minute) and
  // told to callers; one that answers with a refusal then stops it (status()).
  static absl::StatusOr<std::unique_ptr<HaCoordinatorServer>> Start(
      CoordinatorServerOptions options, HaOptions ha);
  ~HaCoordinatorServer();
  HaCoordinatorServer(const HaCoordinatorServer&) = delete;
  HaCoordinatorServer& operator=(const HaCoordinatorServer&) = delete;

  // "host:port" bound.
  const std::string& address() const { return address_; }
  bool leading() const { return epoch_.load() != 0; }
  // The epoch this coordinator leads in, 0 while it stands by.
  int64_t epoch() const { return epoch_.load(); }
  // The metrics address of the current leadership, or "".
  std::string metrics_address() const;
  // Resigns the lease if held (so a standby leads at once), stops serving. Idempotent.
  void Shutdown();
  // Until Shutdown, or until the store refused this process (status()).
  void Wait();
  // OK, or why this process stopped on its own (a store it must not use: a newer schema,
  // not a Joule store), once Wait returned.
  absl::Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fatal_;
  }

 private:
  class Standby;
  HaCoordinatorServer() = default;
  void Run();
  // The store campaigns run on (JobStore::Open: its errors).
  static absl::StatusOr<std::unique_ptr<JobStore>> OpenElectionStore(
      const CoordinatorServerOptions& options, const HaOptions& ha);
  // Run's: opens election_, or says why not (standby's answer, the log) and waits a third
  // of the lease; true when open.
  bool OpenElectionStoreOrWait();
  // Waits `d` or until Shutdown; false once shutting down.
  bool Sleep(std::chrono::milliseconds d);
  // Leads (serves) until the lease is lost or Shutdown. Returns how long to stand by before
  // campaigning again (0: at once), which Run waits with its standby serving.
  std::chrono::milliseconds Lead(int64_t epoch, std::chrono::steady_clock::time_point renewed);
  // What Lead and its renewing thread share.
  struct Renewal {
    std::mutex mu;
    std::condition_variable cv;
    std::chrono::steady_clock::time_point renewed;  // start of the last successful renewal
    std::string lost;  // why the lease is someone else's now; empty while ours
    bool done = false;
    bool renew_now = false;  // a worker has seen a newer epoch: renew without waiting
    // When each newer epoch a worker claimed was first heard (at most kMaxClaims kept): a
    // renewal started after it that kept the lease shows the store never had that epoch.
    std::map<int64_t, std::chrono::steady_clock::time_point> claims;
    // How long after `renewed` the lease is this process's (Lead's `usable`): a claim is
    // only disproved while the lease still holds by this clock (a leader paused past it
    // may have been superseded by exactly the epoch claimed).
    std::chrono::milliseconds usable{0};
    static constexpr size_t kMaxClaims = 64;
  };
  // CoordinatorOptions::newer_epoch_claimed for Lead's coordinator.
  static bool NewerEpochClaimed(Renewal& state, int64_t seen);
  // Lead's renewing thread: renews the lease of `epoch` every third of it (a tenth after a
  // failure; on renew_now as soon as a tenth has passed since the last try) until
  // state.done, or until it learns the lease is lost (state.lost; Lead steps down within
  // another tenth).
  void Renew(int64_t epoch, Renewal& state);

  CoordinatorServerOptions options_;
  HaOptions ha_;
  std::unique_ptr<JobStore> election_;  // campaigns on its own connection; null until open
  std::string store_error_;             // why the store could not be opened (Run's)
  std::chrono::steady_clock::time_point store_error_logged_;
  std::string address_;
  std::atomic<int64_t> epoch_{0};
  int failed_starts_ = 0;  // Run's: leaderships in a row whose server failed to start
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  absl::Status fatal_;  // guarded by mu_
  std::unique_ptr<Standby> standby_;
  std::unique_ptr<CoordinatorServer> server_;
  std::mutex join_mu_;  // Wait's
  std::thread runner_;
};

// "host:pid:16 hex digits": a lease holder id that no other process ever uses.
std::string MakeHolderId();

}  // namespace joule::server

#endif  // JOULE_SERVER_HA_COORDINATOR_H_
