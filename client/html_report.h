#ifndef JOULE_CLIENT_HTML_REPORT_H_
#define JOULE_CLIENT_HTML_REPORT_H_
// Self-contained HTML reports: one file with a summary table and plots drawn in the
// browser by Vega-Lite (vega, vega-lite and vega-embed inlined from third_party/vega: no
// network access is needed to open it). Pure functions; thread-compatible.
//
// The page's contract (tests/testing/render_html.py checks it in headless chromium):
// each plot is a <div class="joule-plot" id=ID data-title=TITLE>, rendered as SVG; once
// every plot has rendered, <body data-rendered="N"> holds their number; a plot that fails
// to render is a console error.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/job_charts.h"
#include "common/sweep_charts.h"
#include "common/sweep_format.h"
#include "joule/v1/job.pb.h"

namespace joule::client {

// A plot: the charts of common/job_charts.h.
using HtmlPlot = Chart;

// A summary row: a label and its value, as text.
using HtmlFact = std::pair<std::string, std::string>;

// The page: title, facts (a two-column table), notes (paragraphs), then the plots in order.
// Every text is HTML-escaped; JSON is embedded so that no "</script" can end its element.
std::string RenderHtmlPage(const std::string& title, const std::vector<HtmlFact>& facts,
                           const std::vector<std::string>& notes,
                           const std::vector<HtmlPlot>& plots);

// A job's plots: JobCharts (common/job_charts.h) of the job as stored, the same charts
// the web UI's job page draws.
std::vector<HtmlPlot> JobPlots(const v1::Job& job);
// The job page: JobPlots, the figures of `joule report`, its to-accuracy table.
std::string JobHtml(const v1::Job& job);

std::string SweepHtml(const std::string& name, const std::vector<v1::Job>& jobs,
                      const std::vector<SweepRow>& rows, const LineFit* fit,
                      const LinearFit* slope_model);

// Writes `html` to `path` (replacing it through a temporary file in the same directory).
// Errors: the file's, one line naming the path.
absl::Status WriteHtmlFile(const std::string& path, const std::string& html);

}  // namespace joule::client

#endif  // JOULE_CLIENT_HTML_REPORT_H_
