// `joule tune FILE` and `joule tune status NAME`: the search of common/tune_search.h run on
// the coordinator, rung by rung. Each rung of a cell is a job (labels tune=NAME, cell=KEY,
// rung=R; request id tune/NAME/DIGEST/rung-R) that starts from the cell's previous rung's
// checkpoint (JobSpec.resume_from_job), so a promoted cell goes on and nothing is trained
// twice; the decisions are a function of the jobs' results, so re-running the command
// after the client or the coordinator died submits nothing already submitted and takes
// the search up where it stopped.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/carbon_flags.h"
#include "client/cli.h"
#include "client/estimate.h"
#include "client/html_report.h"
#include "client/job_client.h"
#include "client/spec_file.h"
#include "client/tune_file.h"
#include "client/tune_plan.h"
#include "common/atomic_file.h"
#include "common/job_spec.h"
#include "common/json_output.h"
#include "common/names.h"
#include "common/sweep_charts.h"

namespace joule::client {
namespace {

struct TuneFlags {
  std::string file, name, format = "table", choice, html;
  bool dry_run = false;
  int poll_ms = 2000;
  std::string reconnect_for = "5m";  // how long an unreachable coordinator is waited for
  CarbonFlags carbon;                // for every job of the search
};

// Every job of tune `name` by (cell, rung).
absl::StatusOr<std::map<std::pair<std::string, int>, v1::Job>> TuneJobs(JobClient& client,
                                                                        const std::string& name) {
  v1::ListJobsRequest request;
  (*request.mutable_labels())["tune"] = name;
  absl::StatusOr<std::vector<v1::Job>> all = ListAllJobs(client, std::move(request), SIZE_MAX);
  if (!all.ok()) return all.status();
  std::map<std::pair<std::string, int>, v1::Job> jobs;
  for (v1::Job& j : *all) {
    const auto& labels = j.spec().labels();
    auto tune = labels.find("tune"), cell = labels.find("cell"), rung = labels.find("rung");
    int r = 0;
    if (tune == labels.end() || tune->second != name || cell == labels.end() ||
        rung == labels.end() || !absl::SimpleAtoi(rung->second, &r)) {
      continue;
    }
    jobs[{cell->second, r}] = std::move(j);
  }
  return jobs;
}

// The cell's history over its rungs 0..last (TuneCellsFromJobs of those rungs' jobs).
TuneCell CellHistory(const std::string& key, int last,
                     const std::map<std::pair<std::string, int>, v1::Job>& jobs) {
  std::vector<v1::Job> rungs;
  for (int r = 0; r <= last; ++r) {
    auto it = jobs.find({key, r});
    if (it == jobs.end()) break;
    rungs.push_back(it->second);
  }
  std::map<std::string, TuneCell> cells = TuneCellsFromJobs(rungs);
  auto it = cells.find(key);
  if (it != cells.end()) return it->second;
  TuneCell none;
  none.key = key;
  return none;
}

std::string Unit(const TuneOptions& o) {
  return o.objective == TuneObjective::kTimeToAccuracy ? "s" : "J";
}

class TuneRun {
 public:
  // `cmd`: the command whose carbon flags (TuneFlags::carbon) were given, or null.
  TuneRun(JobClient& client, const TuneDefinition& tune, const TuneFlags& flags,
          double reconnect_seconds, const CLI::App* cmd)
      : client_(client),
        tune_(tune),
        flags_(flags),
        reconnect_seconds_(reconnect_seconds),
        cmd_(cmd) {}

