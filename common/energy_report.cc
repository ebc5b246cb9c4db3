#include "common/energy_report.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/text.h"

namespace joule {
namespace {

// A rank of the attempt's world (a late report names its own rank: anything else is
// not one of the gang's).
bool InWorld(const v1::AttemptSummary& s, int32_t rank) {
  return rank >= 0 && (s.ranks_expected() <= 0 || rank < s.ranks_expected());
}

bool Counted(const v1::AttemptSummary& s, int32_t rank) {
  return std::find(s.ranks_reported().begin(), s.ranks_reported().end(), rank) !=
         s.ranks_reported().end();
}

// Joins a rank's epoch ends to the attempt's (kept sorted by epoch): joules add up over
// the ranks, elapsed is the slowest rank's, rank 0's accuracy and losses stand.
void MergeRankHistory(v1::AttemptSummary& s, const v1::RankResult& rank) {
  auto& history = *s.mutable_history();
  for (const v1::EpochRecord& e : rank.history()) {
    if (e.epoch() < 1) continue;
    auto it = std::lower_bound(history.begin(), history.end(), e.epoch(),
                               [](const v1::EpochRecord& h, int32_t epoch) {
                                 return h.epoch() < epoch;
                               });
    if (it == history.end() || it->epoch() != e.epoch()) {
      if (history.size() >= kMaxHistory) continue;  // a hostile or broken report
      const int at = static_cast<int>(it - history.begin());
      *history.Add() = e;
      for (int i = history.size() - 1; i > at; --i) history.SwapElements(i, i - 1);
      history[at].set_attempt(s.attempt());
      continue;
    }
    it->set_joules(it->joules() + e.joules());
    it->set_elapsed_seconds(std::max(it->elapsed_seconds(), e.elapsed_seconds()));
    if (rank.rank() == 0) {  // rank 0's figures, every one of them, with the sums kept
      v1::EpochRecord merged = e;
      merged.set_joules(it->joules());
      merged.set_elapsed_seconds(it->elapsed_seconds());
      merged.set_attempt(it->attempt());
      *it = std::move(merged);
    }
  }
}

// The ways ranks' node energy was split (RankResult.node_split), each named once, joined by
// " and ", at most 4 names of at most 64 bytes (a hostile report adds nothing past them).
std::string MergeNodeSplit(const std::string& into, const std::string& from) {
  std::vector<std::string> names = absl::StrSplit(into, " and ", absl::SkipEmpty());
  for (absl::string_view name : absl::StrSplit(from, " and ", absl::SkipEmpty())) {
    const std::string clean = SanitizeUtf8(std::string(name), 64);
    if (names.size() < 4 && std::find(names.begin(), names.end(), clean) == names.end()) {
      names.push_back(clean);
    }
  }
  return absl::StrJoin(names, " and ");
}

// Adds `add` to the check of the same pair of sources in `into` (a new one if none); at
// most 8 pairs, and figures no meter gives (negative, not finite) are left out.
void MergeCrossChecks(google::protobuf::RepeatedPtrField<v1::EnergyCrossCheck>* into,
                      const google::protobuf::RepeatedPtrField<v1::EnergyCrossCheck>& add) {
  const auto plausible = [](double j) { return std::isfinite(j) && j >= 0 && j < 1e15; };
  for (const v1::EnergyCrossCheck& c : add) {
    if (!plausible(c.joules()) || !plausible(c.reference_joules())) continue;
    // Names as stored (valid UTF-8, at most 32 bytes), compared as stored.
    const std::string source = SanitizeUtf8(c.source(), 32);
    const std::string reference = SanitizeUtf8(c.reference_source(), 32);
    v1::EnergyCrossCheck* at = nullptr;
    for (v1::EnergyCrossCheck& have : *into) {
      if (have.source() == source && have.reference_source() == reference) at = &have;
    }
    if (at == nullptr) {
      if (into->size() >= 8) continue;
      at = into->Add();
      at->set_source(source);
      at->set_reference_source(reference);
    }
    at->set_joules(at->joules() + c.joules());
    at->set_reference_joules(at->reference_joules() + c.reference_joules());
  }
}

// Adds what `rank` did and spent to `s`, without the devices (the caller accounts them).
void AddRank(v1::AttemptSummary& s, const v1::RankResult& rank) {
  s.add_ranks_reported(rank.rank());
  s.set_samples(s.samples() + rank.samples());
  s.set_steps(std::max(s.steps(), rank.steps() - rank.resumed_from_step()));
  s.set_resumed_from_step(std::max(s.resumed_from_step(), rank.resumed_from_step()));
  s.set_train_seconds(std::max(s.train_seconds(), rank.train_seconds()));
  for (const v1::EnergyRecord& e : rank.energy()) {
    v1::EnergyRecord* rec = s.add_energy();
    *rec = e;
    rec->set_rank(rank.rank());
    rec->set_attempt(s.attempt());
  }
  for (const std::string& w : rank.energy_warnings()) {
    s.add_energy_warnings(absl::StrCat("rank ", rank.rank(), ": ", w));
  }
  if (rank.energy_size() == 0) {
    s.add_energy_warnings(absl::StrCat("rank ", rank.rank(),
                                       ": reported no energy (metering off or failed); "
                                       "its energy is not counted"));
  }
  // The node's (BMC) energy beside the components'; a figure no meter can give (negative,
  // not finite: a broken or hostile report) is left out.
  const auto plausible = [](double j) { return std::isfinite(j) && j >= 0 && j < 1e15; };
  if (rank.node_joules() > 0 && plausible(rank.node_joules()) &&
      plausible(rank.node_component_joules())) {
    s.set_node_joules(s.node_joules() + rank.node_joules());
    s.set_node_component_joules(s.node_component_joules() + rank.node_component_joules());
    s.set_node_ranks(s.node_ranks() + 1);
    if (s.node_source().empty()) s.set_node_source(SanitizeUtf8(rank.node_source(), 256));
    s.set_node_split(MergeNodeSplit(s.node_split(), rank.node_split()));
  }
  MergeCrossChecks(s.mutable_cross_checks(), rank.cross_checks());
  MergeRankHistory(s, rank);
  if (rank.power_size() > 0) {
    v1::RankPower* p = s.add_power();
    p->set_rank(rank.rank());
    const int n = std::min(rank.power_size(), kMaxPowerSamples);
    p->mutable_samples()->Reserve(n);
    for (int i = 0; i < n; ++i) *p->add_samples() = rank.power(i);
  }
}

void NoteMissingRanks(v1::AttemptSummary& s) {
  const int missing = s.ranks_expected() - s.ranks_reported_size();
  // Replaces the previous note, if any: a late rank makes it shorter.
  auto& w = *s.mutable_energy_warnings();
  w.erase(std::remove_if(w.begin(), w.end(),
                         [](const std::string& x) { return x.rfind("ranks missing: ", 0) == 0; }),
          w.end());
  if (missing > 0) {
    s.add_energy_warnings(absl::StrCat("ranks missing: ", missing, " of ", s.ranks_expected(),
                                       " ranks did not report; their energy is not counted"));
  }
}

// `missing_are_held`: ranks that did not report held their devices all the same (an
// attempt the coordinator ran); false for a bare list of rank results.
v1::AttemptSummary Summarise(int32_t attempt, double wall_seconds, int ranks_expected,
                             const google::protobuf::RepeatedPtrField<v1::RankResult>& ranks,
                             bool missing_are_held) {
  v1::AttemptSummary s;
  s.set_attempt(attempt);
  s.set_wall_seconds(std::max(0.0, wall_seconds));
  s.set_ranks_expected(ranks_expected);
  int devices = 0;
  for (const v1::RankResult& r : ranks) {
    if (Counted(s, r.rank()) || !InWorld(s, r.rank())) continue;
    AddRank(s, r);
    devices += std::max(1, r.devices());
  }
  if (missing_are_held) {
    devices += std::max(0, ranks_expected - s.ranks_reported_size());
    NoteMissingRanks(s);
  }
  s.set_devices(devices);
  return s;
}

}  // namespace

v1::AttemptSummary SummariseAttempt(
    int32_t attempt, v1::AttemptOutcome outcome, const std::string& reason, double wall_seconds,
    int ranks_expected, const google::protobuf::RepeatedPtrField<v1::RankResult>& ranks) {
  v1::AttemptSummary s = Summarise(attempt, wall_seconds, ranks_expected, ranks, true);
  s.set_outcome(outcome);
  s.set_reason(reason);
  return s;
}

bool AddRankToAttempt(v1::AttemptSummary& summary, const v1::RankResult& rank) {
  if (Counted(summary, rank.rank()) || !InWorld(summary, rank.rank())) return false;
  AddRank(summary, rank);
  summary.mutable_unreported_progress_joules()->erase(rank.rank());  // its result counts now
  // A rank that reported after the attempt ended (it was stopping, or its result came
  // after a restart) held its device until then: the attempt lasted at least as long.
  summary.set_wall_seconds(std::max(summary.wall_seconds(), rank.wall_seconds()));
  // The rank was counted as one device while missing; now it counts what it reported.
  summary.set_devices(summary.devices() - 1 + std::max(1, rank.devices()));
  NoteMissingRanks(summary);
  return true;
}

v1::EnergyReport BuildEnergyReport(const v1::JobResult& result, double grid_gco2_per_kwh,
                                   int ranks_expected) {
  google::protobuf::RepeatedPtrField<v1::AttemptSummary> attempts = result.attempts();
  // No attempt and no rank: a job that never ran (cancelled while pending) expects none.
  if (attempts.empty() && result.ranks().empty()) ranks_expected = 0;
  if (attempts.empty()) {
    v1::AttemptSummary one =
        Summarise(0, result.wall_seconds(), ranks_expected, result.ranks(), false);
    one.set_samples(result.samples());  // the caller's totals, as given
    one.set_steps(result.steps());
    *attempts.Add() = std::move(one);
  }
  v1::EnergyReport r;
  double wall = 0, device_hours = 0, joules = 0, last_joules = 0, unreported = 0;
  int64_t samples = 0, steps = 0;
  for (const v1::AttemptSummary& a : attempts) {
    for (const auto& [rank, j] : a.unreported_progress_joules()) unreported += j;
    const bool last = &a == &attempts[attempts.size() - 1];
    double attempt_joules = 0;
    for (const v1::EnergyRecord& e : a.energy()) {
      *r.add_records() = e;
      attempt_joules += e.joules();
      if (e.source() == "estimated") r.set_estimated(true);
    }
    for (const std::string& w : a.energy_warnings()) {
      r.add_warnings(last || attempts.size() == 1 ? w
                                                  : absl::StrCat("attempt ", a.attempt(), " ", w));
    }
    joules += attempt_joules;
    if (last) last_joules = attempt_joules;
    r.set_node_joules(r.node_joules() + a.node_joules());
    r.set_node_component_joules(r.node_component_joules() + a.node_component_joules());
    if (r.node_source().empty()) r.set_node_source(a.node_source());
    r.set_node_split(MergeNodeSplit(r.node_split(), a.node_split()));
    MergeCrossChecks(r.mutable_cross_checks(), a.cross_checks());
    wall += a.wall_seconds();
    device_hours += a.wall_seconds() * a.devices() / 3600.0;
    samples += a.samples();
    steps += a.steps();
  }
  const v1::AttemptSummary& last = attempts[attempts.size() - 1];
  r.set_ranks_reported(last.ranks_reported_size());
  r.set_node_ranks(last.node_ranks());
  r.set_ranks_expected(last.ranks_expected() > 0 ? last.ranks_expected() : ranks_expected);
  r.set_devices(last.devices());
  r.set_total_joules(joules);
  r.set_unreported_joules(unreported);
  r.set_earlier_attempts_joules(joules - last_joules);
  r.set_kwh(joules / 3.6e6);
  r.set_device_hours(device_hours);
  r.set_average_watts(wall > 0 ? joules / wall : 0);
  r.set_joules_per_device_hour(device_hours > 0 ? joules / device_hours : 0);
  r.set_samples_per_joule(joules > 0 ? samples / joules : 0);
  r.set_updates_per_device_hour(device_hours > 0 ? steps / device_hours : 0);
  r.set_grid_gco2_per_kwh(grid_gco2_per_kwh);
  r.set_co2_grams(r.kwh() * grid_gco2_per_kwh);
  return r;
}

std::map<std::string, double> EnergyBy(const v1::EnergyReport& report, const std::string& key) {
  std::map<std::string, double> out;
  for (const v1::EnergyRecord& e : report.records()) {
    std::string k = key == "rank"     ? absl::StrCat(e.rank())
                    : key == "device" ? absl::StrCat(e.rank(), "/", e.device())
                    : key == "source" ? e.source()
                                      : e.phase();
    out[k] += e.joules();
  }
  return out;
}

}  // namespace joule

