#include "client/job_format.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/energy_report.h"
#include "common/job_spec.h"
#include "common/json_output.h"
#include "common/names.h"
#include "common/text.h"

namespace joule::client {

namespace {
// `s` in at most `width` characters: long values keep their start and end around "..."
// (a torchscript: or csv: path keeps its file name).
std::string Fit(const std::string& s, size_t width) {
  if (s.size() <= width) return s;
  const size_t head = (width - 3) / 2, tail = width - 3 - head;
  return s.substr(0, head) + "..." + s.substr(s.size() - tail);
}
}  // namespace

std::string JobListHeader() {
  // The last column unpadded: no trailing spaces.
  return absl::StrFormat("%-6s %-15s %-16s %-12s %-16s %7s %6s %8s %11s %9s %s", "ID", "STATE",
                         "NAME", "MODEL", "DATASET", "WORKERS", "GBS", "ACCURACY", "ENERGY J",
                         "DURATION", "SUBMITTED");
}

std::string JobLine(const v1::Job& job) {
  const v1::JobSpec& s = job.spec();
  std::string acc = "-";
  const v1::JobResult& r = job.result();
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    acc = absl::StrFormat("%.4f", r.test_accuracy());
  } else if (job.progress().test_accuracy() >= 0 && job.state() == v1::JOB_STATE_RUNNING) {
    acc = absl::StrFormat("%.4f", job.progress().test_accuracy());
  } else if (r.history_size() > 0) {  // a job that ended early: its last evaluation
    acc = absl::StrFormat("%.4f", r.history(r.history_size() - 1).test_accuracy());
  }
  // Energy: the report's once ended, the whole job's so far while running.
  const double joules = IsTerminal(job.state()) ? r.energy().total_joules()
                                                : job.progress().job_energy_joules();
  std::string energy = joules > 0 ? absl::StrFormat("%.1f%s", joules,
                                                    r.energy().estimated() ||
                                                            job.progress().energy_estimated()
                                                        ? "~"
                                                        : "")
                                  : "-";
  std::string duration = "-";
  const int64_t end = job.finished_unix_ms() > 0 ? job.finished_unix_ms()
                      : job.state() == v1::JOB_STATE_RUNNING ? NowUnixMs()
                                                              : 0;
  if (job.started_unix_ms() > 0 && end >= job.started_unix_ms()) {
    duration = absl::StrFormat("%.1fs", (end - job.started_unix_ms()) / 1000.0);
  }
  std::string submitted = "-";
  if (job.created_unix_ms() > 0) {
    const std::time_t t = static_cast<std::time_t>(job.created_unix_ms() / 1000);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    submitted = buf;
  }
  return absl::StrFormat("%-6d %-15s %-16s %-12s %-16s %7d %6d %8s %11s %9s %-16s", job.id(),
                         JobStateName(job.state()), Fit(s.name(), 16), Fit(s.model(), 12),
                         Fit(s.dataset(), 16), s.workers(), s.global_batch_size(), acc, energy,
                         duration, submitted);
}

std::string JobCsvHeader() {
  return "id,state,name,model,dataset,workers,global_batch_size,test_accuracy,energy_joules,"
         "energy_estimated,duration_seconds,submitted,submitted_by,labels,planned_start,"
         "co2_grid_grams,co2_saved_grams";
}

namespace {

// planned_start (a carbon-aware job's), co2_grid_grams (over the run at the grid's
// intensity, where the coordinator has a source) and co2_saved_grams (against starting at
// submit, a carbon-aware job's; negative where waiting emitted more): empty where none.
std::string CarbonCsvFields(const v1::Job& job) {
  const v1::CarbonAccount& c = job.carbon();
  const bool aware = job.spec().carbon_aware();
  return absl::StrCat(aware && job.carbon_plan().planned_start_unix_ms() > 0
                          ? Rfc3339(job.carbon_plan().planned_start_unix_ms())
                          : "",
                      ",", c.source().empty() ? "" : absl::StrFormat("%.3f", c.grams()), ",",
                      aware && !c.source().empty() && c.grams_at_submit() > 0
                          ? absl::StrFormat("%.3f", c.grams_at_submit() - c.grams())
                          : "");
}

}  // namespace

