#ifndef JOULE_WORKER_ENERGY_POWER_SERIES_H_
#define JOULE_WORKER_ENERGY_POWER_SERIES_H_

#include <cstddef>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule::worker {

// One rank's power over an attempt at a bounded resolution, for its report
// (RankResult.power): points of (elapsed seconds, cumulative joules), each with the
// average power over the interval since the previous point,
//   watts_i = (joules_i - joules_{i-1}) / (t_i - t_{i-1})   (the first point: since 0 s, 0 J).
// Points are kept every `stride` additions (1 at first); when `capacity` - 1 are kept,
// every second one is dropped and the stride doubles, so the series spans the whole
// attempt at an even resolution and its watts stay exact averages (the energy under the
// curve is unchanged). The newest point is always included. Points whose time does not
// advance, or whose joules go backwards or are not finite, are ignored.
// Not thread-safe (the agent's training thread adds).
class PowerSeries {
 public:
  // At least 4 points.
  explicit PowerSeries(size_t capacity);

  void Add(double elapsed_seconds, double joules);
  std::vector<v1::PowerSample> samples() const;
  size_t size() const { return points_.size() + (has_pending_ ? 1 : 0); }

 private:
  struct Point {
    double seconds;
    double joules;
  };
  size_t capacity_;
  std::vector<Point> points_;  // kept, every stride_-th addition
  Point pending_{0, 0};        // the newest addition, not (yet) kept
  bool has_pending_ = false;
  size_t stride_ = 1, since_ = 0;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_POWER_SERIES_H_
