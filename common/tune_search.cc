#include "common/tune_search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/names.h"

namespace joule {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A cell that is done: it reached the target (for the objectives to the target), or ran
// every epoch.
bool Finished(const TuneCell& cell, const TuneProjection& p, const TuneOptions& o) {
  const bool all_epochs = !cell.epochs.empty() && cell.epochs.back().epoch >= o.max_epochs;
  if (o.objective == TuneObjective::kEnergy) return all_epochs;
  return p.reached || all_epochs;
}

}  // namespace

TuneProjection ProjectToTarget(const TuneCell& cell, const TuneOptions& o) {
  TuneProjection p;
  const std::vector<TuneEpoch>& e = cell.epochs;
  if (e.empty()) {
    p.why = "no epoch ran";
    return p;
  }
  for (const TuneEpoch& x : e) {
    if (x.accuracy >= o.target_accuracy) {
      p.reached = p.feasible = true;
      p.epoch = x.epoch;
      p.seconds = x.seconds;
      p.joules = x.joules;
      break;
    }
  }
  const TuneEpoch& last = e.back();
  // The rate per epoch over the recent epochs (start-up and the first epoch's data
  // loading are not in it), or over all of them with one.
  const size_t n = std::min<size_t>(e.size(), kFitEpochs);
  const TuneEpoch& first = e[e.size() - n];
  double seconds_per_epoch = last.epoch > 0 ? last.seconds / last.epoch : 0;
  double joules_per_epoch = last.epoch > 0 ? last.joules / last.epoch : 0;
  if (n >= 2 && last.epoch > first.epoch) {
    seconds_per_epoch = (last.seconds - first.seconds) / (last.epoch - first.epoch);
    joules_per_epoch = (last.joules - first.joules) / (last.epoch - first.epoch);
  }
  p.total_joules = last.joules + std::max(0, o.max_epochs - last.epoch) * joules_per_epoch;
  if (p.reached) return p;
  if (e.size() < 2) {
    p.why = "one epoch: no curve yet";
    return p;
  }
  // Least squares of log(error) on log(epoch) over the last n epochs.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = e.size() - n; i < e.size(); ++i) {
    const double x = std::log(std::max(1, e[i].epoch));
    const double y = std::log(std::max(1e-9, 1 - e[i].accuracy));
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double denominator = n * sxx - sx * sx;
  const double slope = denominator > 0 ? (n * sxy - sx * sy) / denominator : 0;
  const double intercept = (sy - slope * sx) / n;
  if (!(slope < -1e-9)) {
    p.why = absl::StrFormat("its test accuracy stopped rising at %.4f", last.accuracy);
    return p;
  }
  const double epoch = std::exp((std::log(1 - o.target_accuracy) - intercept) / slope);
  p.epoch = std::max<double>(epoch, last.epoch);
  if (!(p.epoch <= o.max_epochs)) {
    p.why = absl::StrFormat("projected to reach %.4f after %.1f epochs, past the last rung's %d",
                            o.target_accuracy, epoch, o.max_epochs);
    return p;
  }
  p.feasible = true;
  p.seconds = last.seconds + (p.epoch - last.epoch) * seconds_per_epoch;
  p.joules = last.joules + (p.epoch - last.epoch) * joules_per_epoch;
  return p;
}

std::vector<int> RungEpochs(const TuneOptions& o) {
  std::vector<int> rungs;
  if (o.max_epochs < 1) return rungs;
  const int eta = std::max(2, o.eta);
  for (long epochs = std::max(1, o.min_epochs); epochs < o.max_epochs; epochs *= eta) {
    rungs.push_back(static_cast<int>(epochs));
  }
  rungs.push_back(o.max_epochs);
  return rungs;
}

double TuneScore(const TuneProjection& p, const TuneOptions& o) {
  if (!p.feasible) return kInf;
  switch (o.objective) {
    case TuneObjective::kEnergyToAccuracy:
      return p.joules;
    case TuneObjective::kTimeToAccuracy:
      return p.seconds;
    case TuneObjective::kEnergy:
      return p.total_joules;
  }
  return kInf;
}