std::string JobCsvLine(const v1::Job& job) {
  const v1::JobSpec& s = job.spec();
  const v1::JobResult& r = job.result();
  std::string acc;
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    acc = absl::StrFormat("%.6f", r.test_accuracy());
  } else if (job.progress().test_accuracy() >= 0 && job.state() == v1::JOB_STATE_RUNNING) {
    acc = absl::StrFormat("%.6f", job.progress().test_accuracy());
  } else if (r.history_size() > 0) {
    acc = absl::StrFormat("%.6f", r.history(r.history_size() - 1).test_accuracy());
  }
  const double joules =
      IsTerminal(job.state()) ? r.energy().total_joules() : job.progress().job_energy_joules();
  const int64_t end = job.finished_unix_ms() > 0             ? job.finished_unix_ms()
                      : job.state() == v1::JOB_STATE_RUNNING ? NowUnixMs()
                                                             : 0;
  std::string duration;
  if (job.started_unix_ms() > 0 && end >= job.started_unix_ms()) {
    duration = absl::StrFormat("%.3f", (end - job.started_unix_ms()) / 1000.0);
  }
  std::vector<std::string> labels;
  for (const auto& [k, v] :
       std::map<std::string, std::string>(s.labels().begin(), s.labels().end())) {
    labels.push_back(k + "=" + v);
  }
  const bool estimated = r.energy().estimated() || job.progress().energy_estimated();
  return absl::StrCat(job.id(), ",", JobStateName(job.state()), ",", CsvField(s.name()), ",",
                      CsvField(s.model()), ",", CsvField(s.dataset()), ",", s.workers(), ",",
                      s.global_batch_size(), ",", acc, ",", absl::StrFormat("%.3f", joules), ",",
                      estimated ? "true" : "false", ",", duration, ",",
                      job.created_unix_ms() > 0 ? Rfc3339(job.created_unix_ms()) : "", ",",
                      CsvField(job.submitted_by()), ",", CsvField(absl::StrJoin(labels, ";")), ",",
                      CarbonCsvFields(job));
}

std::string TimeLeft(const v1::Job& job) {
  const v1::JobProgress& p = job.progress();
  const int64_t total = p.steps_per_epoch() * job.spec().epochs();
  const int64_t done = p.step() - job.result().resumed_from_step();
  if (job.state() != v1::JOB_STATE_RUNNING || total <= 0 || done <= 0 ||
      p.elapsed_seconds() <= 0 || p.step() >= total) {
    return "";
  }
  // At the attempt's pace so far (start-up included, so it errs long early on).
  const double left = p.elapsed_seconds() / static_cast<double>(done) *
                      static_cast<double>(total - p.step());
  return absl::StrFormat("about %.0f s left", left);
}

