#include "server/live_attempt.h"

#include <algorithm>
#include <cmath>

namespace joule::server {

void LiveAttempt::Record(int32_t rank, const std::string& host, const v1::RankProgress& progress) {
  const double joules = progress.energy_joules();
  if (std::isfinite(joules) && joules >= 0) rank_joules_[rank] = joules;
  if (std::isfinite(progress.power_watts()) && std::isfinite(progress.elapsed_seconds())) {
    std::deque<v1::PowerSample>& series = power_[rank];
    if (series.empty() || progress.elapsed_seconds() > series.back().elapsed_seconds()) {
      v1::PowerSample p;
      p.set_elapsed_seconds(progress.elapsed_seconds());
      p.set_watts(progress.power_watts());
      p.set_joules(progress.energy_joules());
      series.push_back(p);
      if (series.size() > kMaxPowerPoints) series.pop_front();
    }
  }
  if (progress.step_seconds() > 0) {
    RankTiming& t = timing_[rank];
    t.rank = rank;
    t.host = host;
    t.step_seconds = progress.step_seconds();
    t.collective_wait_seconds = progress.collective_wait_seconds();
    t.links.assign(progress.links().begin(), progress.links().end());
  }
}

double LiveAttempt::RanksJoules() const {
  double joules = 0;
  for (const auto& [rank, j] : rank_joules_) joules += j;
  return joules;
}

double LiveAttempt::Watts() const {
  double watts = 0;
  for (const auto& [rank, series] : power_) {
    if (!series.empty() && std::isfinite(series.back().watts())) watts += series.back().watts();
  }
  return watts;
}

std::vector<double> LiveAttempt::RankWatts() const {
  std::vector<double> out;
  for (const auto& [rank, series] : power_) {
    if (rank < 0 || rank > 65535 || series.empty() || !std::isfinite(series.back().watts())) {
      continue;
    }
    if (static_cast<size_t>(rank) >= out.size()) out.resize(static_cast<size_t>(rank) + 1, 0.0);
    out[static_cast<size_t>(rank)] = series.back().watts();
  }
  return out;
}

std::vector<v1::RankPower> LiveAttempt::Power() const {
  std::vector<v1::RankPower> out;
  for (const auto& [rank, series] : power_) {
    v1::RankPower& rp = out.emplace_back();
    rp.set_rank(rank);
    for (const v1::PowerSample& p : series) *rp.add_samples() = p;
  }
  return out;
}

std::optional<v1::Straggler> LiveAttempt::Straggler(
    const google::protobuf::RepeatedPtrField<v1::RankResult>& results,
    const std::function<std::string(int32_t)>& host_of) const {
  std::map<int32_t, RankTiming> timing = timing_;
  for (const v1::RankResult& rank : results) {
    if (rank.step_seconds() <= 0) continue;
    RankTiming& t = timing[rank.rank()];
    t.rank = rank.rank();
    t.host = host_of ? host_of(rank.rank()) : std::string();
    t.step_seconds = rank.step_seconds();
    t.collective_wait_seconds = rank.collective_wait_seconds();
    t.links.assign(rank.links().begin(), rank.links().end());
  }
  std::vector<RankTiming> ranks;
  for (const auto& [k, t] : timing) ranks.push_back(t);
  return NameStraggler(ranks);
}

std::map<int32_t, double> LiveAttempt::UnreportedJoules(
    const google::protobuf::RepeatedField<int32_t>& reported) const {
  std::map<int32_t, double> out;
  for (const auto& [rank, joules] : rank_joules_) {
    if (std::find(reported.begin(), reported.end(), rank) == reported.end()) out[rank] = joules;
  }
  return out;
}

}  // namespace joule::server
