#ifndef JOULE_COMMON_SWEEP_CHARTS_H_
#define JOULE_COMMON_SWEEP_CHARTS_H_
// A sweep's charts, defined once (Vega-Lite specs, as common/job_charts.h's): drawn by the
// HTML sweep report (client/html_report.h) and the web UI's sweep page (server/web_ui.cc,
// /api/sweeps/NAME). Pure functions; thread-compatible.
#include <string>
#include <vector>

#include "common/fit.h"
#include "common/job_charts.h"
#include "common/sweep_summary.h"
#include "common/tune_search.h"
#include "joule/v1/job.pb.h"

namespace joule {

// In this order, those with data: energy against device-hours for each succeeded job with
// the fitted line (if `fit`); speedup and parallel efficiency against parallelism, each
// with ideal scaling; test accuracy against global batch; energy per sample against
// workers (each series one global batch). Every grid axis a chart does not place is told
// apart by shape and dash.
std::vector<Chart> SweepPlots(const std::string& name, const std::vector<v1::Job>& jobs,
                              const std::vector<SweepRow>& rows, const LineFit* fit);

// A tune's charts (`joule tune run --html`, the web UI's tune page), those with data:
//   "tune-paths": each cell's test accuracy against the energy it had spent by then, a line
//     a cell (its rungs one after another), the target a dashed rule;
//   "tune-front": time against energy to the target of the cells that reached it
//     (measured), the Pareto front joined by a line, the chosen cell marked.
std::vector<Chart> TuneCharts(const std::vector<TuneCell>& cells, const TuneOptions& options);

}  // namespace joule

#endif  // JOULE_COMMON_SWEEP_CHARTS_H_