  // Runs (or, with `submit` false, reads) the search; prints each rung and the outcome.
  int Run(bool submit) {
    writes_choice_ = submit;
    absl::StatusOr<std::vector<SweepCell>> cells = ExpandSweep(tune_.sweep);
    if (!cells.ok()) {
      std::cerr << "error: tune: " << cells.status().message() << "\n";
      return kExitUsage;
    }
    const absl::Time now = absl::Now();  // +DURATION deadlines: one instant for all
    for (SweepCell& c : *cells) {
      if (cmd_ != nullptr) {
        if (absl::Status s = ApplyCarbonFlags(flags_.carbon, *cmd_, &c.spec, now); !s.ok()) {
          std::cerr << "error: tune: " << s.message() << "\n";
          return kExitUsage;
        }
      }
      cells_[c.key] = c;
    }
    const TuneOptions& o = tune_.options;
    const std::vector<int> rungs = RungEpochs(o);
    std::vector<std::string> active;
    for (const SweepCell& c : *cells) active.push_back(c.key);
    std::cout << absl::StrFormat(
        "tune %s: %d cells, rungs at %s epochs, minimizing %s to test accuracy %.4f\n", Name(),
        active.size(), absl::StrJoin(rungs, ", "), ObjectiveName(), o.target_accuracy);
    if (flags_.dry_run) {
      // The file is checked; the plan only where the coordinator answers at once.
      absl::StatusOr<std::map<std::pair<std::string, int>, v1::Job>> jobs =
          TuneJobs(client_, Name());
      if (!jobs.ok()) {
        std::cout << "estimator: no plan (" << client_.address() << ": " << jobs.status().message()
                  << ")\n";
        return kExitOk;
      }
      jobs_ = *std::move(jobs);
      PlanFirstRung(active);
      return kExitOk;
    }
    if (int rc = Refresh(); rc != kExitOk) return rc;
    active = PlanFirstRung(active);
    std::vector<TuneCell> finished;
    for (size_t r = 0; r < rungs.size() && !active.empty(); ++r) {
      if (int rc = Refresh(); rc != kExitOk) return rc;
      if (submit) {
        if (int rc = SubmitRung(static_cast<int>(r), rungs[r], active); rc != kExitOk) return rc;
        if (int rc = WaitRung(static_cast<int>(r), active); rc != kExitOk) return rc;
      } else if (!RungEnded(static_cast<int>(r), active)) {
        std::cout << absl::StrFormat("rung %d (%d epochs): not ended yet\n", r, rungs[r]);
        break;
      }
      std::vector<TuneCell> ran;
      for (const std::string& key : active) ran.push_back(CellHistory(key, r, jobs_));
      const TuneRungDecision d = DecideRung(ran, o, finished);
      PrintRung(static_cast<int>(r), rungs[r], ran, d);
      for (const TuneCell& c : ran) {
        if (std::find(d.finished.begin(), d.finished.end(), c.key) != d.finished.end()) {
          finished.push_back(c);
        }
      }
      active = d.promoted;
      if (tune_.search_budget_joules > 0 && Spent() >= tune_.search_budget_joules) {
        std::cout << absl::StrFormat("the search budget (%.0f J) is spent: no further rung\n",
                                     tune_.search_budget_joules);
        break;
      }
    }
    return PrintOutcome();
  }

 private:
  std::string Name() const { return tune_.sweep.name; }

  // The estimator's forecast for one cell from `history` (client/estimate.h).
  TuneCellForecast Forecast(const std::string& key, const std::vector<v1::Job>& history) const {
    TuneCellForecast f;
    f.key = key;
    v1::JobSpec spec = cells_.at(key).spec;
    if (absl::Status s = NormalizeAndValidateSpec(spec); !s.ok()) {
      f.unknown_why = std::string(s.message());
      return f;
    }
    const auto estimate = [&](int epochs) {
      spec.set_epochs(epochs);
      return EstimateJob(spec, history);
    };
    absl::StatusOr<JobEstimate> one = estimate(1);
    absl::StatusOr<JobEstimate> rung = estimate(tune_.options.min_epochs);
    absl::StatusOr<JobEstimate> full = estimate(tune_.options.max_epochs);
    if (!one.ok() || !rung.ok() || !full.ok()) {
      f.unknown_why = std::string((!one.ok()    ? one.status()
                                   : !rung.ok() ? rung.status()
                                                : full.status())
                                      .message());
      return f;
    }
    f.known = true;
    f.first_epoch_seconds = one->wall_seconds;
    f.first_epoch_seconds_ci95 = one->wall_ci95;
    f.first_rung_seconds = rung->wall_seconds;
    f.first_rung_joules = rung->joules;
    f.first_rung_joules_ci95 = rung->joules_ci95;
    f.full_joules = full->joules;
    return f;
  }