TuneRungDecision DecideRung(const std::vector<TuneCell>& cells, const TuneOptions& o,
                            const std::vector<TuneCell>& earlier) {
  TuneRungDecision d;
  std::vector<TuneProjection> projections;
  double fastest = kInf, best_measured = kInf;
  for (const TuneCell& c : earlier) {
    const TuneProjection p = ProjectToTarget(c, o);
    if (c.failed || !p.reached) continue;
    fastest = std::min(fastest, p.seconds);
    best_measured = std::min(best_measured, TuneScore(p, o));
  }
  for (const TuneCell& c : cells) {
    projections.push_back(ProjectToTarget(c, o));
    const TuneProjection& p = projections.back();
    if (c.failed || !p.feasible) continue;
    fastest = std::min(fastest, p.seconds);
    if (Finished(c, p, o) && p.reached) best_measured = std::min(best_measured, TuneScore(p, o));
  }
  std::vector<std::pair<double, std::string>> ranked;
  int searched = 0;  // the cells that ran the rung and are not done
  for (size_t i = 0; i < cells.size(); ++i) {
    const TuneCell& c = cells[i];
    const TuneProjection& p = projections[i];
    if (c.failed) {
      d.stopped[c.key] = "its job did not succeed";
      continue;
    }
    if (Finished(c, p, o)) {
      if (p.reached) {
        d.finished.push_back(c.key);
      } else {
        d.stopped[c.key] = absl::StrFormat("ran all %d epochs without reaching %.4f", o.max_epochs,
                                           o.target_accuracy);
      }
      continue;
    }
    ++searched;
    if (!p.feasible) {
      d.stopped[c.key] = p.why;
    } else if (o.max_wall_time_seconds > 0 && p.seconds > o.max_wall_time_seconds) {
      d.stopped[c.key] =
          absl::StrFormat("projected %.0f s to the target, over max_wall_time %.0f s", p.seconds,
                          o.max_wall_time_seconds);
    } else if (o.max_slowdown > 0 && p.seconds > o.max_slowdown * fastest) {
      d.stopped[c.key] = absl::StrFormat(
          "projected %.0f s to the target, over max_slowdown %.2f x the fastest (%.0f s)",
          p.seconds, o.max_slowdown, fastest);
    } else {
      ranked.emplace_back(TuneScore(p, o), c.key);
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const int eta = std::max(2, o.eta);
  // At least two go on while two can: a projection from a few epochs is optimistic for a
  // curve about to flatten, and one such cell alone in a rung would end the search with
  // nothing measured (the late bloomer it displaced stopped).
  const size_t keep =
      static_cast<size_t>(std::max(std::min(2, searched), (searched + eta - 1) / eta));
  const char* unit = o.objective == TuneObjective::kTimeToAccuracy ? "s" : "J";
  for (size_t i = 0; i < ranked.size(); ++i) {
    const auto& [score, key] = ranked[i];
    if (score >= best_measured) {
      d.stopped[key] =
          absl::StrFormat("projected %.1f %s, no better than a cell measured at %.1f %s", score,
                          unit, best_measured, unit);
    } else if (i >= keep) {
      d.stopped[key] = absl::StrFormat("ranked %d of %d (projected %.1f %s); the rung keeps %d",
                                       static_cast<int>(i + 1), static_cast<int>(ranked.size()),
                                       score, unit, static_cast<int>(keep));
    } else {
      d.promoted.push_back(key);
    }
  }
  return d;
}

TuneOutcome ChooseTuneCell(const std::vector<TuneCell>& cells, const TuneOptions& o) {
  TuneOutcome out;
  std::vector<std::pair<double, std::string>> candidates;  // (seconds, key)
  double best = kInf;
  for (const TuneCell& c : cells) {
    const TuneProjection p = ProjectToTarget(c, o);
    out.projections[c.key] = p;
    if (c.failed || !p.reached || !Finished(c, p, o)) continue;
    candidates.emplace_back(p.seconds, c.key);
    const double score = TuneScore(p, o);
    if (score < best) {
      best = score;
      out.chosen = c.key;
    }
  }
  std::sort(candidates.begin(), candidates.end());
  double cheapest = kInf;
  for (const auto& [seconds, key] : candidates) {
    const double joules = out.projections[key].joules;
    if (joules < cheapest) {
      out.front.push_back(key);
      cheapest = joules;
    }
  }
  return out;
}

const char* TuneObjectiveName(TuneObjective objective) {
  switch (objective) {
    case TuneObjective::kEnergyToAccuracy:
      return "energy_to_accuracy";
    case TuneObjective::kTimeToAccuracy:
      return "time_to_accuracy";
    case TuneObjective::kEnergy:
      return "energy";
  }
  return "energy_to_accuracy";
}

bool ParseTuneObjective(const std::string& name, TuneObjective* objective) {
  for (TuneObjective o :
       {TuneObjective::kEnergyToAccuracy, TuneObjective::kTimeToAccuracy, TuneObjective::kEnergy}) {
    if (name == TuneObjectiveName(o)) {
      *objective = o;
      return true;
    }
  }
  return false;
}

std::map<std::string, TuneCell> TuneCellsFromJobs(const std::vector<v1::Job>& jobs,
                                                  std::map<std::string, int>* rungs) {
  std::map<std::pair<std::string, int>, const v1::Job*> by_rung;
  for (const v1::Job& j : jobs) {
    const auto& labels = j.spec().labels();
    auto cell = labels.find("cell"), rung = labels.find("rung");
    int r = 0;
    if (cell == labels.end() || rung == labels.end() || !absl::SimpleAtoi(rung->second, &r) ||
        r < 0) {
      continue;
    }
    by_rung[{cell->second, r}] = &j;
  }
  std::map<std::string, TuneCell> cells;
  for (const auto& [at, first] : by_rung) {
    if (at.second != 0) continue;
    TuneCell& cell = cells[at.first];
    cell.key = at.first;
    double seconds = 0, joules = 0;
    int ended = 0;
    for (int r = 0;; ++r) {
      auto it = by_rung.find({at.first, r});
      if (it == by_rung.end() || !IsTerminal(it->second->state())) break;
      const v1::Job& j = *it->second;
      ++ended;
      if (j.state() != v1::JOB_STATE_SUCCEEDED) {
        cell.failed = true;
        break;
      }
      for (const v1::EpochRecord& h : j.result().history()) {
        if (!cell.epochs.empty() && h.epoch() <= cell.epochs.back().epoch) continue;
        cell.epochs.push_back(
            {h.epoch(), h.test_accuracy(), seconds + h.elapsed_seconds(), joules + h.joules()});
      }
      seconds += j.result().wall_seconds();
      joules += j.result().energy().total_joules();
    }
    if (rungs != nullptr) (*rungs)[at.first] = ended;
  }
  return cells;
}

}  // namespace joule
