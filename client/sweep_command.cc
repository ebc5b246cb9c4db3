// `joule sweep run FILE` and `joule sweep status NAME` (client/sweep.h has the sweep file).
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/carbon_flags.h"
#include "client/cli.h"
#include "client/estimate.h"
#include "client/html_report.h"
#include "client/job_client.h"
#include "client/sweep_file.h"
#include "common/atomic_file.h"
#include "common/job_spec.h"
#include "common/names.h"
#include "common/sweep_format.h"

namespace joule::client {
namespace {

struct SweepFlags {
  std::string file, name, format = "table", out, html;
  std::vector<std::string> sets, grids;  // --set FIELD=VALUE, --grid AXIS=[...]
  bool dry_run = false;
  int poll_ms = 2000;
  int concurrency = 0;  // 0: the sweep file's (which defaults to all at once)
  double timeout_s = 0;  // 0: wait as long as the jobs take
  // How long a cell that the registered workers cannot run waits for more to register
  // before it is left out (reported "not run").
  double wait_workers_s = 30;
  CarbonFlags carbon;  // for every cell
};

// Every job of sweep `name` (label sweep=NAME), oldest first.
absl::StatusOr<std::vector<v1::Job>> SweepJobs(JobClient& client, const std::string& name) {
  v1::ListJobsRequest request;
  (*request.mutable_labels())["sweep"] = name;
  absl::StatusOr<std::vector<v1::Job>> all = ListAllJobs(client, std::move(request), SIZE_MAX);
  if (!all.ok()) return all.status();
  std::vector<v1::Job> jobs;
  for (v1::Job& j : *all) {  // a coordinator older than the label filter sends every job
    auto it = j.spec().labels().find("sweep");
    if (it != j.spec().labels().end() && it->second == name) jobs.push_back(std::move(j));
  }
  std::reverse(jobs.begin(), jobs.end());
  return jobs;
}

// Prints the table (or CSV/JSON, to --out or stdout) and the fit of energy against
// device-hours over the sweep's succeeded jobs.
int PrintResults(const std::vector<v1::Job>& jobs, const SweepFlags& f) {
  const SweepAnalysis analysis = AnalyseSweep(jobs);
  const std::vector<SweepRow>& rows = analysis.rows;
  const absl::StatusOr<LineFit>& fit = analysis.fit;
  const absl::StatusOr<LinearFit>& slope_model = analysis.slope_model;
  const bool estimated = analysis.estimated;
  if (!f.html.empty()) {
    std::string name = f.name;
    for (const v1::Job& j : jobs) {
      auto it = j.spec().labels().find("sweep");
      if (name.empty() && it != j.spec().labels().end()) name = it->second;
    }
    absl::Status w = WriteHtmlFile(
        f.html, SweepHtml(name, jobs, rows, fit.ok() ? &*fit : nullptr,
                          slope_model.ok() ? &*slope_model : nullptr));
    if (!w.ok()) {
      std::cerr << "error: sweep: " << w.message() << "\n";
      return kExitFailed;
    }
    std::cerr << "wrote " << f.html << "\n";
  }
  std::string text;
  if (f.format == "csv") {
    text = SweepCsv(rows);
  } else if (f.format == "json") {
    text = SweepJson(rows, fit.ok() ? &*fit : nullptr, slope_model.ok() ? &*slope_model : nullptr);
  } else {
    text = SweepTable(rows);
  }
  if (!f.out.empty() && f.out != "-") {  // "-": standard output, as without --out
    if (absl::Status w = WriteFileAtomically(f.out, text); !w.ok()) {
      std::cerr << "error: sweep: " << w.message() << "\n";
      return kExitFailed;
    }
  } else {
    std::cout << text;
  }
  if (f.format == "table") {
    if (fit.ok()) {
      std::cout << "energy vs device-hours: " << LineFitText(*fit) << "\n";
      if (slope_model.ok()) {
        std::cout << "J per device-hour = "
                  << LinearFitText(*slope_model,
                                   {"x samples/device-hour", "x updates/device-hour"})
                  << "\n";
      } else {
        std::cout << "J per device-hour vs samples and updates per device-hour: no fit ("
                  << slope_model.status().message() << ")\n";
      }
      if (estimated) {
        std::cout << "note: energy is `estimated` (CPU time x watts per core): the fit tests "
                     "the estimator, not the hardware\n";
      }
    } else {
      std::cout << "energy vs device-hours: no fit (" << fit.status().message() << ")\n";
    }
  }
  return kExitOk;
}

// --dry-run: the cells, each with its predicted cost where the coordinator answers and
// has the history for it (joule estimate), and the total.
// The workers registered now, by device kind.
absl::StatusOr<std::map<v1::DeviceKind, int>> RegisteredWorkers(JobClient& client) {
  absl::StatusOr<v1::ListWorkersResponse> resp = client.ListWorkers();
  if (!resp.ok()) return absl::UnavailableError(resp.status().message());
  std::map<v1::DeviceKind, int> out;
  for (const v1::WorkerInfo& w : resp->workers()) ++out[w.device_kind()];
  return out;
}

// Why `cell` cannot run on `workers` (empty: it can, or the workers are unknown).
std::string CellUnrunnable(const SweepCell& cell,
                           const absl::StatusOr<std::map<v1::DeviceKind, int>>& workers) {
  if (!workers.ok()) return "";
  v1::JobSpec spec = cell.spec;
  if (!NormalizeAndValidateSpec(spec).ok()) return "";  // checked when the sweep was read
  return UnrunnableReason(spec, *workers);
}

int PrintDryRun(const GlobalOptions& g, const std::vector<SweepCell>& cells) {
  // The predicted cost, where the coordinator answers and has the history for it.
  JobClient client = JobClient::ForCoordinator(g);
  const std::string& address = client.address();
  const absl::StatusOr<std::vector<v1::Job>> history = FinishedJobs(client);
  const absl::StatusOr<std::map<v1::DeviceKind, int>> workers = RegisteredWorkers(client);
  int unrunnable = 0;
  double seconds = 0, joules = 0, device_hours = 0;
  int estimated = 0;
  std::string why_not;
  for (const SweepCell& c : cells) {
    // A cell is submitted as written (its request id hashes that); the coordinator fills
    // its defaults, the derived batch size among them: shown and estimated as it will run.
    v1::JobSpec spec = c.spec;
    if (absl::Status s = NormalizeAndValidateSpec(spec); !s.ok()) {
      std::cout << absl::StrFormat("%4d r%-2d %s: invalid: %s\n", c.index, c.repeat, c.key,
                                   s.message());
      continue;
    }
    std::string cost;
    if (const std::string why = UnrunnableReason(spec, workers.ok() ? *workers
                                                                    : std::map<v1::DeviceKind, int>{});
        workers.ok() && !why.empty()) {
      cost = "  cannot run: " + why;
      ++unrunnable;
    } else if (history.ok()) {
      absl::StatusOr<JobEstimate> e = EstimateJob(spec, *history);
      if (e.ok()) {
        cost = absl::StrFormat("  ~%.1f s, %.4f device-hours, %.1f J%s", e->wall_seconds,
                               e->device_hours, e->joules,
                               e->extrapolation.empty() ? "" : " (extrapolated)");
        seconds += e->wall_seconds;
        joules += e->joules;
        device_hours += e->device_hours;
        ++estimated;
      } else if (why_not.empty()) {
        why_not = std::string(e.status().message());
      }
    }
    std::cout << absl::StrFormat("%4d r%-2d %s (workers %d, global batch %d, local batch %d)%s\n",
                                 c.index, c.repeat, c.key, spec.workers(),
                                 spec.global_batch_size(), spec.local_batch_size(), cost);
  }
  std::cout << cells.size() << " jobs";
  if (unrunnable > 0) {
    std::cout << " (" << unrunnable << " of them cannot run on the workers registered now: "
              << "`sweep run` leaves them out)";
  }
  if (estimated > 0) {
    std::cout << absl::StrFormat(
        "; predicted for %d of them (joule estimate): %.1f s of jobs, %.4f device-hours, "
        "%.1f J",
        estimated, seconds, device_hours, joules);
  }
  std::cout << "\n";
  if (!history.ok()) {
    std::cout << "no predicted cost: the coordinator at " << address
              << " did not answer (" << history.status().message() << ")\n";
  } else if (estimated < static_cast<int>(cells.size()) && !why_not.empty()) {
    std::cout << "no predicted cost for some cells: " << why_not << "\n";
  }
  return kExitOk;
}

// The jobs of a sweep run: submits its cells in order, at most `limit` not ended at once
// (0: all), and follows their states. Not thread-safe.
class SweepJobsInFlight {
 public:
  SweepJobsInFlight(JobClient& client, const std::vector<SweepCell>& cells, int limit)
      : client_(client), cells_(cells), limit_(limit), jobs_(cells.size()) {}