namespace joule {

google::protobuf::RepeatedPtrField<v1::EpochRecord> BuildJobHistory(const v1::JobResult& result) {
  google::protobuf::RepeatedPtrField<v1::EpochRecord> history;
  double seconds_before = 0, joules_before = 0;
  for (const v1::AttemptSummary& a : result.attempts()) {
    if (a.history_size() > 0) {
      // A resumed attempt trains its first epoch again (or a later one): drop what it redoes.
      const int32_t first = a.history(0).epoch();
      while (!history.empty() && history[history.size() - 1].epoch() >= first) {
        history.RemoveLast();
      }
      for (const v1::EpochRecord& e : a.history()) {
        v1::EpochRecord* h = history.Add();
        *h = e;
        h->set_attempt(a.attempt());
        h->set_elapsed_seconds(seconds_before + e.elapsed_seconds());
        h->set_joules(joules_before + e.joules());
      }
    }
    seconds_before += a.wall_seconds();
    for (const v1::EnergyRecord& r : a.energy()) joules_before += r.joules();
  }
  return history;
}

namespace {

constexpr TargetMetric kTargetMetrics[] = {
    {"test_accuracy", false, [](const v1::EpochRecord& e) { return e.test_accuracy(); }},
    {"test_top_k_accuracy", false,
     [](const v1::EpochRecord& e) { return e.test_top_k_accuracy(); }},
    {"train_accuracy", false, [](const v1::EpochRecord& e) { return e.train_accuracy(); }},
    {"train_top_k_accuracy", false,
     [](const v1::EpochRecord& e) { return e.train_top_k_accuracy(); }},
    {"test_loss", true, [](const v1::EpochRecord& e) { return e.test_loss(); }},
    {"test_rmse", true,
     [](const v1::EpochRecord& e) { return e.has_test_rmse() ? e.test_rmse() : -1.0; }},
    {"train_eval_loss", true, [](const v1::EpochRecord& e) { return e.train_eval_loss(); }},
};

}  // namespace

const TargetMetric* FindTargetMetric(std::string_view name) {
  if (name.empty()) name = "test_accuracy";
  for (const TargetMetric& m : kTargetMetrics) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string TargetMetricNames() {
  std::string names;
  for (const TargetMetric& m : kTargetMetrics) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", std::string(m.name));
  }
  return names;
}

std::vector<v1::AccuracyTarget> TargetsOf(const v1::JobSpec& spec) {
  const TargetMetric* metric = FindTargetMetric(spec.target_metric());
  if (metric == nullptr) metric = FindTargetMetric("");
  std::vector<double> values;
  if (metric->lower_is_better) {
    if (spec.target_loss() > 0) values.push_back(spec.target_loss());
  } else {
    values = {0.5, 0.6, 0.7, 0.8, 0.85, 0.9};
    const double own = spec.target_accuracy();
    if (own > 0 && own <= 1 && std::find(values.begin(), values.end(), own) == values.end()) {
      values.insert(std::upper_bound(values.begin(), values.end(), own), own);
    }
  }
  std::vector<v1::AccuracyTarget> targets;
  for (double v : values) {
    v1::AccuracyTarget& t = targets.emplace_back();
    t.set_target(v);
    t.set_metric(std::string(metric->name));
    t.set_lower_is_better(metric->lower_is_better);
  }
  return targets;
}

v1::AccuracyTarget ToTarget(const google::protobuf::RepeatedPtrField<v1::EpochRecord>& history,
                            v1::AccuracyTarget target) {
  const TargetMetric* metric = FindTargetMetric(target.metric());
  target.set_reached(false);
  if (metric == nullptr) return target;
  for (const v1::EpochRecord& e : history) {
    const double figure = metric->read(e);
    if (figure < 0) continue;  // not measured in that epoch
    if (metric->lower_is_better ? figure <= target.target() : figure >= target.target()) {
      target.set_reached(true);
      target.set_epoch(e.epoch());
      target.set_seconds(e.elapsed_seconds());
      target.set_joules(e.joules());
      break;
    }
  }
  return target;
}

std::string TargetLabel(const v1::AccuracyTarget& target) {
  return absl::StrCat(target.metric().empty() ? "test_accuracy" : target.metric(),
                      target.lower_is_better() ? " <= " : " >= ", target.target());
}

v1::AccuracyTarget ToAccuracy(const google::protobuf::RepeatedPtrField<v1::EpochRecord>& history,
                              double target) {
  v1::AccuracyTarget t;
  t.set_target(target);
  t.set_metric("test_accuracy");
  return ToTarget(history, std::move(t));
}

}  // namespace joule
