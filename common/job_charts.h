#ifndef JOULE_COMMON_JOB_CHARTS_H_
#define JOULE_COMMON_JOB_CHARTS_H_
// The charts of a job, defined once: Vega-Lite specs (https://vega.github.io/vega-lite/,
// schema v6) with their data inline, drawn by vega-embed in the HTML report
// (client/html_report.h) and in the web UI's job page (server/web_ui.cc, which serves them
// at /api/jobs/ID/charts). Pure functions; thread-compatible.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule {

struct Chart {
  std::string id;  // [a-z0-9-]: the element it is drawn into
  std::string title;
  std::string caption;  // one line under the chart (what is drawn, what is estimated)
  nlohmann::json spec;  // a Vega-Lite spec with its data inline
  // Nothing to draw yet (a pending job's, or the phases of a running attempt): a page
  // shows `caption` in its place. JobCharts gives such charts only when asked to.
  bool empty = false;
};

// The building blocks every chart uses: a spec of the common size holding `values`, an
// axis (field, Vega-Lite type, title), and a count axis (integer ticks only).
nlohmann::json ChartSpec(const nlohmann::json& values);
nlohmann::json ChartAxis(const std::string& field, const std::string& type,
                         const std::string& title);
nlohmann::json ChartCountAxis(const std::string& field, const std::string& title);

// A job's charts in this order, those with data (and, with `with_empty`, the others as
// Chart::empty placeholders, so that a page keeps its layout while the data comes):
//   "power-by-rank": watts against seconds since the attempt started, one step line per
//     rank (each point holds the average of the interval before it). From `live_power`
//     when given (a running attempt's, Coordinator::JobPower), else the last attempt's
//     RankPower in the job's result.
//   "energy-by-phase": joules by training phase, bars, every rank of the last attempt
//     (left out while an attempt runs: the result's records are an earlier attempt's);
//   "loss-by-epoch": training loss (mean over the epoch's steps on rank 0), test loss, and
//     the training split's evaluated loss with spec.evaluate_train; a target on one of
//     them (spec.target_metric test_loss or train_eval_loss, spec.target_loss) is a
//     dashed rule;
//   "accuracy-by-epoch": test accuracy (a regression's test RMSE), test top-k accuracy
//     with spec.top_k, the training split's with evaluate_train, with the time and energy
//     spent by then; the target (spec.target_accuracy, or target_loss for test_rmse) is a
//     dashed rule. Each figure is its own series: loss and accuracy never share an axis.
std::vector<Chart> JobCharts(const v1::Job& job,
                             const std::vector<v1::RankPower>* live_power = nullptr,
                             bool with_empty = false);

// Charts that set jobs side by side (the web UI's compare page), those with data, each
// job one series named "job ID (NAME)":
//   "compare-accuracy": test accuracy (a regression's RMSE) by epoch;
//   "compare-accuracy-by-energy": the same against the energy spent by then (J): each
//     job's energy-to-accuracy curve;
//   "compare-loss": test loss by epoch;
//   "compare-energy": each job's energy by phase (the last attempt's records), stacked.
std::vector<Chart> CompareCharts(const std::vector<v1::Job>& jobs);

// Charts as the web UI's API serves them: [{id, title, caption, empty, spec}], in order.
nlohmann::json ChartsJson(std::vector<Chart> charts);

}  // namespace joule

#endif  // JOULE_COMMON_JOB_CHARTS_H_
