#include "client/estimate.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fit.h"
#include "common/names.h"

namespace joule::client {
namespace {

// What a finished job did, as the model sees it.
struct Observed {
  int64_t id = 0;
  double samples_per_worker = 0, updates = 0, seconds = 0, device_hours = 0, joules = 0;
  // The ranks' own training loop (the slowest rank's), and the rest of the wall time
  // (start-up: data, rendezvous; evaluation; teardown), where the result tells them apart.
  double train_seconds = 0, other_seconds = 0;
  bool estimated = false;
};

// A ga job's work per worker over `generations`: the individual-example scores of its
// island (generations x fitness batch x population / workers; the population is the job's,
// split over the islands), what its time follows as an SGD job's follows samples.
double GaWorkPerWorker(const v1::JobSpec& spec, double generations) {
  return generations * spec.ga().fitness_batch() * spec.ga().population() /
         std::max(1, spec.workers());
}

Observed Observe(const v1::Job& j) {
  Observed o;
  o.id = j.id();
  const v1::JobResult& r = j.result();
  double seconds = 0, updates = 0;
  for (const v1::AttemptSummary& a : r.attempts()) {
    seconds += a.wall_seconds();
    updates += static_cast<double>(a.steps());
  }
  if (r.attempts().empty()) {  // a result without attempt summaries (older coordinators)
    seconds = r.wall_seconds();
    updates = static_cast<double>(r.steps());
  }
  o.samples_per_worker = j.spec().algorithm() == "ga"
                             ? GaWorkPerWorker(j.spec(), updates)  // updates: generations run
                             : static_cast<double>(r.samples()) / std::max(1, j.spec().workers());
  o.updates = updates;
  o.seconds = seconds;
  // A succeeded job of one attempt: its training loop's time against the wall's. (Several
  // attempts: the loop's time is the last one's only.)
  if (r.attempts_size() <= 1 && r.train_seconds() > 0 && r.train_seconds() < seconds) {
    o.train_seconds = r.train_seconds();
    o.other_seconds = seconds - r.train_seconds();
  }
  o.device_hours = r.energy().device_hours();
  o.joules = r.energy().total_joules();
  o.estimated = r.energy().estimated();
  return o;
}

// The family's succeeded jobs, oldest first, with id below `before` (0: all).
std::vector<const v1::Job*> FamilyJobs(const v1::JobSpec& spec,
                                       const std::vector<v1::Job>& history, int64_t before) {
  const std::string family = JobFamily(spec);
  std::vector<const v1::Job*> out;
  for (const v1::Job& j : history) {
    if (j.state() != v1::JOB_STATE_SUCCEEDED || JobFamily(j.spec()) != family) continue;
    if (before > 0 && j.id() >= before) continue;
    // One that started from another job's checkpoint (a tune's later rung) counts its
    // samples from the first job's start but its time from its own: not a job's cost.
    if (j.spec().resume_from_job() != 0) continue;
    if (j.result().samples() <= 0 || j.result().energy().device_hours() <= 0) continue;
    out.push_back(&j);
  }
  std::sort(out.begin(), out.end(),
            [](const v1::Job* a, const v1::Job* b) { return a->id() < b->id(); });
  return out;
}

// The dataset's full size as the family's jobs tell it (0: unknown): what a job without
// max_train_samples loaded (its ranks' dataset_train_examples), else, for jobs from before
// that field, one on all of it or on a 1/k subset of all of it (k x its examples per
// epoch: low by up to k global batches, which each epoch drops).
int64_t FullDatasetSize(const std::vector<const v1::Job*>& jobs) {
  int64_t full = 0;
  for (const v1::Job* j : jobs) {
    const v1::JobSpec& s = j->spec();
    if (s.max_train_samples() != 0) continue;
    int64_t loaded = 0;
    for (const v1::RankResult& r : j->result().ranks()) {
      loaded = std::max(loaded, r.dataset_train_examples());
    }
    if (loaded > 0) {
      full = std::max(full, loaded);
      continue;
    }
    if (s.epochs() > 0 && j->result().attempts_size() <= 1) {
      full = std::max(full, j->result().samples() / s.epochs() *
                                std::max<int64_t>(1, s.dataset_fraction()));
    }
  }
  return full;
}

// The training examples per epoch a spec trains on, given the dataset's full size
// (0: unknown).
absl::StatusOr<int64_t> TrainExamples(const v1::JobSpec& spec, int64_t full) {
  int64_t d = full;
  if (spec.max_train_samples() > 0) d = full > 0 ? std::min(full, spec.max_train_samples())
                                                 : spec.max_train_samples();
  if (d <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the size of ", spec.dataset(), " is unknown: no finished job of ", JobFamily(spec),
        " trained on all of it; set max_train_samples or run one such job"));
  }
  if (spec.dataset_fraction() > 1) d /= spec.dataset_fraction();
  return d;
}

