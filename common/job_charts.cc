#include "common/job_charts.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/energy_report.h"

namespace joule {
namespace {

using nlohmann::json;

constexpr int kChartWidth = 640, kChartHeight = 240;
constexpr const char* kSchema = "https://vega.github.io/schema/vega-lite/v6.json";

// The power series of the job's last attempt that has one, by rank.
const v1::AttemptSummary* LastAttemptWithPower(const v1::JobResult& r) {
  for (int i = r.attempts_size() - 1; i >= 0; --i) {
    if (r.attempts(i).power_size() > 0) return &r.attempts(i);
  }
  return nullptr;
}

std::optional<Chart> PowerChart(const std::vector<v1::RankPower>& power, int32_t attempt,
                                bool estimated) {
  json values = json::array();
  for (const v1::RankPower& rp : power) {
    // Step lines hold each point's watts over the interval before it: the first interval
    // starts at 0 s.
    if (rp.samples_size() > 0) {
      values.push_back({{"rank", absl::StrCat("rank ", rp.rank())},
                        {"seconds", 0.0},
                        {"watts", rp.samples(0).watts()}});
    }
    for (const v1::PowerSample& s : rp.samples()) {
      values.push_back({{"rank", absl::StrCat("rank ", rp.rank())},
                        {"seconds", s.elapsed_seconds()},
                        {"watts", s.watts()}});
    }
  }
  if (values.empty()) return std::nullopt;
  json spec = ChartSpec(values);
  spec["mark"] = {{"type", "line"}, {"interpolate", "step-before"}};
  spec["encoding"] = {
      {"x", ChartAxis("seconds", "quantitative", "time since the attempt started (s)")},
      {"y", ChartAxis("watts", "quantitative", "power (W)")},
      {"color", ChartAxis("rank", "nominal", "rank")}};
  return Chart{
      "power-by-rank", "Power over time by rank",
      absl::StrCat("Average power of each interval between the ranks' progress "
                   "reports, attempt ",
                   attempt,
                   estimated ? "; estimated (CPU time x watts per core), not metered" : ""),
      spec};
}

// Epochs along x: ordinal (each one a tick), labels upright.
json EpochAxis() {
  json a = ChartAxis("epoch", "ordinal", "epoch");
  a["axis"] = {{"labelAngle", 0}};
  return a;
}

// The metric the job's targets are read from (JobSpec.target_metric, "" the default).
std::string TargetMetric(const v1::JobSpec& spec) {
  return spec.target_metric().empty() ? "test_accuracy" : spec.target_metric();
}

// `spec` (a single-view chart whose y field is `field`) with a dashed rule at `y` and its
// label, on the same y scale (so the domain takes the target in).
json WithTargetRule(json spec, const std::string& field, const std::string& metric, double y) {
  json marks = {{"mark", spec["mark"]}, {"encoding", spec["encoding"]}};
  spec.erase("mark");
  spec.erase("encoding");
  const json y_axis = {{"field", field}, {"type", "quantitative"}};
  json target = {
      {"data",
       {{"values",
         json::array({{{field, y}, {"label", absl::StrCat("target ", metric, " ", y)}}})}}},
      {"layer",
       json::array(
           {{{"mark", {{"type", "rule"}, {"strokeDash", {6, 4}}, {"color", "#c0392b"}}},
             {"encoding", {{"y", y_axis}}}},
            {{"mark",
              {{"type", "text"}, {"align", "left"}, {"dx", 4}, {"dy", -7}, {"color", "#c0392b"}}},
             {"encoding",
              {{"y", y_axis}, {"x", {{"value", 0}}}, {"text", {{"field", "label"}}}}}}})}};
  spec["layer"] = json::array({marks, target});
  return spec;
}

bool LossLikeTarget(const std::string& metric) {
  return metric == "test_loss" || metric == "train_eval_loss";
}

Chart LossChart(const v1::Job& job) {
  const v1::JobSpec& s = job.spec();
  bool regression = false;
  for (const v1::EpochRecord& h : job.result().history()) {
    regression = regression || h.has_test_rmse();
  }
  json loss = json::array();
  for (const v1::EpochRecord& h : job.result().history()) {
    if (h.train_loss() >= 0) {  // -1: no training step of it ran in the attempt
      loss.push_back({{"epoch", h.epoch()}, {"series", "train loss"}, {"loss", h.train_loss()}});
    }
    loss.push_back({{"epoch", h.epoch()}, {"series", "test loss"}, {"loss", h.test_loss()}});
    if (s.evaluate_train() && h.train_eval_loss() >= 0) {
      loss.push_back({{"epoch", h.epoch()},
                      {"series", "training split loss (evaluated)"},
                      {"loss", h.train_eval_loss()}});
    }
  }
  json spec = ChartSpec(loss);
  spec["mark"] = {{"type", "line"}, {"point", true}};
  spec["encoding"] = {
      {"x", EpochAxis()},
      {"y", ChartAxis("loss", "quantitative",
                      regression ? "loss (mean squared error)" : "loss (cross-entropy)")},
      {"color", ChartAxis("series", "nominal", "")}};
  const std::string metric = TargetMetric(s);
  if (LossLikeTarget(metric) && s.target_loss() > 0) {
    spec = WithTargetRule(std::move(spec), "loss", metric, s.target_loss());
  }
  return {"loss-by-epoch", "Loss by epoch",
          "Training loss: mean over the epoch's steps on rank 0; test loss: after the epoch", spec};
}

Chart AccuracyChart(const v1::Job& job) {
  const v1::JobSpec& s = job.spec();
  // A regression's epochs carry its test RMSE, drawn where a classification's accuracy is.
  bool regression = false;
  for (const v1::EpochRecord& h : job.result().history()) {
    regression = regression || h.has_test_rmse();
  }
  const std::string figure = regression ? "test RMSE" : "test accuracy";
  const std::string top_k = absl::StrCat("top-", s.top_k(), " accuracy");
  json values = json::array();
  const auto add = [&](const v1::EpochRecord& h, const std::string& series, double value) {
    values.push_back({{"epoch", h.epoch()},
                      {"series", series},
                      {"accuracy", value},
                      {"joules", h.joules()},
                      {"seconds", h.elapsed_seconds()}});
  };
  for (const v1::EpochRecord& h : job.result().history()) {
    add(h, figure, regression ? h.test_rmse() : h.test_accuracy());
    if (regression) continue;
    if (s.top_k() > 0 && h.test_top_k_accuracy() >= 0)
      add(h, "test " + top_k, h.test_top_k_accuracy());
    if (s.evaluate_train() && h.train_accuracy() >= 0) {
      add(h, "training split accuracy", h.train_accuracy());
    }
    if (s.evaluate_train() && s.top_k() > 0 && h.train_top_k_accuracy() >= 0) {
      add(h, "training split " + top_k, h.train_top_k_accuracy());
    }
  }
  json spec = ChartSpec(values);
  spec["mark"] = {{"type", "line"}, {"point", true}};
  spec["encoding"] = {
      {"x", EpochAxis()},
      {"y",
       {{"field", "accuracy"},
        {"type", "quantitative"},
        {"title", regression ? figure : "accuracy"},
        {"scale", {{"zero", false}}}}},
      {"color", ChartAxis("series", "nominal", "")},
      {"tooltip", json::array({ChartAxis("series", "nominal", "series"),
                               ChartAxis("epoch", "ordinal", "epoch"),
                               ChartAxis("accuracy", "quantitative", regression ? figure : "value"),
                               ChartAxis("seconds", "quantitative", "seconds"),
                               ChartAxis("joules", "quantitative", "joules")})}};
  const std::string metric = TargetMetric(s);
  if (metric == "test_rmse" && s.target_loss() > 0) {
    spec = WithTargetRule(std::move(spec), "accuracy", metric, s.target_loss());
  } else if (!LossLikeTarget(metric) && metric != "test_rmse" && s.target_accuracy() > 0) {
    spec = WithTargetRule(std::move(spec), "accuracy", metric, s.target_accuracy());
  }
  return {"accuracy-by-epoch", regression ? "Test RMSE by epoch" : "Accuracy by epoch",
          "After each epoch; the hover shows the time and energy spent by then", spec};
}

// The charts a job page always shows, as Chart::empty placeholders where `charts` lacks
// them, in JobCharts' order.
void AddEmptyCharts(std::vector<Chart>& charts) {
  struct Placeholder {
    const char* id;
    const char* title;
    const char* caption;
  };
  static constexpr Placeholder kAll[] = {
      {"power-by-rank", "Power over time by rank",
       "No data yet: drawn from the ranks' progress reports once the attempt runs"},
      {"energy-by-phase", "Energy by phase",
       "No data yet: drawn from the ranks' energy reports when the attempt ends"},
      {"loss-by-epoch", "Loss by epoch", "No data yet: drawn after the first epoch"},
      {"accuracy-by-epoch", "Accuracy by epoch", "No data yet: drawn after the first epoch"}};
  std::vector<Chart> all;
  for (const Placeholder& p : kAll) {
    auto it =
        std::find_if(charts.begin(), charts.end(), [&](const Chart& c) { return c.id == p.id; });
    if (it != charts.end()) {
      all.push_back(std::move(*it));
    } else {
      all.push_back({p.id, p.title, p.caption, ChartSpec(json::array()), /*empty=*/true});
    }
  }
  charts = std::move(all);
}

}  // namespace

json ChartSpec(const json& values) {
  return {{"$schema", kSchema},
          {"width", kChartWidth},
          {"height", kChartHeight},
          {"data", {{"values", values}}}};
}

std::vector<Chart> CompareCharts(const std::vector<v1::Job>& jobs) {
  json accuracy = json::array(), loss = json::array(), phases = json::array();
  bool regression = false;
  for (const v1::Job& job : jobs) {
    const std::string name =
        absl::StrCat("job ", job.id(),
                     job.spec().name().empty() ? "" : absl::StrCat(" (", job.spec().name(), ")"));
    for (const v1::EpochRecord& h : job.result().history()) {
      regression = regression || h.has_test_rmse();
      accuracy.push_back({{"job", name},
                          {"epoch", h.epoch()},
                          {"accuracy", h.has_test_rmse() ? h.test_rmse() : h.test_accuracy()},
                          {"joules", h.joules()},
                          {"seconds", h.elapsed_seconds()}});
      loss.push_back({{"job", name}, {"epoch", h.epoch()}, {"loss", h.test_loss()}});
    }
    // A running job's records are an earlier attempt's (JobCharts leaves them out too).
    if (job.state() == v1::JOB_STATE_RUNNING) continue;
    for (const auto& [phase, joules] : EnergyBy(job.result().energy(), "phase")) {
      phases.push_back({{"job", name}, {"phase", phase}, {"joules", joules}});
    }
  }
  bool classification = false;
  for (const v1::Job& job : jobs) {
    for (const v1::EpochRecord& h : job.result().history()) {
      classification = classification || !h.has_test_rmse();
    }
  }
  const std::string figure = !regression       ? "test accuracy"
                             : !classification ? "test RMSE"
                                               : "test accuracy (RMSE of a regression)";
  const json y_figure = {{"field", "accuracy"},
                         {"type", "quantitative"},
                         {"title", figure},
                         {"scale", {{"zero", false}}}};
  const json tooltip =
      json::array({ChartAxis("job", "nominal", "job"), ChartAxis("epoch", "ordinal", "epoch"),
                   ChartAxis("accuracy", "quantitative", figure),
                   ChartAxis("seconds", "quantitative", "seconds"),
                   ChartAxis("joules", "quantitative", "joules")});
  std::vector<Chart> charts;
  if (!accuracy.empty()) {
    json by_epoch = ChartSpec(accuracy);
    by_epoch["mark"] = {{"type", "line"}, {"point", true}};
    by_epoch["encoding"] = {{"x", ChartCountAxis("epoch", "epoch")},
                            {"y", y_figure},
                            {"color", ChartAxis("job", "nominal", "")},
                            {"tooltip", tooltip}};
    charts.push_back({"compare-accuracy",
                      regression ? "Test RMSE by epoch" : "Test accuracy by epoch",
                      "After each epoch", by_epoch});
    json by_energy = ChartSpec(accuracy);
    by_energy["mark"] = {{"type", "line"}, {"point", true}};
    by_energy["encoding"] = {{"x", ChartAxis("joules", "quantitative", "energy spent by then (J)")},
                             {"y", y_figure},
                             {"color", ChartAxis("job", "nominal", "")},
                             {"tooltip", tooltip}};
    charts.push_back({"compare-accuracy-by-energy",
                      regression ? "Test RMSE against energy" : "Test accuracy against energy",
                      "Each epoch's figure at the energy the job had spent by its end: the "
                      "cheapest path to an accuracy is the leftmost line",
                      by_energy});
    json loss_spec = ChartSpec(loss);
    loss_spec["mark"] = {{"type", "line"}, {"point", true}};
    loss_spec["encoding"] = {{"x", ChartCountAxis("epoch", "epoch")},
                             {"y", ChartAxis("loss", "quantitative", "test loss")},
                             {"color", ChartAxis("job", "nominal", "")}};
    charts.push_back({"compare-loss", "Test loss by epoch", "After each epoch", loss_spec});
  }
  if (!phases.empty()) {
    json spec = ChartSpec(phases);
    spec["mark"] = "bar";
    spec["encoding"] = {{"y", ChartAxis("job", "nominal", "")},
                        {"x", ChartAxis("joules", "quantitative", "energy (J)")},
                        {"color", ChartAxis("phase", "nominal", "phase")},
                        {"tooltip", json::array({ChartAxis("job", "nominal", "job"),
                                                 ChartAxis("phase", "nominal", "phase"),
                                                 ChartAxis("joules", "quantitative", "J")})}};
    charts.push_back({"compare-energy", "Energy by phase",
                      "Every rank's energy of each job's last attempt, by training phase", spec});
  }
  return charts;
}

json ChartsJson(std::vector<Chart> charts) {
  json out = json::array();
  for (Chart& chart : charts) {
    out.push_back({{"id", std::move(chart.id)},
                   {"title", std::move(chart.title)},
                   {"caption", std::move(chart.caption)},
                   {"empty", chart.empty},
                   {"spec", std::move(chart.spec)}});
  }
  return out;
}

json ChartAxis(const std::string& field, const std::string& type, const std::string& title) {
  return {{"field", field}, {"type", type}, {"title", title}};
}

json ChartCountAxis(const std::string& field, const std::string& title) {
  json a = ChartAxis(field, "quantitative", title);
  a["axis"] = {{"tickMinStep", 1}, {"format", "d"}};
  return a;
}

std::vector<Chart> JobCharts(const v1::Job& job, const std::vector<v1::RankPower>* live_power,
                             bool with_empty) {
  const v1::JobResult& r = job.result();
  std::vector<Chart> charts;
  // A running attempt's energy is estimated when its progress says so; an ended job's when
  // its report does.
  const bool estimated = live_power != nullptr
                             ? r.energy().estimated() || job.progress().energy_estimated()
                             : r.energy().estimated();
  if (live_power != nullptr) {
    if (auto c = PowerChart(*live_power, job.attempt(), estimated)) charts.push_back(*c);
  } else if (const v1::AttemptSummary* a = LastAttemptWithPower(r)) {
    const std::vector<v1::RankPower> power(a->power().begin(), a->power().end());
    if (auto c = PowerChart(power, a->attempt(), estimated)) charts.push_back(*c);
  }
  if (live_power == nullptr && r.energy().total_joules() > 0) {
    json values = json::array();
    for (const auto& [phase, joules] : EnergyBy(r.energy(), "phase")) {
      values.push_back({{"phase", phase}, {"joules", joules}});
    }
    json spec = ChartSpec(values);
    spec["mark"] = "bar";
    spec["encoding"] = {
        {"y", {{"field", "phase"}, {"type", "nominal"}, {"title", "phase"}, {"sort", "-x"}}},
        {"x", ChartAxis("joules", "quantitative", "energy (J)")}};
    charts.push_back({"energy-by-phase", "Energy by phase",
                      absl::StrCat("Every rank's energy of the last attempt by training phase",
                                   estimated ? " (estimated)" : ""),
                      spec});
  }
  if (r.history_size() > 0) {
    charts.push_back(LossChart(job));
    charts.push_back(AccuracyChart(job));
  }
  if (with_empty) AddEmptyCharts(charts);
  return charts;
}

}  // namespace joule
