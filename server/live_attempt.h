#ifndef JOULE_SERVER_LIVE_ATTEMPT_H_
#define JOULE_SERVER_LIVE_ATTEMPT_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"
#include "joule/v1/worker.pb.h"
#include "server/straggler.h"

namespace joule::server {

// What the ranks of a running attempt said in their progress reports, kept by the
// coordinator for that attempt only (a new attempt starts a new one): each rank's energy
// so far, its power over time (the web UI's live chart, the budget's forecast) and its
// timing (who the others wait on). A worker is not trusted: non-finite figures are left
// out, and a power sample is kept only when it moves forward in time.
// Not thread-safe: the coordinator's lock guards it.
class LiveAttempt {
 public:
  // The newest samples kept per rank.
  static constexpr size_t kMaxPowerPoints = 600;

  // Takes rank `rank`'s report; `host` is where that rank runs (for the straggler's name).
  void Record(int32_t rank, const std::string& host, const v1::RankProgress& progress);

  // The ranks' energy so far, joules, summed; and by rank.
  double RanksJoules() const;
  const std::map<int32_t, double>& rank_joules() const { return rank_joules_; }
  // The ranks' latest power, watts, summed (0 before any report).
  double Watts() const;
  // Each rank's last power, indexed by rank up to the highest heard (0 for one not heard).
  std::vector<double> RankWatts() const;
  // Each rank's power samples, oldest first.
  std::vector<v1::RankPower> Power() const;
  // Each rank's latest timing (those that reported one), by rank.
  const std::map<int32_t, RankTiming>& timing() const { return timing_; }

  // The rank the others wait on (NameStraggler) by the ranks' latest progress, or by
  // `results` where a rank's result gives its whole-attempt timing (step_seconds > 0),
  // then on host `host_of(rank)`. Unset when none stands out.
  std::optional<v1::Straggler> Straggler(
      const google::protobuf::RepeatedPtrField<v1::RankResult>& results = {},
      const std::function<std::string(int32_t)>& host_of = nullptr) const;
  // What the ranks that have not reported (not in `reported`) said they spent, by rank:
  // the attempt counts it until their results replace it.
  std::map<int32_t, double> UnreportedJoules(
      const google::protobuf::RepeatedField<int32_t>& reported) const;

 private:
  std::map<int32_t, double> rank_joules_;
  std::map<int32_t, std::deque<v1::PowerSample>> power_;
  std::map<int32_t, RankTiming> timing_;
};

}  // namespace joule::server

#endif  // JOULE_SERVER_LIVE_ATTEMPT_H_
