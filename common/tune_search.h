#ifndef JOULE_COMMON_TUNE_SEARCH_H_
#define JOULE_COMMON_TUNE_SEARCH_H_

// `joule tune`'s search, without I/O: successive halving over a grid's cells (Jamieson and
// Talwalkar, AISTATS 2016; one bracket of Hyperband, Li et al., JMLR 18(185), 2018), rung by
// rung in epochs, ranking cells by their energy or time to a target accuracy, measured
// where a cell reached it and projected where it has not. Pure functions; thread-safe.
//
// The projection (ProjectToTarget): the test error 1 - accuracy of a cell's last epochs
// (at most kFitEpochs) fitted as a power law of the epoch, log(err) = a + b log(epoch), the
// form learning curves take over training (Hestness et al., arXiv 1712.00409, for data;
// Domhan et al., IJCAI 2015, among the curve families); the epoch where it meets
// 1 - target, then the seconds and joules of the epochs still to run at the cell's recent
// rate per epoch. Ranking by the projected cost to the target, not by today's accuracy,
// is what lets a cell that learns slowly at first but steadily survive a rung; a cell
// whose curve flattens early is projected never to arrive and is stopped.

#include <map>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule {

enum class TuneObjective {
  kEnergyToAccuracy,  // joules until the target accuracy is reached
  kTimeToAccuracy,    // wall seconds until then
  kEnergy,            // joules of the whole training (max_epochs), the target a constraint
};

struct TuneOptions {
  TuneObjective objective = TuneObjective::kEnergyToAccuracy;
  double target_accuracy = 0;        // (0, 1): the test accuracy to reach
  int min_epochs = 2;                // the first rung (two epochs: a curve needs two points)
  int max_epochs = 0;                // the last rung: the base job's epochs
  int eta = 2;                       // each rung keeps 1/eta of the cells still searched (>= 2)
  double max_wall_time_seconds = 0;  // a cell whose time to the target exceeds it: out (0: none)
  double max_slowdown = 0;  // out when slower to the target than this x the fastest (0: none)
};

// A cell's epochs so far, cumulative over its rungs: after `epoch` epochs, its test
// accuracy and the wall seconds and joules spent since its first rung started.
struct TuneEpoch {
  int epoch = 0;
  double accuracy = 0;
  double seconds = 0;
  double joules = 0;
};

struct TuneCell {
  std::string key;                // the sweep cell's key ("workers=2,global_batch_size=128")
  std::vector<TuneEpoch> epochs;  // in epoch order
  bool failed = false;            // its last rung did not succeed: never promoted or chosen
};

// How far a cell is from the target.
struct TuneProjection {
  bool reached = false;   // measured: the target was reached after `epoch` epochs
  bool feasible = false;  // reached, or projected to within max_epochs
  double epoch = 0;       // epochs to the target (fractional when projected)
  double seconds = 0;     // to the target (measured or projected)
  double joules = 0;
  double total_joules = 0;  // of max_epochs (measured when run, else projected)
  std::string why;          // when not feasible: why not, in words
};

inline constexpr int kFitEpochs = 4;

// Errors: none; a cell with no epoch, or one with a single epoch that has not reached the
// target, is not feasible ("one epoch: no curve yet").
TuneProjection ProjectToTarget(const TuneCell& cell, const TuneOptions& options);

// The epochs each rung trains its cells to: min_epochs, min_epochs x eta, ... capped at
// max_epochs, which is always the last. Empty when max_epochs < 1.
std::vector<int> RungEpochs(const TuneOptions& options);

// The objective's value of a projection (lower is better); +inf when not feasible.
double TuneScore(const TuneProjection& p, const TuneOptions& options);

// After a rung: which of `cells` (those that ran to it) go on to the next, and why each
// other one stops. A cell that reached the target is finished (measured, never promoted);
// a failed, infeasible or constraint-breaking one (max_wall_time, or max_slowdown against
// the fastest time to the target seen) stops; of the rest, the best max(2, ceil(n / eta))
// by TuneScore go on (n: the cells that ran the rung and had not reached the target), and
// never one whose projection is worse than the best measured cell's. (Two at least: a
// curve about to flatten projects too well from a few epochs, and alone it would end the
// search empty-handed; with a second, the late bloomer it outranked runs on.)
struct TuneRungDecision {
  std::vector<std::string> promoted;
  std::map<std::string, std::string> stopped;  // key -> why
  std::vector<std::string> finished;           // reached the target at this rung
};
// `earlier`: the cells finished at earlier rungs, whose measured figures bound the ranking.
TuneRungDecision DecideRung(const std::vector<TuneCell>& cells, const TuneOptions& options,
                            const std::vector<TuneCell>& earlier = {});

// The search's outcome over every cell's final history: the chosen cell (the best
// TuneScore among those that reached the target, measured; "" when none did), and the
// Pareto front of time against energy to the target among the cells that reached it
// (no other cell both faster and cheaper), fastest first.
struct TuneOutcome {
  std::string chosen;
  std::vector<std::string> front;
  std::map<std::string, TuneProjection> projections;  // every cell's, at its last epoch
};
TuneOutcome ChooseTuneCell(const std::vector<TuneCell>& cells, const TuneOptions& options);

// "energy_to_accuracy", "time_to_accuracy", "energy" (the tune file's `minimize`, and the
// label tune_minimize of a tune's jobs).
const char* TuneObjectiveName(TuneObjective objective);
bool ParseTuneObjective(const std::string& name, TuneObjective* objective);

// The cells of one tune from its jobs (`joule tune`'s: labels cell and rung, each rung's
// job starting from the cell's rung before): each cell's epochs over its rungs 0, 1, ...
// while their jobs succeeded, cumulative (a rung job's seconds and joules count from its
// own start: the earlier rungs' wall seconds and total joules are added). A rung whose
// job has not ended ends the cell's history; one that did not succeed marks it failed.
// `rungs`: if not null, each cell's rungs run (ended), by key.
std::map<std::string, TuneCell> TuneCellsFromJobs(const std::vector<v1::Job>& jobs,
                                                  std::map<std::string, int>* rungs = nullptr);

}  // namespace joule

#endif  // JOULE_COMMON_TUNE_SEARCH_H_