// A least-squares prediction with its 95% half-width: t x s x sqrt(1 + 1/n) (the new
// point's leverage taken as that of the mean: the half-width is approximate).
struct Prediction {
  double value = 0, ci95 = 0;
  bool ok = false;
};

Prediction PredictLinear(const std::vector<std::vector<double>>& columns,
                         const std::vector<double>& y, const std::vector<double>& at) {
  Prediction p;
  absl::StatusOr<LinearFit> fit = FitLinear(columns, y);
  if (!fit.ok()) return p;
  const auto& b = fit->coefficients;
  double sse = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    double yi = b[0];
    for (size_t k = 0; k < columns.size(); ++k) yi += b[k + 1] * columns[k][i];
    sse += (y[i] - yi) * (y[i] - yi);
  }
  p.value = b[0];
  for (size_t k = 0; k < columns.size(); ++k) p.value += b[k + 1] * at[k];
  const int n = static_cast<int>(y.size()), df = n - static_cast<int>(columns.size()) - 1;
  if (df >= 1) p.ci95 = StudentT975(df) * std::sqrt(sse / df) * std::sqrt(1.0 + 1.0 / n);
  p.ok = std::isfinite(p.value);
  return p;
}

// The training loop's time through the origin: loop = c_u x updates + c_s x samples per
// worker (each update costs a fixed time - the synchronisation, the optimizer, a kernel's
// launch - and each sample its compute: a step of local batch B costs c_u + c_s B), by
// least squares on the 2x2 normal equations, with the 95% half-width t(n-2) x s x
// sqrt(1 + x0' (X'X)^-1 x0). No intercept: a loop of no steps takes no time, and with
// every job's samples per worker alike (one worker count) an intercept would be collinear
// with them. Not ok with fewer than 3 jobs or a singular system.
Prediction PredictLoop(const std::vector<double>& updates, const std::vector<double>& spw,
                       const std::vector<double>& y, double at_updates, double at_spw) {
  Prediction p;
  const size_t n = y.size();
  if (n < 3) return p;
  double suu = 0, sus = 0, sss = 0, suy = 0, ssy = 0;
  for (size_t i = 0; i < n; ++i) {
    suu += updates[i] * updates[i];
    sus += updates[i] * spw[i];
    sss += spw[i] * spw[i];
    suy += updates[i] * y[i];
    ssy += spw[i] * y[i];
  }
  const double det = suu * sss - sus * sus;
  if (!(det > 1e-12 * suu * sss)) return p;  // collinear: one regressor a multiple of the other
  const double cu = (sss * suy - sus * ssy) / det, cs = (suu * ssy - sus * suy) / det;
  double sse = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = y[i] - cu * updates[i] - cs * spw[i];
    sse += r * r;
  }
  p.value = cu * at_updates + cs * at_spw;
  // x0' (X'X)^-1 x0 with (X'X)^-1 = [sss, -sus; -sus, suu] / det.
  const double leverage =
      (sss * at_updates * at_updates - 2 * sus * at_updates * at_spw + suu * at_spw * at_spw) /
      det;
  const int df = static_cast<int>(n) - 2;
  p.ci95 = StudentT975(df) * std::sqrt(sse / df) * std::sqrt(1.0 + std::max(0.0, leverage));
  p.ok = std::isfinite(p.value) && p.value > 0 && cu >= 0 && cs >= 0;
  return p;
}