  // The first rung's cells in the order they are submitted, without those the estimator
  // skips (client/tune_plan.h). Its history is the coordinator's succeeded jobs less this
  // search's own, and, once the first rung has been submitted, less those that ended after
  // it was: a run of the command again plans the same rung. A cell already submitted is
  // never skipped. Without history (or a coordinator that cannot list it) the grid's order.
  std::vector<std::string> PlanFirstRung(const std::vector<std::string>& keys) {
    using History = std::vector<v1::Job>;
    // Patiently, unless a dry run: a plan made without history would differ from the
    // first run's.
    absl::StatusOr<History> finished =
        flags_.dry_run ? FinishedJobs(client_)
                       : Patiently<History>(
                             [this]() -> absl::StatusOr<History> { return FinishedJobs(client_); });
    if (!finished.ok()) {
      std::cerr << "tune " << Name() << ": no estimates (" << finished.status().message()
                << "): the first rung runs in the grid's order\n";
      return keys;
    }
    int64_t first_submit = 0;
    for (const auto& [at, j] : jobs_) {
      if (at.second != 0) continue;
      if (first_submit == 0 || j.created_unix_ms() < first_submit)
        first_submit = j.created_unix_ms();
    }
    std::vector<v1::Job> history;
    for (v1::Job& j : *finished) {
      auto tune = j.spec().labels().find("tune");
      if (tune != j.spec().labels().end() && tune->second == Name()) continue;
      if (first_submit > 0 && j.finished_unix_ms() >= first_submit) continue;
      history.push_back(std::move(j));
    }
    std::vector<TuneCellForecast> forecasts;
    for (const std::string& key : keys) {
      forecasts.push_back(Forecast(key, history));
      forecasts_[key] = forecasts.back();
    }
    TuneFirstRungPlan plan =
        PlanFirstTuneRung(forecasts, tune_.options, tune_.search_budget_joules);
    std::vector<std::string> order;
    for (const std::string& key : plan.order) order.push_back(key);
    for (const std::string& key : keys) {
      if (plan.skipped.count(key) > 0 && jobs_.count({key, 0}) > 0) {
        plan.skipped.erase(key);  // submitted by an earlier run: it stays in the search
        order.push_back(key);
      }
    }
    const size_t known = static_cast<size_t>(std::count_if(
        forecasts.begin(), forecasts.end(), [](const TuneCellForecast& f) { return f.known; }));
    if (known == 0) {
      std::cout << "estimator: no history for these cells ("
                << (forecasts.empty() ? "" : forecasts.front().unknown_why)
                << "): the first rung runs in the grid's order\n";
    } else {
      std::cout << absl::StrFormat(
          "estimator: %d of %d cells estimated from %d finished jobs; the first rung runs "
          "cheapest first\n",
          known, forecasts.size(), history.size());
    }
    for (const std::string& key : order) {
      const TuneCellForecast& f = forecasts_.at(key);
      if (!f.known) continue;
      std::cout << absl::StrFormat("  %-44s first rung ~%.4g J, ~%.3g s\n", key,
                                   f.first_rung_joules, f.first_rung_seconds);
    }
    for (const auto& [key, why] : plan.skipped) {
      std::cout << absl::StrFormat("  skipped %s: %s\n", key, why);
    }
    skipped_ = std::move(plan.skipped);
    return order;
  }

  const char* ObjectiveName() const {
    switch (tune_.options.objective) {
      case TuneObjective::kEnergyToAccuracy:
        return "energy";
      case TuneObjective::kTimeToAccuracy:
        return "time";
      case TuneObjective::kEnergy:
        return "the whole training's energy, reaching";
    }
    return "";
  }