  // Submits cells while fewer than `limit` submitted jobs are known not to have ended (a
  // job just submitted counts as running until a poll says otherwise; an existing one, a
  // re-run's, is looked up so that an ended one frees its place at once). Returns an exit
  // code (the RPC error reported).
  // `workers`: the workers registered now; the next cell they cannot run waits (later cells
  // behind it) for up to `wait` from when it began to wait, then is left out and reported
  // as not run.
  int SubmitMore(const absl::StatusOr<std::map<v1::DeviceKind, int>>& workers,
                 std::chrono::duration<double> wait) {
    size_t in_flight = 0;
    for (size_t i = 0; i < ids_.size(); ++i) in_flight += Done(i) ? 0 : 1;
    while (ids_.size() < cells_.size() &&
           (limit_ == 0 || in_flight < static_cast<size_t>(limit_))) {
      const SweepCell& c = cells_[ids_.size()];
      if (const std::string why = CellUnrunnable(c, workers); !why.empty()) {
        const auto now = std::chrono::steady_clock::now();
        if (blocked_cell_ != ids_.size()) {  // this cell begins to wait now
          blocked_cell_ = ids_.size();
          blocked_since_ = now;
        }
        if (now - blocked_since_ < wait) break;
        not_run_.push_back(absl::StrCat("cell ", c.key, " (repeat ", c.repeat, "): not run: ",
                                        why));
        std::cerr << "\n" << not_run_.back() << "\n";
        ids_.push_back(0);  // no job
        continue;
      }
      v1::SubmitJobRequest req;
      *req.mutable_spec() = c.spec;
      req.set_request_id(c.request_id);  // a re-run gets the same job back
      if (DropPassedCarbonDeadline(absl::ToUnixMillis(absl::Now()), req.mutable_spec())) {
        std::cerr << "\ncell " << c.key << " (repeat " << c.repeat
                  << "): the carbon-aware deadline has passed; submitted to start when it can\n";
      }
      absl::StatusOr<v1::SubmitJobResponse> resp = client_.Submit(req);
      if (!resp.ok()) return client_.Report("sweep: submit " + c.key, resp.status());
      slot_[resp->job_id()] = ids_.size();
      ids_.push_back(resp->job_id());
      if (resp->existing()) {
        ++existing_;
        absl::StatusOr<v1::Job> got = client_.GetJob(resp->job_id());
        if (got.ok()) jobs_[ids_.size() - 1] = *got;
        if (got.ok() && IsTerminal(got->state())) continue;
      }
      ++in_flight;
    }
    return kExitOk;
  }

