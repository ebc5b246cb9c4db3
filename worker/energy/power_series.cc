#include "worker/energy/power_series.h"

#include <algorithm>

namespace joule::worker {

PowerSeries::PowerSeries(size_t capacity) : capacity_(std::max<size_t>(capacity, 2)) {
  points_.reserve(capacity_);
}

void PowerSeries::Add(double elapsed_seconds, double joules) {
  const double last_seconds = points_.empty() ? 0.0 : points_.back().seconds;
  const double last_joules = points_.empty() ? 0.0 : points_.back().joules;
  if (!(elapsed_seconds > last_seconds) || !(joules >= last_joules)) return;
  if (points_.size() == capacity_) {
    // Keep the 2nd, 4th, ... point (each ends a pair of intervals), and the newest.
    size_t kept = 0;
    for (size_t i = 1; i < points_.size(); i += 2) points_[kept++] = points_[i];
    if (points_.size() % 2 == 1) points_[kept++] = points_.back();
    points_.resize(kept);
  }
  points_.push_back({elapsed_seconds, joules});
}

std::vector<v1::PowerSample> PowerSeries::samples() const {
  std::vector<v1::PowerSample> out;
  out.reserve(points_.size());
  Point previous{0, 0};
  for (const Point& p : points_) {
    v1::PowerSample s;
    s.set_elapsed_seconds(p.seconds);
    s.set_joules(p.joules);
    s.set_watts((p.joules - previous.joules) / (p.seconds - previous.seconds));
    out.push_back(s);
    previous = p;
  }
  return out;
}

}  // namespace joule::worker
