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
// When `capacity` points are held, every second point is dropped and the survivors'
// watts recomputed over their longer intervals, so the series always spans the whole
// attempt and its watts stay exact averages (the energy under the curve is unchanged).
// Points whose time does not advance, or whose joules go backwards, are ignored.
// Not thread-safe (the agent's training thread adds).
class PowerSeries {
 public:
  explicit PowerSeries(size_t capacity);

  void Add(double elapsed_seconds, double joules);
  std::vector<v1::PowerSample> samples() const;
  size_t size() const { return points_.size(); }

 private:
  struct Point {
    double seconds;
    double joules;
  };
  size_t capacity_;
  std::vector<Point> points_;
};

}  // namespace joule::worker

#endif  // JOULE_WORKER_ENERGY_POWER_SERIES_H_