absl::StatusOr<JobEstimate> EstimateJobOn(const v1::JobSpec& spec,
                                          const std::vector<v1::Job>& history,
                                          int64_t known_samples);

}  // namespace

bool ConfidentlyAbove(double estimate, double ci95, double limit) {
  // Either rule suffices, so that a tighter interval is never judged more leniently.
  return estimate > 2 * limit || (ci95 > 0 && estimate - ci95 > limit);
}

bool ConfidentlyAboveBudget(const JobEstimate& e, double budget_joules) {
  return ConfidentlyAbove(e.joules, e.joules_ci95, budget_joules);
}

std::string JobFamily(const v1::JobSpec& spec) {
  std::string model = spec.model();
  if (spec.model() == "mlp") {
    model += spec.hidden_sizes().empty()
                 ? " [512,256]"
                 : absl::StrCat(" [", absl::StrJoin(spec.hidden_sizes(), ","), "]");
  }
  if (spec.algorithm() == "ga") model += " (ga)";  // another cost per sample than SGD's
  return absl::StrCat(model, " on ", spec.dataset(), ", ",
                      DeviceKindName(spec.device_kind() == v1::DEVICE_KIND_GPU
                                         ? v1::DEVICE_KIND_GPU
                                         : v1::DEVICE_KIND_CPU));
}

absl::StatusOr<JobEstimate> EstimateJob(const v1::JobSpec& spec,
                                        const std::vector<v1::Job>& history) {
  return EstimateJobOn(spec, history, 0);
}

