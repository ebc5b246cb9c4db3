#include "common/job_charts.h"

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
  return Chart{"power-by-rank", "Power over time by rank",
               absl::StrCat("Average power of each interval between the ranks' progress "
                            "reports, attempt ",
                            attempt,
                            estimated ? "; estimated (CPU time x watts per core), not metered"
                                      : ""),
               spec};
}

}  // namespace

json ChartSpec(const json& values) {
  return {{"$schema", kSchema},
          {"width", kChartWidth},
          {"height", kChartHeight},
          {"data", {{"values", values}}}};
}

json ChartAxis(const std::string& field, const std::string& type, const std::string& title) {
  return {{"field", field}, {"type", type}, {"title", title}};
}

json ChartCountAxis(const std::string& field, const std::string& title) {
  json a = ChartAxis(field, "quantitative", title);
  a["axis"] = {{"tickMinStep", 1}, {"format", "d"}};
  return a;
}

std::vector<Chart> JobCharts(const v1::Job& job, const std::vector<v1::RankPower>* live_power) {
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
    // A regression's epochs carry its test RMSE, drawn where a classification's accuracy is.
    bool regression = false;
    for (const v1::EpochRecord& h : r.history()) regression = regression || h.has_test_rmse();
    const std::string figure = regression ? "test RMSE" : "test accuracy";
    json loss = json::array(), accuracy = json::array();
    for (const v1::EpochRecord& h : r.history()) {
      if (h.train_loss() >= 0) {  // -1: no training step of it ran in the attempt
        loss.push_back({{"epoch", h.epoch()}, {"series", "train loss"}, {"loss", h.train_loss()}});
      }
      loss.push_back({{"epoch", h.epoch()}, {"series", "test loss"}, {"loss", h.test_loss()}});
      accuracy.push_back({{"epoch", h.epoch()},
                          {"accuracy", regression ? h.test_rmse() : h.test_accuracy()},
                          {"joules", h.joules()},
                          {"seconds", h.elapsed_seconds()}});
    }
    json spec = ChartSpec(loss);
    spec["mark"] = {{"type", "line"}, {"point", true}};
    spec["encoding"] = {
        {"x", ChartAxis("epoch", "ordinal", "epoch")},
        {"y", ChartAxis("loss", "quantitative",
                        regression ? "loss (mean squared error)" : "loss (cross-entropy)")},
        {"color", ChartAxis("series", "nominal", "")}};
    charts.push_back({"loss-by-epoch", "Loss by epoch",
                      "Training loss: mean over the epoch's steps on rank 0; test loss: after "
                      "the epoch",
                      spec});
    json acc = ChartSpec(accuracy);
    acc["mark"] = {{"type", "line"}, {"point", true}};
    acc["encoding"] = {{"x", ChartAxis("epoch", "ordinal", "epoch")},
                       {"y",
                        {{"field", "accuracy"},
                         {"type", "quantitative"},
                         {"title", figure},
                         {"scale", {{"zero", false}}}}},
                       {"tooltip", json::array({ChartAxis("epoch", "ordinal", "epoch"),
                                                ChartAxis("accuracy", "quantitative", figure),
                                                ChartAxis("seconds", "quantitative", "seconds"),
                                                ChartAxis("joules", "quantitative", "joules")})}};
    charts.push_back({"accuracy-by-epoch",
                      regression ? "Test RMSE by epoch" : "Test accuracy by epoch",
                      "After each epoch; the hover shows the time and energy spent by then", acc});
  }
  return charts;
}

}  // namespace joule
