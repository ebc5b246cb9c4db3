#include "server/straggler.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_format.h"

namespace joule::server {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string Who(const RankTiming& r) {
  return r.host.empty() ? absl::StrFormat("rank %d", r.rank)
                        : absl::StrFormat("rank %d (host %s)", r.rank, r.host);
}

// What the others wait on a rank named as the straggler: their mean extra wait.
double OthersExtraWait(const std::vector<const RankTiming*>& timed, const RankTiming& last) {
  double sum = 0;
  int n = 0;
  for (const RankTiming* r : timed) {
    if (r->rank == last.rank) continue;
    sum += r->collective_wait_seconds - last.collective_wait_seconds;
    ++n;
  }
  return n > 0 ? sum / n : 0;
}

std::optional<v1::Straggler> ByArrival(const std::vector<const RankTiming*>& timed) {
  const auto [least, most] = std::minmax_element(
      timed.begin(), timed.end(), [](const RankTiming* a, const RankTiming* b) {
        return a->collective_wait_seconds < b->collective_wait_seconds;
      });
  const RankTiming& last = **least;
  std::vector<double> steps;
  for (const RankTiming* r : timed) steps.push_back(r->step_seconds);
  const double step = Median(steps);
  const double skew = (*most)->collective_wait_seconds - last.collective_wait_seconds;
  if (skew < kMinSkewSeconds || skew < kMinSkewFraction * step) return std::nullopt;
  std::vector<double> others_compute;
  for (const RankTiming* r : timed) {
    if (r->rank != last.rank) others_compute.push_back(r->step_seconds - r->collective_wait_seconds);
  }
  const double compute = last.step_seconds - last.collective_wait_seconds;
  const double others = Median(others_compute);
  const double waited = OthersExtraWait(timed, last);
  v1::Straggler s;
  s.set_rank(last.rank);
  s.set_host(last.host);
  s.set_wait_seconds(waited);
  if (compute - others >= skew / 2) {
    s.set_cause("compute");
    s.set_text(absl::StrFormat(
        "%s: the others wait on it %.3f s a step at the allreduce; it computes %.3f s a step "
        "against %.3f s for the others (a loaded or slower CPU)",
        Who(last), waited, compute, others));
  } else {
    s.set_cause("late");
    s.set_text(absl::StrFormat(
        "%s: it enters the allreduce last, the others waiting %.3f s a step, though it "
        "computes no slower (%.3f s against %.3f s): its data loading or scheduling",
        Who(last), waited, compute, others));
  }
  return s;
}

std::optional<v1::Straggler> ByLinks(const std::vector<const RankTiming*>& timed,
                                     const std::vector<RankTiming>& ranks) {
  // Each pair's throughput: the slower of the two directions either side measured.
  std::map<std::pair<int, int>, double> pair_mbps;
  for (const RankTiming& r : ranks) {
    for (const v1::LinkThroughput& l : r.links) {
      if (l.peer() == r.rank || !(l.megabytes_per_second() > 0)) continue;
      const std::pair<int, int> key = std::minmax(r.rank, l.peer());  // copied: minmax returns references
      auto [it, inserted] = pair_mbps.emplace(key, l.megabytes_per_second());
      if (!inserted) it->second = std::min(it->second, l.megabytes_per_second());
    }
  }
  std::map<int, double> best_of;  // each rank's fastest link
  double best = 0;
  for (const auto& [pair, mbps] : pair_mbps) {
    best_of[pair.first] = std::max(best_of[pair.first], mbps);
    best_of[pair.second] = std::max(best_of[pair.second], mbps);
    best = std::max(best, mbps);
  }
  if (best_of.size() < 3 || best <= 0) return std::nullopt;
  const RankTiming* slow = nullptr;
  int slow_count = 0;
  for (const RankTiming& r : ranks) {
    auto it = best_of.find(r.rank);
    if (it != best_of.end() && it->second < kSlowLinkFraction * best) {
      slow = &r;
      ++slow_count;
    }
  }
  if (slow_count != 1) return std::nullopt;
  // Communication-bound: even the last to arrive spends a share of its step waiting.
  double min_wait_fraction = 1;
  for (const RankTiming* r : timed) {
    min_wait_fraction = std::min(min_wait_fraction, r->collective_wait_seconds / r->step_seconds);
  }
  if (timed.size() < 2 || min_wait_fraction < kCommunicationBoundFraction) return std::nullopt;
  double wait = 0;
  for (const RankTiming* r : timed) wait += r->collective_wait_seconds;
  v1::Straggler s;
  s.set_rank(slow->rank);
  s.set_host(slow->host);
  s.set_cause("link");
  s.set_wait_seconds(wait / static_cast<double>(timed.size()));
  s.set_text(absl::StrFormat(
      "%s: its links carry %.1f MB/s at best against %.1f MB/s between the others, and "
      "every rank waits %.3f s a step at the allreduce (a slow or shaped link)",
      Who(*slow), best_of[slow->rank], best, s.wait_seconds()));
  return s;
}

}  // namespace

std::optional<v1::Straggler> NameStraggler(const std::vector<RankTiming>& ranks) {
  std::vector<const RankTiming*> timed;
  for (const RankTiming& r : ranks) {
    if (r.step_seconds > 0 && r.collective_wait_seconds >= 0 &&
        r.collective_wait_seconds <= r.step_seconds) {
      timed.push_back(&r);
    }
  }
  if (timed.size() < 2) return std::nullopt;
  if (std::optional<v1::Straggler> s = ByArrival(timed)) return s;
  return ByLinks(timed, ranks);
}

}  // namespace joule::server