namespace {

// The wall time of a job of `spw` samples per worker and `updates` updates, from the
// family's observations (`obs`, at least one), and how (*method).
Prediction PredictWallSeconds(const std::vector<Observed>& obs, double spw, double updates,
                              std::string* method) {
  std::vector<double> x_spw, x_upd, t;
  for (const Observed& o : obs) {
    x_spw.push_back(o.samples_per_worker);
    x_upd.push_back(o.updates);
    t.push_back(o.seconds);
  }
  // Time: the training loop and the rest apart where every job tells them apart (issue 23:
  // a start-up cost fitted into the per-sample slope, or scaled with the samples, made a
  // 1.4 s job 6.2 s), each by the richest model the history supports.
  bool split = true;
  std::vector<double> train, other;
  for (const Observed& o : obs) {
    split = split && o.train_seconds > 0;
    train.push_back(o.train_seconds);
    other.push_back(o.other_seconds);
  }
  const std::vector<double>& fitted = split ? train : t;
  Prediction time;
  bool scaled = false;  // from one job: the loop's uncertainty is unknown
  if (split) {
    time = PredictLoop(x_upd, x_spw, train, updates, spw);
    if (time.ok) {
      *method = absl::StrCat("least squares over ", obs.size(),
                              " jobs (loop = time per update + time per sample)");
    }
  }
  if (!time.ok && obs.size() >= 4) {
    time = PredictLinear({x_spw, x_upd}, fitted, {spw, updates});
    if (time.ok) *method = absl::StrCat("least squares over ", obs.size(), " jobs");
  }
  if ((!time.ok || time.value <= 0) && obs.size() >= 2) {
    time = PredictLinear({x_spw}, fitted, {spw});
    if (time.ok) *method = absl::StrCat("least squares over ", obs.size(), " jobs (time ~ samples per worker)");
  }
  if (!time.ok || time.value <= 0) {
    // Scale the job closest in samples per worker by its throughput per worker: its
    // training loop only, when known (a fixed cost does not grow with the samples).
    const Observed* near = &obs[0];
    for (const Observed& o : obs) {
      if (std::abs(std::log(o.samples_per_worker / spw)) <
          std::abs(std::log(near->samples_per_worker / spw))) {
        near = &o;
      }
    }
    time = {(split ? near->train_seconds : near->seconds) * spw / near->samples_per_worker, 0,
            true};
    *method = absl::StrCat("scaled from job ", near->id, " (throughput per worker)");
    scaled = true;
  }
  if (split) {
    // The rest (start-up, evaluation, teardown): the family's mean, its spread the interval.
    double mean = 0, ss = 0;
    for (double x : other) mean += x / other.size();
    for (double x : other) ss += (x - mean) * (x - mean);
    const double ci = other.size() >= 2 ? StudentT975(static_cast<int>(other.size()) - 1) *
                                              std::sqrt(ss / (other.size() - 1)) *
                                              std::sqrt(1.0 + 1.0 / other.size())
                                        : 0;
    time.value += mean;
    // A fitted loop's half-width (0 for exact data) joins the start-up's spread; a loop
    // scaled from one job has no known uncertainty, and neither has the sum.
    time.ci95 = scaled ? 0 : std::hypot(time.ci95, ci);
    *method += "; training loop and start-up, evaluation apart";
  }
  return time;
}

// Non-empty when a job of `spec` (`spw` samples per worker) lies outside what the family's
// jobs measured: how far (JobEstimate::extrapolation).
std::string Extrapolation(const v1::JobSpec& spec, const std::vector<const v1::Job*>& jobs,
                          const std::vector<Observed>& obs, double spw) {
  // Beyond the history: said, with how far (a fit holds where it was measured).
  double lo = obs[0].samples_per_worker, hi = lo;
  for (const Observed& o : obs) {
    lo = std::min(lo, o.samples_per_worker);
    hi = std::max(hi, o.samples_per_worker);
  }
  int most_workers = 0;
  bool same_workers = false;
  for (const v1::Job* j : jobs) {
    most_workers = std::max(most_workers, j->spec().workers());
    same_workers = same_workers || j->spec().workers() == spec.workers();
  }
  if (!same_workers && spec.workers() > most_workers) {
    return absl::StrCat("on ", spec.workers(), " workers, more than any job in its history (",
                        most_workers, "): their synchronisation is not measured, an "
                        "extrapolation");
  }
  if (spw > 1.5 * hi) {
    return absl::StrFormat(
        "%.1fx the most samples per worker in its history: an extrapolation", spw / hi);
  }
  if (spw < lo / 1.5) {
    return absl::StrFormat(
        "%.1fx fewer samples per worker than any job in its history: an extrapolation",
        lo / spw);
  }
  return "";
}

absl::StatusOr<JobEstimate> EstimateJobOn(const v1::JobSpec& spec,
                                          const std::vector<v1::Job>& history,
                                          int64_t known_samples) {
  JobEstimate e;
  e.family = JobFamily(spec);
  const std::vector<const v1::Job*> jobs = FamilyJobs(spec, history, 0);
  if (jobs.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no finished job of ", e.family,
        " to estimate from; `joule estimate --calibrate` runs two short ones"));
  }
  const int64_t gbs = std::max(1, spec.global_batch_size());
  const bool ga = spec.algorithm() == "ga";
  if (ga) {  // generations, each a fitness batch of examples drawn per island
    e.updates = spec.ga().generations();
    e.samples = e.updates * spec.ga().fitness_batch();
  } else if (known_samples > 0) {
    e.samples = known_samples;
    e.updates = known_samples / gbs;
  } else {
    absl::StatusOr<int64_t> examples = TrainExamples(spec, FullDatasetSize(jobs));
    if (!examples.ok()) return examples.status();
    e.updates = *examples / gbs * spec.epochs();
    e.samples = e.updates * gbs;
  }
  const double workers = std::max(1, spec.workers());
  const double spw = ga ? GaWorkPerWorker(spec, static_cast<double>(e.updates))
                        : static_cast<double>(e.samples) / workers;

  std::vector<Observed> obs;
  for (const v1::Job* j : jobs) {
    obs.push_back(Observe(*j));
    e.job_ids.push_back(j->id());
    e.energy_estimated = e.energy_estimated || obs.back().estimated;
  }
  std::vector<double> dh, joules;
  for (const Observed& o : obs) {
    dh.push_back(o.device_hours);
    joules.push_back(o.joules);
  }
  const Prediction time = PredictWallSeconds(obs, spw, static_cast<double>(e.updates), &e.method);
  e.wall_seconds = time.value;
  e.wall_ci95 = time.ci95;
  e.extrapolation = Extrapolation(spec, jobs, obs, spw);
  e.device_hours = e.wall_seconds * workers / 3600.0;
  // Energy: linear in device-hours where the history has the spread to fit it.
  absl::StatusOr<LineFit> line = FitLine(dh, joules);
  if (obs.size() >= 3 && line.ok() && line->slope > 0) {
    e.joules = line->slope * e.device_hours + line->intercept;
    double mx = 0, sxx = 0, sse = 0;
    for (double x : dh) mx += x / dh.size();
    for (size_t i = 0; i < dh.size(); ++i) {
      sxx += (dh[i] - mx) * (dh[i] - mx);
      const double r = joules[i] - (line->slope * dh[i] + line->intercept);
      sse += r * r;
    }
    const int n = static_cast<int>(dh.size());
    const double s = std::sqrt(sse / (n - 2));
    const double leverage = 1.0 + 1.0 / n + (e.device_hours - mx) * (e.device_hours - mx) / sxx;
    // The time's own uncertainty carries through the slope.
    const double from_time = line->slope * e.wall_ci95 * workers / 3600.0;
    e.joules_ci95 = std::hypot(StudentT975(n - 2) * s * std::sqrt(leverage), from_time);
  } else {
    double jdh = 0, total_dh = 0;
    for (size_t i = 0; i < dh.size(); ++i) {
      jdh += joules[i];
      total_dh += dh[i];
    }
    e.joules = e.device_hours * jdh / total_dh;
    e.joules_ci95 = e.wall_ci95 > 0 ? e.joules * e.wall_ci95 / e.wall_seconds : 0;
  }
  e.joules = std::max(0.0, e.joules);
  return e;
}

}  // namespace

