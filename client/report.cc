// `joule report ID`: a job's energy account as a table, JSON or CSV.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/cli.h"
#include "client/html_report.h"
#include "client/job_client.h"
#include "client/job_format.h"
#include "common/energy_report.h"
#include "common/json_output.h"
#include "common/names.h"

namespace joule::client {
namespace {

// The job's figures: state, time, accuracy, counts, device-hours, energy and CO2, budget.
void PrintSummary(const v1::Job& job) {
  const v1::JobResult& r = job.result();
  const v1::EnergyReport& e = r.energy();
  const char* est = e.estimated() ? " (estimated)" : "";
  std::cout << absl::StrFormat("job %d%s: %s\n", job.id(),
                               job.spec().name().empty() ? "" : " (" + job.spec().name() + ")",
                               JobStateName(job.state()));
  if (!job.reason().empty()) std::cout << "  reason: " << job.reason() << "\n";
  // A genetic algorithm's steps are generations, not gradient updates.
  const bool ga = job.spec().algorithm() == "ga";
  std::cout << absl::StrFormat(
      "  wall time            %10.2f s\n"
      "  test accuracy        %10s\n"
      "  samples              %10d\n"
      "  %-19s %10d\n"
      "  devices              %10d\n"
      "  device-hours         %10.6f\n"
      "  energy               %10.1f J  = %.6f kWh%s\n"
      "  average power        %10.2f W\n"
      "  energy/device-hour   %10.1f J\n"
      "  samples per joule    %10.2f\n"
      "  %-19s %10.0f\n"
      "  CO2                  %10.3f g  (at a constant %.0f gCO2/kWh)\n",
      r.wall_seconds(),
      // No evaluation ran (a job that failed or was cancelled before its first epoch ended).
      r.test_accuracy() > 0 ? absl::StrFormat("%.4f", r.test_accuracy()) : std::string("-"),
      r.samples(), ga ? "generations" : "gradient updates", r.steps(), e.devices(),
      e.device_hours(), JobJoulesSoFar(e), JobJoulesSoFar(e) / 3.6e6, est, e.average_watts(),
      e.joules_per_device_hour(), e.samples_per_joule(),
      ga ? "generations/dev-hour" : "updates/device-hour", e.updates_per_device_hour(),
      e.co2_grams(), e.grid_gco2_per_kwh());
  if (const v1::CarbonAccount& c = job.carbon(); !c.source().empty()) {
    // The grid's intensity over the run (issue 31), where the coordinator has a source.
    const double all = JobJoulesSoFar(e);
    std::cout << absl::StrFormat(
        "  CO2 over the run     %10.3f g  (mean %.0f gCO2/kWh of %s; %.0f%% of the energy "
        "covered)\n",
        c.grams(), c.mean_gco2_per_kwh(), c.source(),
        all > 0 ? 100 * std::min(1.0, c.joules_covered() / all) : 0.0);
    if (c.grams_at_submit() > 0) {
      std::cout << absl::StrFormat("  CO2 had it run at submit %6.3f g  (%+.3f g by waiting)\n",
                                   c.grams_at_submit(), c.grams() - c.grams_at_submit());
    }
  }
  if (job.spec().carbon_aware()) {
    const v1::CarbonPlan& p = job.carbon_plan();
    std::cout << absl::StrFormat(
        "  carbon-aware start   planned %s%s (forecast %.0f g/kWh; %.0f at submit)%s\n",
        absl::FormatTime("%Y-%m-%d %H:%M UTC", absl::FromUnixMillis(p.planned_start_unix_ms()),
                         absl::UTCTimeZone()),
        p.region().empty() ? std::string() : absl::StrCat(" in region ", p.region()),
        p.planned_gco2_per_kwh(), p.now_gco2_per_kwh(),
        p.note().empty() ? std::string() : absl::StrCat("; ", p.note()));
  }
  if (job.spec().top_k() > 0) {
    std::cout << absl::StrFormat(
        "  test top-%-2d accuracy %10s\n", job.spec().top_k(),
        r.test_top_k_accuracy() >= 0 ? absl::StrFormat("%.4f", r.test_top_k_accuracy())
                                     : std::string("-"));
  }
  if (const double budget = job.spec().energy_budget_joules(); budget > 0) {
    const double spent = JobJoulesSoFar(e);
    std::cout << absl::StrFormat("  energy budget        %10.1f J  spent %.1f J, %.1f%%%s\n",
                                 budget, spent, 100 * spent / budget,
                                 spent > budget
                                     ? absl::StrFormat(" (%.1f J over: what the ranks spent "
                                                       "while they stopped)",
                                                       spent - budget)
                                     : "");
  }
}

// By epoch, and the time and energy to each target. `train_split`: the job evaluated its
// training split too (JobSpec.evaluate_train): its accuracy (a regression's loss) is a
// column. A regression (its epochs carry a test RMSE) shows the RMSE where a
// classification shows accuracy.
void PrintEpochs(const v1::JobResult& r, bool train_split) {
  if (r.history_size() == 0) return;
  bool regression = false;
  for (const v1::EpochRecord& h : r.history()) regression = regression || h.has_test_rmse();
  std::cout << "  by epoch:           time s     energy J  train loss "
            << (regression ? "test rmse" : " test acc") << "  test loss        lr"
            << (train_split ? (regression ? " train eval" : "  train acc") : "") << "\n";
  // Accuracies to 4 decimals; a regression's RMSE and losses to 4 significant digits.
  auto figure = [regression](double v) {
    if (v < 0) return std::string("-");
    return regression ? absl::StrFormat("%.4g", v) : absl::StrFormat("%.4f", v);
  };
  for (const v1::EpochRecord& h : r.history()) {
    std::cout << absl::StrFormat("    %-12d %12.2f %12.1f %11.4f %9s %10.4g %9s", h.epoch(),
                                 h.elapsed_seconds(), h.joules(), h.train_loss(),
                                 figure(regression ? h.test_rmse() : h.test_accuracy()),
                                 h.test_loss(), h.lr() > 0 ? absl::StrFormat("%.4g", h.lr()) : "-");
    if (train_split) {
      std::cout << absl::StrFormat(" %10s",
                                   figure(regression ? h.train_eval_loss() : h.train_accuracy()));
    }
    std::cout << "\n";
  }
  if (r.to_accuracy_size() == 0) return;
  std::cout << "  to target (the first epoch end at or past it; Zeus's TTA/ETA):\n";
  for (const v1::AccuracyTarget& t : r.to_accuracy()) {
    if (t.reached()) {
      std::cout << absl::StrFormat("    %-28s %12.2f s %12.1f J  (epoch %d)\n", TargetLabel(t),
                                   t.seconds(), t.joules(), t.epoch());
    } else {
      std::cout << absl::StrFormat("    %-28s not reached\n", TargetLabel(t));
    }
  }
}

// Who waited on whom: each rank's step, its wait at the allreduce, its links; the straggler.
void PrintRankTiming(const v1::JobResult& r) {
  bool timed = false;
  for (const v1::RankResult& rank : r.ranks()) timed |= rank.step_seconds() > 0;
  if (timed) {
    std::cout << "  timing by rank (means per step; the rank that waits least is the one the "
                 "others wait on):\n";
    std::cout << absl::StrFormat("    %-6s %12s %12s %12s  %s\n", "rank", "step s", "wait s",
                                 "compute s", "links received, MB/s");
    for (const v1::RankResult& rank : r.ranks()) {
      std::string links;
      for (const v1::LinkThroughput& l : rank.links()) {
        absl::StrAppend(&links, links.empty() ? "" : ", ", "from ", l.peer(), " ",
                        absl::StrFormat("%.1f", l.megabytes_per_second()));
      }
      std::cout << absl::StrFormat("    %-6d %12.4f %12.4f %12.4f  %s\n", rank.rank(),
                                   rank.step_seconds(), rank.collective_wait_seconds(),
                                   rank.step_seconds() - rank.collective_wait_seconds(),
                                   links.empty() ? "-" : links);
    }
  }
  if (r.has_straggler()) {
    std::cout << "  straggler (" << r.straggler().cause() << "): " << r.straggler().text()
              << "\n";
  }
}

// The energy by rank, device, source and phase.
// Wall energy from the nodes' BMCs beside the components' over the same ranks and
// intervals, and what no component accounts for (fans, PSU losses, NICs, disks); a note
// when the components exceed the node (a metering fault on one side).
void PrintNodeEnergy(const v1::EnergyReport& e) {
  if (e.node_joules() <= 0) return;
  const double gap = e.node_joules() - e.node_component_joules();
  std::cout << "  whole node (BMC), " << e.node_ranks()
            << " rank(s) metered in the last attempt:\n";
  std::cout << absl::StrFormat("    %-22s %12.2f J\n", "node", e.node_joules());
  std::cout << absl::StrFormat("    %-22s %12.2f J %6.1f%%\n", "components",
                               e.node_component_joules(),
                               100.0 * e.node_component_joules() / e.node_joules());
  std::cout << absl::StrFormat("    %-22s %12.2f J %6.1f%%\n", "node, not in any component", gap,
                               100.0 * gap / e.node_joules());
  if (!e.node_source().empty()) std::cout << "    (" << e.node_source() << ")\n";
  if (!e.node_split().empty()) {
    std::cout << "    the node's energy split between the host's workers by " << e.node_split()
              << "\n";
  }
  // Split by component energy, a job's share of the node holds its components whenever the
  // node holds the host's; split by CPU time, a GPU job's components (charged whole) may
  // exceed its share of the node with both meters right.
  bool gpu = false;
  for (const v1::EnergyRecord& r : e.records()) gpu |= absl::StartsWith(r.device(), "gpu");
  const bool comparable = e.node_split() == "component energy" || !gpu;
  if (comparable && gap < -0.05 * e.node_joules()) {
    std::cout << "  warning: the components read more than the whole node: one of the meters "
                 "is wrong (a BMC reading averaged over a long window, or a component counted "
                 "twice)\n";
  }
}

// Sources read side by side over the same intervals: the one charged against the one
// standing by (NVML's counter against its power integral; RAPL against the estimate).
void PrintCrossChecks(const v1::EnergyReport& e) {
  if (e.cross_checks().empty()) return;
  std::cout << "  cross-checks (two sources over the same intervals):\n";
  for (const v1::EnergyCrossCheck& c : e.cross_checks()) {
    const double diff = c.reference_joules() > 0
                            ? 100.0 * (c.joules() - c.reference_joules()) / c.reference_joules()
                            : 0;
    std::cout << absl::StrFormat("    %-10s %12.2f J against %-10s %12.2f J: %+.2f%%\n", c.source(),
                                 c.joules(), c.reference_source(), c.reference_joules(), diff);
  }
}

void PrintEnergyBreakdown(const v1::EnergyReport& e) {
  for (const char* key : {"rank", "device", "source", "phase"}) {
    std::cout << "  by " << key << ":\n";
    for (const auto& [k, joules] : EnergyBy(e, key)) {
      const double pct = e.total_joules() > 0 ? 100.0 * joules / e.total_joules() : 0;
      std::cout << absl::StrFormat("    %-22s %12.2f J %6.1f%%\n", k, joules, pct);
    }
  }
  PrintNodeEnergy(e);
  PrintCrossChecks(e);
}

// The BLAS each rank's GEMMs ran on (ranks grouped by it), and a warning for a fallback.
void PrintBlas(const v1::JobResult& r) {
  std::map<std::string, std::vector<int>> ranks_by_blas;
  for (const v1::RankResult& rank : r.ranks()) {
    if (!rank.blas().library().empty())
      ranks_by_blas[BlasLabel(rank.blas())].push_back(rank.rank());
  }
  for (const auto& [label, ranks] : ranks_by_blas) {
    std::cout << "  blas: " << label << " on rank" << (ranks.size() > 1 ? "s " : " ")
              << absl::StrJoin(ranks, ",") << "\n";
  }
  for (const v1::RankResult& rank : r.ranks()) {
    if (!rank.blas().fallback()) continue;
    std::cout << absl::StrFormat(
        "  warning: rank %d ran its GEMMs on %s %s, narrower than its CPU's vectors (%s): "
        "slower than it could be (%s; joule-worker --blas-info)\n",
        rank.rank(), rank.blas().library(), rank.blas().core(), rank.blas().cpu_model(),
        rank.blas().choice());
  }
}

// What the figures cover and what they do not.
void PrintNotes(const v1::Job& job) {
  const v1::JobResult& r = job.result();
  const v1::EnergyReport& e = r.energy();
  if (e.earlier_attempts_joules() > 0) {
    std::cout << absl::StrFormat(
        "  note: %.1f J of the total were spent by %d earlier, failed attempt(s); the "
        "breakdowns cover the last attempt\n",
        e.earlier_attempts_joules(), r.failed_attempts_size());
  }
  if (job.attempt() == 0) {
    std::cout << "  note: the job never ran (it ended while pending): nothing was trained or "
                 "spent\n";
  } else if (e.unreported_joules() > 0) {
    std::cout << absl::StrFormat(
        "  note: the energy covers %d of %d ranks' results, and %.1f J the others' last "
        "progress reports gave (their results replace it as they arrive)\n",
        e.ranks_reported(), e.ranks_expected(), e.unreported_joules());
  } else if (e.ranks_reported() < e.ranks_expected()) {
    std::cout << "  note: the energy covers " << e.ranks_reported() << " of "
              << e.ranks_expected() << " ranks (the others have not reported)\n";
  }
  if (e.estimated()) {
    const double est = EnergyBy(e, "source")["estimated"];
    std::cout << absl::StrFormat(
        "  note: %.1f%% of the energy is `estimated` (CPU time x watts per busy core), not a "
        "meter reading\n",
        e.total_joules() > 0 ? 100.0 * est / e.total_joules() : 100.0);
  }
  if (EnergyBy(e, "phase").count("idle") > 0) {
    std::cout << "  note: phase `idle` is energy drawn while no training phase ran (start-up, "
                 "waiting), not idle power\n";
  }
  PrintBlas(r);
  for (const std::string& w : e.warnings()) std::cout << "  warning: " << w << "\n";
}

}  // namespace

void PrintJobReport(const v1::Job& job) {
  PrintSummary(job);
  PrintEpochs(job.result(), job.spec().evaluate_train());
  PrintRankTiming(job.result());
  PrintEnergyBreakdown(job.result().energy());
  PrintNotes(job);
}

namespace {

void PrintCsv(const v1::Job& job) {
  std::cout << "job,rank,device,source,phase,joules\n";
  for (const v1::EnergyRecord& rec : job.result().energy().records()) {
    std::cout << absl::StrFormat("%d,%d,%s,%s,%s,%.6f\n", job.id(), rec.rank(), rec.device(),
                                 rec.source(), rec.phase(), rec.joules());
  }
}

int Report(const GlobalOptions& g, int64_t id, const std::string& format,
           const std::string& html) {
  JobClient client = JobClient::ForCoordinator(g);
  absl::StatusOr<v1::Job> got = client.GetJob(id);
  if (!got.ok()) return client.Report("report", got.status());
  const v1::Job& job = *got;
  if (!IsTerminal(job.state())) {
    std::cerr << "error: report: job " << id << " is " << JobStateName(job.state())
              << "; its report is written when it ends (live energy: joule status " << id
              << ")\n";
    return kExitFailed;
  }
  if (!html.empty()) {
    if (absl::Status w = WriteHtmlFile(html, JobHtml(job)); !w.ok()) {
      std::cerr << "error: report: " << w.message() << "\n";
      return kExitFailed;
    }
    std::cerr << "wrote " << html << "\n";
    return kExitOk;
  }
  if (format == "json") {
    // The whole job, as `status -o json` prints it: one record, every field (issue 23: a
    // copy of some fields left attempt, times, submitter and gang zeroed here).
    std::cout << JsonText(ProtoToJson(job));
  } else if (format == "csv") {
    PrintCsv(job);
  } else {
    PrintJobReport(job);
  }
  return kExitOk;
}

}  // namespace

void AddReportCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  auto id = std::make_shared<int64_t>(0);
  auto format = std::make_shared<std::string>("table");
  CLI::App* cmd = app.add_subcommand(
      "report", "a finished job's time, accuracy and energy (by rank, device, source, phase)");
  cmd->add_option("id", *id, "job id")->required();
  cmd->add_option("-o,--output,--format", *format, "table, json or csv")
      ->check(CLI::IsMember({"table", "json", "csv"}))
      ->capture_default_str();
  auto html = std::make_shared<std::string>();
  cmd->add_option("--html", *html,
                  "write a self-contained HTML page (power by rank, energy by phase, loss and "
                  "accuracy by epoch) to this file instead");
  cmd->callback([&g, id, format, html, rc] { *rc = Report(g, *id, *format, *html); });
}

}  // namespace joule::client
