#include "worker/energy/power_series.h"

#include <algorithm>
#include <cmath>

namespace joule::worker {

PowerSeries::PowerSeries(size_t capacity) : capacity_(std::max<size_t>(capacity, 4)) {
  points_.reserve(capacity_);
}

void PowerSeries::Add(double elapsed_seconds, double joules) {
  const Point newest = has_pending_ ? pending_ : points_.empty() ? Point{0, 0} : points_.back();
  if (!(elapsed_seconds > newest.seconds) || !(joules >= newest.joules) || !std::isfinite(joules) ||
      !std::isfinite(elapsed_seconds)) {
    return;
  }
  pending_ = {elapsed_seconds, joules};
  has_pending_ = true;
  if (++since_ < stride_) return;
  if (points_.size() + 1 >= capacity_) {
    // Keep the 2nd, 4th, ... point: each ends a pair of intervals of the old stride.
    size_t kept = 0;
    for (size_t i = 1; i < points_.size(); i += 2) points_[kept++] = points_[i];
    points_.resize(kept);
    stride_ *= 2;
  }
  points_.push_back(pending_);
  has_pending_ = false;
  since_ = 0;
}

std::vector<v1::PowerSample> PowerSeries::samples() const {
  std::vector<v1::PowerSample> out;
  out.reserve(size());
  Point previous{0, 0};
  auto emit = [&](const Point& p) {
    v1::PowerSample s;
    s.set_elapsed_seconds(p.seconds);
    s.set_joules(p.joules);
    s.set_watts((p.joules - previous.joules) / (p.seconds - previous.seconds));
    out.push_back(s);
    previous = p;
  };
  for (const Point& p : points_) emit(p);
  if (has_pending_) emit(pending_);
  return out;
}

}  // namespace joule::worker