namespace {

void AppendSpecKnobs(const v1::Job& job, std::string& out);

// The model, data, batch and synchronisation; who submitted it, when, and its knobs.
void AppendSpecLines(const v1::Job& job, std::string& out) {
  const v1::JobSpec& s = job.spec();
  absl::StrAppend(&out, "  model ", s.model(), " on ", s.dataset());
  if (s.max_train_samples() > 0) {
    absl::StrAppend(&out, " (first ", s.max_train_samples(), " training examples)");
  }
  absl::StrAppend(&out, ", ", s.workers(), " ", DeviceKindName(s.device_kind()),
                  s.workers() == 1 ? " worker" : " workers", ", global batch ",
                  s.global_batch_size(), " (local ", s.local_batch_size(), "), ", s.epochs(),
                  s.epochs() == 1 ? " epoch" : " epochs");
  if (s.algorithm() == "ga") {
    // A genetic algorithm has no learning rate or gradient sync: its own knobs.
    const v1::GaSpec& ga = s.ga();
    absl::StrAppend(&out, ", genetic algorithm: population ", ga.population(), " (",
                    ga.population() / std::max(1, s.workers()), " per island), ",
                    ga.generations(), " generations, mutation ", ga.mutation_rate(), " x ",
                    ga.mutation_scale(), ", crossover ", ga.crossover_rate(), ", elite ",
                    ga.elite());
    if (ga.migration_interval() > 0 && s.workers() > 1) {
      absl::StrAppend(&out, ", ", ga.migration_size(), " migrants every ",
                      ga.migration_interval(), " generations");
    }
    absl::StrAppend(&out, "\n");
    return AppendSpecKnobs(job, out);
  }
  const bool linear = s.lr_scaling() == "linear";
  const double lr = TargetLearningRate(s.optimizer().lr(), linear, s.global_batch_size());
  const v1::OptimizerSpec& o = s.optimizer();
  absl::StrAppend(&out, ", ", o.name().empty() ? "sgd" : o.name(), " lr ", lr);
  if (linear) {
    absl::StrAppend(&out, " (", s.optimizer().lr(), " x ", s.global_batch_size(),
                    "/256, linear scaling", s.lr_warmup_epochs() > 0 ? "; " : ")");
    if (s.lr_warmup_epochs() > 0) {
      absl::StrAppend(&out, "warm-up from ", s.optimizer().lr(), " over ",
                      s.lr_warmup_epochs(), " epochs)");
    }
  }
  if (o.name() == "adamw") {
    absl::StrAppend(&out, " betas ", o.beta1(), ",", o.beta2());
  } else {
    absl::StrAppend(&out, " momentum ", o.momentum(), o.nesterov() ? " (nesterov)" : "");
  }
  if (o.name() == "lars") absl::StrAppend(&out, " trust ", o.trust_coefficient());
  if (o.weight_decay() != 0) {
    absl::StrAppend(&out, " weight decay ", o.weight_decay(),
                    o.decoupled_weight_decay() ? " (decoupled)" : "");
  }
  // How the ranks synchronise.
  if (s.sync().strategy() == v1::SYNC_STRATEGY_LOCAL_SGD) {
    absl::StrAppend(&out, ", local SGD every ", std::max(1, s.sync().period()), " steps");
    if (s.sync().warmup_steps() > 0) {
      absl::StrAppend(&out, " after ", s.sync().warmup_steps(), " allreduce steps");
    }
    if (s.sync().average_momentum()) absl::StrAppend(&out, " (momentum averaged)");
  } else if (s.sync().strategy() == v1::SYNC_STRATEGY_POWERSGD) {
    absl::StrAppend(&out, ", PowerSGD rank ", std::max(1, s.sync().powersgd_rank()),
                    " with error feedback");
    if (s.sync().warmup_steps() > 0) {
      absl::StrAppend(&out, " after ", s.sync().warmup_steps(), " allreduce steps");
    }
  } else if (s.workers() > 1) {
    absl::StrAppend(&out, ", allreduce");
    if (s.sync().bucket_bytes() > 0) {
      absl::StrAppend(&out, " in ", s.sync().bucket_bytes(), "-byte buckets");
    }
    if (s.sync().fp16_compression()) absl::StrAppend(&out, ", fp16 compressed");
  }
  if (s.accumulation_steps() > 1) {
    absl::StrAppend(&out, ", ", s.accumulation_steps(), " micro-batches per step");
  }
  absl::StrAppend(&out, "\n");
  AppendSpecKnobs(job, out);
}

// Who, when, and the spec's remaining knobs (`joule status ID -o json` has every field).
void AppendSpecKnobs(const v1::Job& job, std::string& out) {
  const v1::JobSpec& s = job.spec();
  auto when = [](int64_t ms) {
    if (ms <= 0) return std::string("-");
    const std::time_t t = static_cast<std::time_t>(ms / 1000);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    return std::string(buf);
  };
  absl::StrAppend(&out, "  submitted ", when(job.created_unix_ms()), " by ",
                  job.submitted_by().empty() ? "anonymous" : job.submitted_by());
  if (job.started_unix_ms() > 0) absl::StrAppend(&out, ", started ", when(job.started_unix_ms()));
  if (job.finished_unix_ms() > 0) {
    absl::StrAppend(&out, ", ended ", when(job.finished_unix_ms()));
  }
  absl::StrAppend(&out, "; priority ", s.priority(), ", seed ", s.seed());
  if (s.labels_size() > 0) {
    std::vector<std::string> labels;
    for (const auto& [k, v] : s.labels()) labels.push_back(absl::StrCat(k, "=", v));
    std::sort(labels.begin(), labels.end());
    absl::StrAppend(&out, "; labels ", absl::StrJoin(labels, ", "));
  }
  absl::StrAppend(&out, "\n");
  if (s.carbon_aware()) {
    const v1::CarbonPlan& p = job.carbon_plan();
    absl::StrAppend(&out, "  carbon-aware: ",
                    s.start_before_unix_ms() > 0
                        ? absl::StrCat("start before ", when(s.start_before_unix_ms()))
                        : absl::StrCat("finish by ", when(s.finish_by_unix_ms())),
                    s.expected_run_seconds() > 0
                        ? absl::StrFormat(" for a run of %.0f min", s.expected_run_seconds() / 60)
                        : std::string(" for a run of an hour (no length given)"));
    if (p.planned_start_unix_ms() > 0) {
      absl::StrAppend(&out, "; planned start ", when(p.planned_start_unix_ms()));
      if (!p.region().empty()) absl::StrAppend(&out, " in region ", p.region());
      if (p.planned_gco2_per_kwh() > 0) {
        absl::StrAppend(&out, absl::StrFormat(" (forecast %.0f g/kWh against %.0f at submit)",
                                              p.planned_gco2_per_kwh(), p.now_gco2_per_kwh()));
      }
    }
    if (!p.note().empty()) absl::StrAppend(&out, "; without waiting: ", p.note());
    absl::StrAppend(&out, "\n");
  }
}

// The current attempt's gang and resume point, and why earlier attempts failed.
void AppendAttemptLines(const v1::Job& job, std::string& out) {
  if (job.attempt() > 0) {
    absl::StrAppend(&out, "  attempt ", job.attempt());
    if (job.worker_ids_size() > 0) {
      absl::StrAppend(&out, " on ", absl::StrJoin(job.worker_ids(), ", "));
    }
    if (job.result().resumed_from_step() > 0) {
      absl::StrAppend(&out, ", resumed from the checkpoint at step ",
                      job.result().resumed_from_step());
    }
    absl::StrAppend(&out, "\n");
  }
  for (const std::string& f : job.result().failed_attempts()) {
    absl::StrAppend(&out, "  failed ", f, "\n");
  }
}

// A running job's progress, energy so far and time left.
void AppendProgressLines(const v1::Job& job, std::string& out) {
  const v1::JobSpec& s = job.spec();
  if (job.state() == v1::JOB_STATE_RUNNING && job.progress().epoch() == 0) {
    absl::StrAppend(&out, "  starting: loading data and connecting the ranks\n");
  } else if (job.state() == v1::JOB_STATE_RUNNING) {
    const v1::JobProgress& p = job.progress();
    absl::StrAppend(&out, absl::StrFormat(
        "  epoch %d/%d, step %d/%d, %.0f samples/s, loss %.4f", p.epoch(), s.epochs(),
        p.step(), p.steps_per_epoch() * s.epochs(), p.samples_per_second(), p.loss()));
    if (p.test_accuracy() >= 0) absl::StrAppend(&out, absl::StrFormat(", test accuracy %.4f", p.test_accuracy()));
    if (!p.transport().empty()) {
      absl::StrAppend(&out, ", synchronising over ",
                      p.transport() == "shm" ? "shared memory" : p.transport());
    }
    if (p.phase() == v1::JOB_PHASE_EVALUATION) absl::StrAppend(&out, "; evaluating now");
    if (p.phase() == v1::JOB_PHASE_CHECKPOINT) absl::StrAppend(&out, "; writing a checkpoint now");
    if (p.phase() == v1::JOB_PHASE_STAGING) absl::StrAppend(&out, "; staging its data now");
    absl::StrAppend(&out, "\n");
    if (const std::string left = TimeLeft(job); !left.empty()) {
      absl::StrAppend(&out, absl::StrFormat("  %.0f s elapsed, %s\n", p.elapsed_seconds(), left));
    }
    if (p.has_straggler()) {
      absl::StrAppend(&out, "  straggler (", p.straggler().cause(), "): ", p.straggler().text(),
                      "\n");
    }
    if (p.job_energy_joules() > 0 || p.energy_joules() > 0) {
      absl::StrAppend(&out, absl::StrFormat(
          "  energy so far: %.1f J, every rank and attempt (rank 0: %.1f J, %.1f W)%s\n",
          std::max(p.job_energy_joules(), p.energy_joules()), p.energy_joules(),
          p.power_watts(), p.energy_estimated() ? " (estimated)" : ""));
    }
  }
}

// The budget, and what an ended job did and spent.
void AppendEndLines(const v1::Job& job, std::string& out) {
  const v1::JobSpec& s = job.spec();
  if (!job.store_error().empty()) {
    absl::StrAppend(&out, "  not yet stored: ", job.store_error(),
                    " (shown as the coordinator holds it; a restart before it is stored "
                    "brings back the stored state)\n");
  }
  if (s.energy_budget_joules() > 0) {
    // The coordinator's one figure (energy_report.h JobJoulesSoFar), live or ended.
    const v1::JobProgress& p = job.progress();
    absl::StrAppend(&out, absl::StrFormat("  energy budget %.0f J: %.1f J, %.1f%% used%s\n",
                                          s.energy_budget_joules(), p.job_energy_joules(),
                                          100 * p.energy_budget_used(),
                                          job.state() == v1::JOB_STATE_BUDGET_EXCEEDED
                                              ? " (stopped at its budget, after a checkpoint)"
                                          : p.energy_budget_used() >= 0.9
                                              ? " (warning: 90% reached)"
                                              : ""));
  }
  if (IsTerminal(job.state()) && job.state() != v1::JOB_STATE_SUCCEEDED &&
      JobJoulesSoFar(job.result().energy()) > 0) {
    const v1::JobResult& r = job.result();
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  before it ended: %d samples, %d %s, test accuracy %s; energy %.1f J%s, %.4f "
            "device-hours (details: joule report %d)\n",
            r.samples(), r.steps(), job.spec().algorithm() == "ga" ? "generations" : "steps",
            r.test_accuracy() > 0 ? absl::StrFormat("%.4f", r.test_accuracy()) : std::string("-"),
            JobJoulesSoFar(r.energy()), r.energy().estimated() ? " (estimated)" : "",
            r.energy().device_hours(), job.id()));
  }
  if (IsTerminal(job.state()) && job.result().has_straggler()) {
    absl::StrAppend(&out, "  straggler (", job.result().straggler().cause(),
                    "): ", job.result().straggler().text(), "\n");
  }
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    const v1::JobResult& r = job.result();
    absl::StrAppend(
        &out, absl::StrFormat("  test accuracy %.4f (loss %.4f); %d samples, %d %s; train %.2f s "
                              "(%.0f samples/s); wall %.2f s\n",
                              r.test_accuracy(), r.test_loss(), r.samples(), r.steps(),
                              job.spec().algorithm() == "ga" ? "generations" : "steps",
                              r.train_seconds(), r.samples_per_second(), r.wall_seconds()));
    const v1::EnergyReport& e = r.energy();
    // Beside the grid's figure the constant one says it is a constant.
    const std::string constant =
        job.carbon().source().empty()
            ? ""
            : absl::StrFormat(" at a constant %.0f g/kWh", e.grid_gco2_per_kwh());
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  energy %.1f J (%.6f kWh%s), %.2f W average, %.4f device-hours, %.1f samples/J, "
            "%.2f g CO2%s (details: joule report %d)\n",
            e.total_joules(), e.kwh(), e.estimated() ? ", estimated" : "", e.average_watts(),
            e.device_hours(), e.samples_per_joule(), e.co2_grams(), constant, job.id()));
    if (const v1::CarbonAccount& c = job.carbon(); !c.source().empty()) {
      absl::StrAppend(&out, absl::StrFormat("  CO2 over the run %.2f g at the grid's intensity "
                                            "(mean %.0f g/kWh)",
                                            c.grams(), c.mean_gco2_per_kwh()));
      if (c.grams_at_submit() > 0) {
        absl::StrAppend(
            &out, absl::StrFormat(
                      "; %.2f g had it started at submit (%.2f g %s)", c.grams_at_submit(),
                      std::abs(c.grams_at_submit() - c.grams()),
                      c.grams() <= c.grams_at_submit() ? "saved by waiting" : "more by waiting"));
      }
      absl::StrAppend(&out, "\n");
    }
    for (const v1::RankResult& rr : r.ranks()) {
      absl::StrAppend(&out, absl::StrFormat("  rank %d on %s: parameters %s, %d samples\n",
                                            rr.rank(), rr.worker_id(), rr.parameter_hash(),
                                            rr.samples()));
    }
  }
}

}  // namespace

std::string JobDetails(const v1::Job& job) {
  const v1::JobSpec& s = job.spec();
  std::string out;
  absl::StrAppend(&out, "job ", job.id(), s.name().empty() ? "" : " (" + s.name() + ")", ": ",
                  JobStateName(job.state()), "\n");
  if (!job.reason().empty()) {
    absl::StrAppend(&out, "  ", job.state() == v1::JOB_STATE_PENDING ? "" : "reason: ",
                    job.reason(), "\n");
  }
  AppendSpecLines(job, out);
  AppendAttemptLines(job, out);
  AppendProgressLines(job, out);
  AppendEndLines(job, out);
  return out;
}

std::string BlasLabel(const v1::BlasInfo& b) {
  if (b.library().empty()) return "-";
  return absl::StrCat(b.library(), b.core().empty() ? "" : " " + b.core(),
                      b.threads() > 0 ? absl::StrCat(" x", b.threads()) : "",
                      b.fallback() ? " (fallback)" : "",
                      b.sgemm_ok() || b.sgemm_gflops() == 0 ? "" : " (sgemm check FAILED)");
}

}  // namespace joule::client
