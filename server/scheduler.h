#ifndef JOULE_SERVER_SCHEDULER_H_
#define JOULE_SERVER_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule::server {

// A job waiting for a gang.
struct PendingJob {
  int64_t id = 0;          // FIFO order within a priority: lower id first
  int32_t priority = 0;    // higher first
  v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
  int32_t workers = 1;     // gang size N
  // Only workers of this grid region (a carbon-aware job's CarbonPlan.region); empty: any.
  std::string region;
  // With no `region`: this region's workers first, where they hold the whole gang (a
  // carbon-aware job past its latest start still prefers the region it was planned in).
  std::string preferred_region;
};

// A worker that could take work now, or one that is registered but busy.
struct WorkerSlot {
  std::string id;
  v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
  bool idle = true;
  std::string region;  // WorkerInfo.region
};

struct Placement {
  int64_t job_id = 0;
  std::vector<std::string> workers;  // rank order
};

struct ScheduleDecision {
  std::vector<Placement> placements;
  std::map<int64_t, std::string> waiting;  // job id -> why it still waits
};

// Gang scheduling, priority then FIFO: a job gets all N workers of its device kind at
// once or none. A job that the registered workers of its kind could run once busy ones
// free up blocks later jobs of that kind (no backfill), so a large gang is never starved
// by a stream of small ones. A job that needs more workers than are registered at all
// waits for more to join and does not block the queue behind it. Idle workers are taken
// in `workers` order.
//
// Regions: a job with a region takes only that region's workers, and when it blocks, it
// blocks later jobs from that region's workers only (later jobs may take other regions').
// A job with none takes its gang from one region where one has enough idle workers (the
// first such in `workers` order), else from several.
//
// A pure function: no state, no clock, thread-safe.
ScheduleDecision Schedule(std::vector<PendingJob> pending, const std::vector<WorkerSlot>& workers);

}  // namespace joule::server

#endif  // JOULE_SERVER_SCHEDULER_H_