  // Takes the states of the sweep's jobs (one ListJobs of the label sweep=NAME).
  absl::Status Refresh(const std::string& name) {
    absl::StatusOr<std::vector<v1::Job>> listed = SweepJobs(client_, name);
    if (!listed.ok()) return listed.status();
    for (v1::Job& j : *listed) {
      if (auto it = slot_.find(j.id()); it != slot_.end()) jobs_[it->second] = std::move(j);
    }
    return absl::OkStatus();
  }

  // Cells whose job ended or that were left out.
  size_t Ended() const {
    size_t done = 0;
    for (size_t i = 0; i < ids_.size(); ++i) done += Done(i) ? 1 : 0;
    return done;
  }
  // Whether the next cell to submit waits for workers (the registered cannot run it).
  bool Waiting(const absl::StatusOr<std::map<v1::DeviceKind, int>>& workers) const {
    return ids_.size() < cells_.size() && !CellUnrunnable(cells_[ids_.size()], workers).empty();
  }

  // The jobs not ended, and the cells not submitted, a line each.
  void PrintPending(std::ostream& out) const {
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (Done(i)) continue;
      out << "  job " << ids_[i] << ": " << JobStateName(jobs_[i].state())
          << (jobs_[i].reason().empty() ? "" : ": " + jobs_[i].reason()) << "\n";
    }
    if (ids_.size() < cells_.size()) {
      out << "  " << cells_.size() - ids_.size() << " cells not submitted (concurrency "
          << limit_ << ")\n";
    }
  }

