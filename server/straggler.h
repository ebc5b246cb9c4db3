#ifndef JOULE_SERVER_STRAGGLER_H_
#define JOULE_SERVER_STRAGGLER_H_

#include <optional>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule::server {

// One rank's timing, as its progress reports or its result give it.
struct RankTiming {
  int rank = 0;
  std::string host;
  double step_seconds = 0;             // mean step, seconds (> 0 when reported)
  double collective_wait_seconds = 0;  // mean wait at the gradient allreduce, seconds
  std::vector<v1::LinkThroughput> links;  // what it received from each peer
};

// Thresholds of NameStraggler, with why.
// A rank stands out when the others wait on it for at least this fraction of a step (and
// kMinSkewSeconds): below it, the difference is the noise of a shared machine (tests on
// two cores measured step-to-step spreads of a few percent).
inline constexpr double kMinSkewFraction = 0.10;
inline constexpr double kMinSkewSeconds = 0.001;
// A rank's links are slow when its fastest one carries under this fraction of the
// fastest link between any two ranks: a link shaped to 100 Mbit/s beside 1 Gbit/s ones
// is at 0.1, while probes of equal links differ by well under 2x.
inline constexpr double kSlowLinkFraction = 0.5;
// A link only explains the wait when the ranks spend at least this fraction of a step in
// the allreduce even when they arrive last (a compute-bound job's slow link costs nothing).
inline constexpr double kCommunicationBoundFraction = 0.10;

// The rank the others wait on, if one stands out; nullopt otherwise (fewer than two
// ranks with timing, or no rank stands out).
//
// Arrival skew without a shared clock: a rank's wait at the allreduce is the time from
// its own arrival to the last rank's, plus the transfer every rank waits for alike. So
// the rank that waits least arrives last, and the others' extra wait over its wait is
// their skew. When that skew is at least kMinSkewFraction of a step, the last-arriving
// rank is named: cause "compute" when its compute (step - wait) exceeds the others'
// median by at least half the skew, else "late". Otherwise, with at least three ranks
// probed, a rank whose every link is slow (kSlowLinkFraction) is named with cause "link"
// when the job is communication-bound (kCommunicationBoundFraction): with two ranks one
// link joins them and cannot say which end is slow.
//
// Pure; thread-safe.
std::optional<v1::Straggler> NameStraggler(const std::vector<RankTiming>& ranks);

}  // namespace joule::server

#endif  // JOULE_SERVER_STRAGGLER_H_