  // `call` again while the coordinator cannot be reached (it restarts, or a standby takes
  // over), for up to --reconnect-for, saying so once: a search of hours outlives a
  // coordinator's restart. Every call the search makes is safe to repeat (reads, and
  // submits with request ids).
  template <typename T>
  absl::StatusOr<T> Patiently(const std::function<absl::StatusOr<T>()>& call) {
    const auto since = std::chrono::steady_clock::now();
    bool said = false;
    for (;;) {
      absl::StatusOr<T> answer = call();
      const bool unreachable = !answer.ok() && (absl::IsUnavailable(answer.status()) ||
                                                absl::IsDeadlineExceeded(answer.status()));
      if (!unreachable || std::chrono::steady_clock::now() - since >=
                              std::chrono::duration<double>(reconnect_seconds_)) {
        if (said && answer.ok()) {
          std::cerr << "tune " << Name() << ": the coordinator answers again\n";
        }
        return answer;
      }
      if (!said) {
        std::cerr << absl::StrFormat(
            "tune %s: the coordinator cannot be reached (%s); trying again for up to %.0f s\n",
            Name(), answer.status().message(), reconnect_seconds_);
        said = true;
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }

  int Refresh() {
    using Jobs = std::map<std::pair<std::string, int>, v1::Job>;
    absl::StatusOr<Jobs> jobs =
        Patiently<Jobs>([this]() -> absl::StatusOr<Jobs> { return TuneJobs(client_, Name()); });
    if (!jobs.ok()) return client_.Report("tune", jobs.status());
    jobs_ = *std::move(jobs);
    return kExitOk;
  }

  // Joules of every job of the search so far (ended jobs' reports, running ones' progress).
  double Spent() const {
    double joules = 0;
    for (const auto& [at, j] : jobs_) joules += j.progress().job_energy_joules();
    return joules;
  }

  int SubmitRung(int rung, int epochs, const std::vector<std::string>& keys) {
    const double left = tune_.search_budget_joules > 0 ? tune_.search_budget_joules - Spent() : 0;
    int submitted = 0;
    std::optional<absl::StatusOr<std::vector<v1::Job>>> history;  // for carbon-aware runs
    for (const std::string& key : keys) {
      if (jobs_.count({key, rung}) > 0) continue;  // submitted before this run
      // The file's concurrency: at most that many of the search's jobs at once (1: one
      // after another, for times that do not share the host).
      while (tune_.sweep.concurrency > 0 && Unfinished() >= tune_.sweep.concurrency) {
        std::this_thread::sleep_for(std::chrono::milliseconds(flags_.poll_ms));
        if (int rc = Refresh(); rc != kExitOk) return rc;
      }
      const SweepCell& cell = cells_.at(key);
      v1::SubmitJobRequest req;
      v1::JobSpec& spec = *req.mutable_spec() = cell.spec;
      auto& labels = *spec.mutable_labels();
      labels.erase("sweep");
      labels.erase("repeat");
      labels["tune"] = Name();
      labels["rung"] = absl::StrCat(rung);
      labels["tune_minimize"] = TuneObjectiveName(tune_.options.objective);
      labels["tune_epochs"] = absl::StrCat(tune_.options.max_epochs);
      spec.set_name(absl::StrCat(Name(), "/", key, "/rung-", rung));
      spec.set_epochs(epochs);
      spec.set_keep_model(true);  // the next rung starts from its last checkpoint
      if (spec.target_accuracy() == 0) spec.set_target_accuracy(tune_.options.target_accuracy);
      if (rung > 0) spec.set_resume_from_job(jobs_.at({key, rung - 1}).id());
      // The search budget left, shared by this rung's jobs (each stops at its share).
      if (tune_.search_budget_joules > 0) {
        spec.set_energy_budget_joules(std::max(1.0, left / keys.size()));
      }
      if (DropPassedCarbonDeadline(absl::ToUnixMillis(absl::Now()), &spec)) {
        std::cerr << key << " rung " << rung
                  << ": the carbon-aware deadline has passed; submitted to start when it can\n";
      }
      if (spec.carbon_aware() && !(spec.expected_run_seconds() > 0)) {
        // The rung's run (its epochs) by the estimate's upper bound.
        if (!history) history = FinishedJobs(client_);
        if (absl::Status s = FillCarbonRun(*history, &spec); !s.ok()) {
          std::cerr << "error: tune: " << key << " rung " << rung << ": " << s.message() << "\n";
          return kExitUsage;
        }
      }
      const std::vector<std::string> parts = absl::StrSplit(cell.request_id, '/');
      req.set_request_id(absl::StrCat(
          "tune/", Name(), "/", parts.size() >= 3 ? parts[parts.size() - 2] : key, "/rung-", rung));
      absl::StatusOr<v1::SubmitJobResponse> resp = Patiently<v1::SubmitJobResponse>(
          [&]() -> absl::StatusOr<v1::SubmitJobResponse> { return client_.Submit(req); });
      if (!resp.ok()) return client_.Report("tune: submit " + key, resp.status());
      ++submitted;
      if (tune_.sweep.concurrency > 0) {
        if (int rc = Refresh(); rc != kExitOk) return rc;
      }
    }
    if (submitted > 0) {
      std::cerr << absl::StrFormat("tune %s: rung %d: submitted %d job(s) of %d epochs\n", Name(),
                                   rung, submitted, epochs);
    }
    return Refresh();
  }

  int Unfinished() const {
    int n = 0;
    for (const auto& [at, j] : jobs_) n += IsTerminal(j.state()) ? 0 : 1;
    return n;
  }

  bool RungEnded(int rung, const std::vector<std::string>& keys) const {
    for (const std::string& key : keys) {
      auto it = jobs_.find({key, rung});
      if (it == jobs_.end() || !IsTerminal(it->second.state())) return false;
    }
    return true;
  }

  int WaitRung(int rung, const std::vector<std::string>& keys) {
    while (!RungEnded(rung, keys)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(flags_.poll_ms));
      if (int rc = Refresh(); rc != kExitOk) return rc;
    }
    return kExitOk;
  }

  void PrintRung(int rung, int epochs, const std::vector<TuneCell>& ran,
                 const TuneRungDecision& d) const {
    const TuneOptions& o = tune_.options;
    std::cout << absl::StrFormat("rung %d (%d epochs):\n", rung, epochs);
    std::cout << absl::StrFormat("  %-44s %8s %12s %10s  %s\n", "cell", "accuracy", "to target J",
                                 "s", "decision");
    for (const TuneCell& c : ran) {
      const TuneProjection p = ProjectToTarget(c, o);
      const double accuracy = c.epochs.empty() ? 0 : c.epochs.back().accuracy;
      std::string decision;
      if (std::find(d.promoted.begin(), d.promoted.end(), c.key) != d.promoted.end()) {
        decision = "goes on";
      } else if (std::find(d.finished.begin(), d.finished.end(), c.key) != d.finished.end()) {
        decision = absl::StrFormat("reached the target at epoch %.0f (measured)", p.epoch);
      } else if (auto it = d.stopped.find(c.key); it != d.stopped.end()) {
        decision = "stopped: " + it->second;
      }
      std::cout << absl::StrFormat(
          "  %-44s %8.4f %12s %10s  %s\n", c.key, accuracy,
          p.feasible ? absl::StrFormat("%s%.1f", p.reached ? "" : "~", p.joules) : "-",
          p.feasible ? absl::StrFormat("%s%.1f", p.reached ? "" : "~", p.seconds) : "-", decision);
    }
  }

  // The chosen cell as a job file for `joule submit -f`: the base, the cell's values, and
  // the epochs that reached the target.
  std::string ChoiceFile(const std::string& key, int epochs) const {
    YAML::Node root = YAML::Clone(tune_.sweep.base);
    for (const auto& [field, value] : cells_.at(key).values) {
      (void)SetSpecField(root, field + "=" + value);
    }
    root["epochs"] = epochs;
    root["name"] = Name() + "-choice";
    root["target_accuracy"] = absl::StrFormat("%g", tune_.options.target_accuracy);
    root.SetStyle(YAML::EmitterStyle::Block);
    YAML::Emitter out;
    out << root;
    return absl::StrCat("# joule tune ", Name(), ": the cell ", key, "\n", out.c_str(), "\n");
  }

  int PrintOutcome() {
    if (int rc = Refresh(); rc != kExitOk) return rc;
    const TuneOptions& o = tune_.options;
    std::vector<TuneCell> all;
    for (const auto& [key, cell] : cells_) {
      int last = -1;
      while (jobs_.count({key, last + 1}) > 0) ++last;
      all.push_back(CellHistory(key, last, jobs_));
    }
    const TuneOutcome out = ChooseTuneCell(all, o);
    if (!flags_.html.empty()) {
      std::vector<HtmlFact> facts = {
          {"minimizing", absl::StrFormat("%s to test accuracy %.4g", TuneObjectiveName(o.objective),
                                         o.target_accuracy)},
          {"cells", absl::StrCat(all.size())},
          {"jobs", absl::StrCat(jobs_.size())},
          {"chosen", out.chosen.empty() ? "none (no cell reached the target)" : out.chosen}};
      if (absl::Status w = WriteHtmlFile(
              flags_.html, RenderHtmlPage("tune " + Name(), facts, {}, TuneCharts(all, o)));
          !w.ok()) {
        std::cerr << "error: tune: " << w.message() << "\n";
        return kExitFailed;
      }
      std::cerr << "wrote " << flags_.html << "\n";
    }
    double spent = 0, device_hours = 0, grid = 0;
    int measured = 0;
    for (const auto& [at, j] : jobs_) {
      spent += j.result().energy().total_joules();
      device_hours += j.result().energy().device_hours();
    }
    int estimated = 0;
    for (const TuneCell& c : all) {
      const TuneProjection& p = out.projections.at(c.key);
      // A cell the estimator skipped (it never ran): the estimator's figure.
      auto f = forecasts_.find(c.key);
      if (skipped_.count(c.key) > 0 && f != forecasts_.end() && f->second.known) {
        grid += f->second.full_joules;
        ++estimated;
        continue;
      }
      grid += p.total_joules;
      measured += !c.epochs.empty() && c.epochs.back().epoch >= o.max_epochs ? 1 : 0;
    }
    nlohmann::json front = nlohmann::json::array();
    std::cout << "pareto front (time against energy to the target, measured):\n";
    for (const std::string& key : out.front) {
      const TuneProjection& p = out.projections.at(key);
      std::cout << absl::StrFormat("  %-44s %10.1f s %12.1f J  (epoch %.0f)\n", key, p.seconds,
                                   p.joules, p.epoch);
      front.push_back(
          {{"cell", key}, {"seconds", p.seconds}, {"joules", p.joules}, {"epoch", p.epoch}});
    }
    std::cout << absl::StrFormat(
        "the search: %d jobs, %.1f J, %.6f device-hours; the whole grid to %d epochs: ~%.1f J "
        "(%d of %d cells measured, %d estimated from history, the rest projected)\n",
        jobs_.size(), spent, device_hours, o.max_epochs, grid, measured, all.size(), estimated);
    if (out.chosen.empty()) {
      std::cout << "no cell reached the target: nothing to choose\n";
      return kExitFailed;
    }
    const TuneProjection& p = out.projections.at(out.chosen);
    std::cout << absl::StrFormat(
        "chosen: %s: %.1f %s to test accuracy %.4f (epoch %.0f, measured)\n", out.chosen,
        TuneScore(p, o), Unit(o), o.target_accuracy, p.epoch);
    // `tune status` writes the job file only when asked to (--choice).
    if (!writes_choice_ && flags_.choice.empty()) return kExitOk;
    const std::string path = flags_.choice.empty() ? Name() + "-choice.yaml" : flags_.choice;
    if (absl::Status w =
            WriteFileAtomically(path, ChoiceFile(out.chosen, static_cast<int>(std::ceil(p.epoch))));
        !w.ok()) {
      std::cerr << "error: tune: " << w.message() << "\n";
      return kExitFailed;
    }
    std::cout << "wrote " << path << " (joule submit -f " << path << ")\n";
    if (flags_.format == "json") {
      std::cout << nlohmann::json({{"chosen", out.chosen},
                                   {"front", front},
                                   {"search_joules", spent},
                                   {"search_device_hours", device_hours},
                                   {"grid_joules_estimated", grid},
                                   {"skipped", skipped_}})
                       .dump(2)
                << "\n";
    }
    return kExitOk;
  }

  JobClient& client_;
  const TuneDefinition& tune_;
  const TuneFlags& flags_;
  const double reconnect_seconds_;
  const CLI::App* const cmd_;  // its carbon flags apply to every job; null: none
  std::map<std::string, SweepCell> cells_;
  std::map<std::pair<std::string, int>, v1::Job> jobs_;
  std::map<std::string, TuneCellForecast> forecasts_;  // the first rung's plan's
  std::map<std::string, std::string> skipped_;         // by the estimator: key -> why
  bool writes_choice_ = true;
};

int TuneFile(const GlobalOptions& g, const TuneFlags& f, bool submit, const CLI::App* cmd) {
  absl::StatusOr<TuneDefinition> tune = LoadTuneFile(f.file);
  if (!tune.ok()) {
    std::cerr << "error: tune: " << tune.status().message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<double> reconnect = ParseDurationSeconds(f.reconnect_for);
  if (!reconnect.ok()) {
    std::cerr << "error: tune: --reconnect-for: " << reconnect.status().message() << "\n";
    return kExitUsage;
  }
  JobClient client = JobClient::ForCoordinator(g);
  TuneRun run(client, *tune, f, *reconnect, cmd);
  return run.Run(submit);
}

}  // namespace

void AddTuneCommands(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<TuneFlags>();
  KeepAlive(f);
  CLI::App* tune = app.add_subcommand(
      "tune",
      "search a grid for the configuration that reaches a target accuracy for the "
      "least energy (or time), by successive halving");
  tune->require_subcommand(1);
  CLI::App* run = tune->add_subcommand("run", "run (or continue) the search of a tune file");
  run->add_option("file", f->file,
                  "tune file (YAML: a sweep file with minimize, target_accuracy, ...)")
      ->required();
  run->add_flag("--dry-run", f->dry_run, "check the file and print the rungs; submit nothing");
  run->add_option("--choice", f->choice, "where to write the chosen job file (NAME-choice.yaml)");
  run->add_option("--html", f->html,
                  "also write a page with each cell's path and the front (Vega-Lite, offline)");
  run->add_option("-o,--output", f->format, "table (default) or json (the outcome also as JSON)")
      ->check(CLI::IsMember({"table", "json"}));
  run->add_option("--poll-ms", f->poll_ms, "how often to look at the jobs (default 2000)")
      ->check(CLI::Range(100, 60000));
  run->add_option("--reconnect-for", f->reconnect_for,
                  "how long to wait for a coordinator that cannot be reached (restarting, "
                  "failing over) before giving up: seconds, or with s, m or h (default 5m)");
  AddCarbonFlags(run, &f->carbon, "every job of the search");
  run->callback([&g, f, rc, run] { *rc = TuneFile(g, *f, /*submit=*/true, run); });
  CLI::App* status = tune->add_subcommand(
      "status", "the search's rungs and outcome so far, from its jobs (submits nothing)");
  status->add_option("file", f->file, "the tune file")->required();
  status->add_option("--choice", f->choice, "where to write the chosen job file");
  status->add_option("--html", f->html, "also write the page of the search so far");
  status->add_option("--reconnect-for", f->reconnect_for,
                     "how long to wait for a coordinator that cannot be reached (default 5m)");
  status->callback([&g, f, rc] { *rc = TuneFile(g, *f, /*submit=*/false, nullptr); });
}

}  // namespace joule::client
