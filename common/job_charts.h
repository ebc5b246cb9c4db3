#ifndef JOULE_COMMON_JOB_CHARTS_H_
#define JOULE_COMMON_JOB_CHARTS_H_
// The charts of a job, defined once: Vega-Lite specs (https://vega.github.io/vega-lite/,
// schema v6) with their data inline, drawn by vega-embed in the HTML report
// (client/html_report.h) and in the web UI's job page (server/web_ui.cc, which serves them
// at /api/jobs/ID/charts). Pure functions; thread-compatible.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/v1/job.pb.h"

namespace joule {

struct Chart {
  std::string id;       // [a-z0-9-]: the element it is drawn into
  std::string title;
  std::string caption;  // one line under the chart (what is drawn, what is estimated)
  nlohmann::json spec;  // a Vega-Lite spec with its data inline
};

// The building blocks every chart uses: a spec of the common size holding `values`, an
// axis (field, Vega-Lite type, title), and a count axis (integer ticks only).
nlohmann::json ChartSpec(const nlohmann::json& values);
nlohmann::json ChartAxis(const std::string& field, const std::string& type,
                         const std::string& title);
nlohmann::json ChartCountAxis(const std::string& field, const std::string& title);

// A job's charts, those with data, in this order:
//   "power-by-rank": watts against seconds since the attempt started, one step line per
//     rank (each point holds the average of the interval before it). From `live_power`
//     when given (a running attempt's, Coordinator::JobPower), else the last attempt's
//     RankPower in the job's result.
//   "energy-by-phase": joules by training phase, bars, every rank of the last attempt
//     (left out while an attempt runs: the result's records are an earlier attempt's);
//   "loss-by-epoch": training loss (mean over the epoch's steps on rank 0) and test loss;
//   "accuracy-by-epoch": test accuracy, with the time and energy spent by then.
std::vector<Chart> JobCharts(const v1::Job& job,
                             const std::vector<v1::RankPower>* live_power = nullptr);

}  // namespace joule

#endif  // JOULE_COMMON_JOB_CHARTS_H_