std::vector<HoldoutRow> EvaluateHoldout(const v1::JobSpec& spec,
                                        const std::vector<v1::Job>& history, int holdout) {
  const std::vector<const v1::Job*> jobs = FamilyJobs(spec, history, 0);
  std::vector<HoldoutRow> rows;
  const size_t first = jobs.size() > static_cast<size_t>(std::max(0, holdout))
                           ? jobs.size() - static_cast<size_t>(holdout)
                           : 0;
  for (size_t i = first; i < jobs.size(); ++i) {
    const v1::Job& target = *jobs[i];
    HoldoutRow row;
    row.job_id = target.id();
    const Observed actual = Observe(target);
    row.actual_seconds = actual.seconds;
    row.actual_joules = actual.joules;
    std::vector<v1::Job> older;
    for (const v1::Job* j : FamilyJobs(spec, history, target.id())) older.push_back(*j);
    row.jobs_used = static_cast<int>(older.size());
    // The job's own samples: the hold-out tests the time and energy model, not the
    // dataset's size.
    absl::StatusOr<JobEstimate> e = EstimateJobOn(target.spec(), older, target.result().samples());
    if (e.ok()) {
      row.predicted_seconds = e->wall_seconds;
      row.predicted_joules = e->joules;
    } else {
      row.error = std::string(e.status().message());
    }
    rows.push_back(row);
  }
  return rows;
}

std::vector<v1::JobSpec> CalibrationSpecs(const v1::JobSpec& spec) {
  std::vector<v1::JobSpec> out;
  for (int which = 0; which < 2; ++which) {
    v1::JobSpec s = spec;
    s.set_epochs(1);
    if (which == 0) {
      int64_t examples = 8 * static_cast<int64_t>(std::max(1, spec.global_batch_size()));
      if (spec.max_train_samples() > 0) examples = std::min(examples, spec.max_train_samples());
      s.set_max_train_samples(examples);
    } else {
      // A 1/16 subset of the spec's data: larger, and it tells the dataset's size.
      s.set_dataset_fraction(16 * std::max(1, spec.dataset_fraction()));
    }
    s.set_checkpoint_every_steps(0);
    s.set_checkpoint_every_epochs(0);
    s.set_energy_budget_joules(0);
    s.set_lr_warmup_epochs(0);
    s.set_name(which == 0 ? "calibrate-small" : "calibrate-large");
    (*s.mutable_labels())["calibration"] = "true";
    out.push_back(s);
  }
  return out;
}

}  // namespace joule::client