  // The jobs of the cells submitted.
  std::vector<v1::Job> jobs() const {
    std::vector<v1::Job> out;
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] != 0) out.push_back(jobs_[i]);
    }
    return out;
  }
  const std::vector<std::string>& not_run() const { return not_run_; }
  int existing() const { return existing_; }

 private:
  bool Done(size_t i) const { return ids_[i] == 0 || IsTerminal(jobs_[i].state()); }

  JobClient& client_;
  const std::vector<SweepCell>& cells_;
  const int limit_;
  std::vector<int64_t> ids_;      // of the cells submitted so far, in order
  std::vector<v1::Job> jobs_;     // by cell
  std::map<int64_t, size_t> slot_;
  std::vector<std::string> not_run_;
  size_t blocked_cell_ = SIZE_MAX;  // the cell waiting for workers, and since when
  std::chrono::steady_clock::time_point blocked_since_;
  int existing_ = 0;
};

// The carbon flags `cmd` was given, on every cell (+DURATION counted once for all).
absl::Status ApplyCarbonToCells(const CarbonFlags& f, const CLI::App& cmd,
                                std::vector<SweepCell>& cells) {
  const absl::Time now = absl::Now();
  for (SweepCell& c : cells) {
    if (absl::Status s = ApplyCarbonFlags(f, cmd, &c.spec, now); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Each carbon-aware cell without a run length plans for its estimate's upper bound (one
// history for all); INVALID_ARGUMENT naming the cell where there is none to give.
absl::Status FillCarbonRuns(JobClient& client, std::vector<SweepCell>& cells) {
  if (std::none_of(cells.begin(), cells.end(), [](const SweepCell& c) {
        return c.spec.carbon_aware() && !(c.spec.expected_run_seconds() > 0);
      })) {
    return absl::OkStatus();
  }
  const absl::StatusOr<std::vector<v1::Job>> history = FinishedJobs(client);
  for (SweepCell& c : cells) {
    if (absl::Status s = FillCarbonRun(history, &c.spec); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cell ", c.key, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

int SweepRun(const GlobalOptions& g, const SweepFlags& f, const CLI::App& cmd) {
  absl::StatusOr<SweepDefinition> sweep = LoadSweepFile(f.file);
  if (sweep.ok()) {
    if (absl::Status s = OverrideSweep(*sweep, f.sets, f.grids); !s.ok()) sweep = s;
  }
  if (!sweep.ok()) {
    std::cerr << "error: " << sweep.status().message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<std::vector<SweepCell>> cells = ExpandSweep(*sweep);
  if (cells.ok()) {
    if (absl::Status s = ApplyCarbonToCells(f.carbon, cmd, *cells); !s.ok()) cells = s;
  }
  if (!cells.ok()) {
    std::cerr << "error: " << cells.status().message() << "\n";
    return kExitUsage;
  }
  if (f.dry_run) {
    std::cout << "sweep " << sweep->name << ": " << cells->size() << " cells x repeats\n";
    return PrintDryRun(g, *cells);
  }
  JobClient client = JobClient::ForCoordinator(g);
  if (absl::Status s = FillCarbonRuns(client, *cells); !s.ok()) {
    std::cerr << "error: sweep: " << s.message() << "\n";
    return kExitUsage;
  }
  const std::string& address = client.address();
  const int limit = f.concurrency > 0 ? f.concurrency : sweep->concurrency;  // 0: all at once
  // A cell the registered workers cannot run waits --wait-workers seconds for more to
  // register, then is left out and reported, not submitted to wait for ever (issue 23: the
  // client hung); the rest runs and tabulates.
  const size_t total = cells->size();
  SweepJobsInFlight run(client, *cells, limit);
  const std::chrono::duration<double> wait_workers(f.wait_workers_s);
  absl::StatusOr<std::map<v1::DeviceKind, int>> workers = RegisteredWorkers(client);
  if (int rc = run.SubmitMore(workers, wait_workers); rc != kExitOk) return rc;
  std::cerr << absl::StrFormat("sweep %s: %d jobs%s\n", sweep->name, total,
                               limit > 0 ? absl::StrFormat(", %d at a time", limit) : "");
  // Poll the sweep's jobs a page of ListJobs at a time (not a GetJob per job); a sweep
  // that runs its jobs a few at a time polls more often, so the next starts soon.
  const int poll_ms = limit > 0 ? std::min(f.poll_ms, 250) : f.poll_ms;
  const bool tty = isatty(STDERR_FILENO) == 1;
  const auto start = std::chrono::steady_clock::now();
  for (size_t shown = SIZE_MAX;;) {
    if (absl::Status s = run.Refresh(sweep->name); !s.ok()) {
      std::cerr << "error: sweep: " << address << ": " << s.message() << "\n";
      return kExitUnavailable;
    }
    workers = RegisteredWorkers(client);
    if (int rc = run.SubmitMore(workers, wait_workers); rc != kExitOk) return rc;
    const size_t done = run.Ended();
    if (done != shown) {  // a line per change; on a terminal, one line rewritten
      std::cerr << absl::StrFormat("%ssweep %s: %d/%d jobs ended%s", tty ? "\r" : "",
                                   sweep->name, done, total, tty ? "" : "\n")
                << std::flush;
      shown = done;
    }
    if (done == total) break;
    if (f.timeout_s > 0 && std::chrono::steady_clock::now() - start >
                               std::chrono::duration<double>(f.timeout_s)) {
      if (tty) std::cerr << "\n";
      std::cerr << "error: sweep " << sweep->name << ": " << total - done
                << " jobs not ended after --timeout " << f.timeout_s
                << " s (the submitted keep running; `joule sweep status` follows them):\n";
      run.PrintPending(std::cerr);
      return kExitFailed;
    }
    // Waiting for workers: a short poll, so that the grace ends on time.
    std::this_thread::sleep_for(
        std::chrono::milliseconds(run.Waiting(workers) ? std::min(poll_ms, 250) : poll_ms));
  }
  if (tty) std::cerr << "\n";
  const size_t with_job = run.jobs().size();
  std::cerr << absl::StrFormat("sweep %s: %d jobs (%d submitted, %d already there%s)\n",
                               sweep->name, total, with_job - run.existing(), run.existing(),
                               run.not_run().empty()
                                   ? ""
                                   : absl::StrFormat(", %d not run", run.not_run().size()));
  int failed = 0;
  for (const v1::Job& j : run.jobs()) {
    if (j.state() == v1::JOB_STATE_SUCCEEDED) continue;
    ++failed;
    auto cell = j.spec().labels().find("cell");
    std::cerr << "job " << j.id() << " ("
              << (cell == j.spec().labels().end() ? "no cell label" : cell->second) << "): "
              << JobStateName(j.state()) << ": " << j.reason() << "\n";
  }
  for (const std::string& line : run.not_run()) std::cerr << line << "\n";
  const std::vector<v1::Job> jobs = run.jobs();
  const int rc = jobs.empty() ? kExitOk : PrintResults(jobs, f);
  return failed > 0 || !run.not_run().empty() ? kExitFailed : rc;
}

int SweepStatus(const GlobalOptions& g, const SweepFlags& f) {
  JobClient client = JobClient::ForCoordinator(g);
  absl::StatusOr<std::vector<v1::Job>> jobs = SweepJobs(client, f.name);
  if (!jobs.ok()) {
    std::cerr << "error: sweep status: " << client.address() << ": " << jobs.status().message() << "\n";
    return kExitUnavailable;
  }
  if (jobs->empty()) {
    std::cerr << "error: no job of sweep '" << f.name << "'\n";
    return kExitFailed;
  }
  std::map<std::string, int> states;
  for (const v1::Job& j : *jobs) ++states[JobStateName(j.state())];
  std::cerr << "sweep " << f.name << ": " << jobs->size() << " jobs:";
  for (const auto& [state, n] : states) std::cerr << " " << n << " " << state;
  std::cerr << "\n";
  return PrintResults(*jobs, f);
}

}  // namespace

void AddSweepCommands(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<SweepFlags>();
  KeepAlive(f);
  CLI::App* sweep = app.add_subcommand("sweep", "scaling sweeps: run a grid of jobs, tabulate and fit them");
  sweep->require_subcommand(1);
  auto output = [&f](CLI::App* c) {
    c->add_option("-o,--output", f->format, "table (default), csv or json")
        ->check(CLI::IsMember({"table", "csv", "json"}));
    c->add_option("--out", f->out, "write the table/CSV/JSON to this file instead of stdout");
    c->add_option("--html", f->html,
                  "also write a self-contained HTML report (energy vs device-hours with the "
                  "fit, speedup and efficiency, accuracy vs global batch, average power, energy per "
                  "sample)");
  };
  CLI::App* run = sweep->add_subcommand(
      "run", "submit every cell of a sweep file (again: the same jobs, none twice), wait, "
             "print the table and the energy fit");
  run->add_option("file", f->file,
                  "sweep file (YAML: name, base, grid, repeats, preset, concurrency)")
      ->required();
  run->add_option("--concurrency", f->concurrency,
                  "jobs of the sweep at once (1: one after another, for timings on a shared "
                  "host); default: the file's concurrency, else all at once")
      ->check(CLI::Range(1, 1000));
  run->add_flag("--dry-run", f->dry_run, "print the cells; submit nothing");
  run->add_option("--set", f->sets,
                  "FIELD=VALUE: replace a field of the base (nested ones dotted: "
                  "augment.size=32), to run the file shrunk; repeatable")
      ->expected(1)
      ->take_all();
  run->add_option("--grid", f->grids,
                  "AXIS=[V1, V2, ...]: replace the values of one of the grid's axes; repeatable")
      ->expected(1)
      ->take_all();
  run->add_option("--wait-workers", f->wait_workers_s,
                  "seconds a cell the registered workers cannot run waits for more to register "
                  "before it is left out and reported as not run")
      ->capture_default_str();
  run->add_option("--timeout", f->timeout_s,
                  "seconds to wait for the jobs (default: as long as they take); on expiry "
                  "exit 1 naming the jobs still pending or running")
      ->check(CLI::NonNegativeNumber);
  AddCarbonFlags(run, &f->carbon, "every cell");
  output(run);
  run->callback([&g, f, rc, run] { *rc = SweepRun(g, *f, *run); });
  CLI::App* status = sweep->add_subcommand("status", "a sweep's jobs, table and fit so far");
  status->add_option("name", f->name, "the sweep's name")->required();
  output(status);
  status->callback([&g, f, rc] { *rc = SweepStatus(g, *f); });
  CLI::App* report = sweep->add_subcommand(
      "report", "a sweep's table and fit, and with --html FILE its plots (as status)");
  report->add_option("name", f->name, "the sweep's name")->required();
  output(report);
  report->callback([&g, f, rc] { *rc = SweepStatus(g, *f); });
}

}  // namespace joule::client
