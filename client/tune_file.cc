#include "client/tune_file.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/spec_file.h"
#include "common/text.h"

namespace joule::client {
namespace {

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// The value of `key` as text, or "" when absent; a mapping or list is an error.
absl::StatusOr<std::string> Scalar(const YAML::Node& root, const char* key,
                                   const std::string& source) {
  const YAML::Node v = root[key];
  if (!v) return std::string();
  if (!v.IsScalar()) return Invalid(source, absl::StrCat(key, ": a single value"));
  return v.Scalar();
}

}  // namespace

absl::StatusOr<double> ParseDurationSeconds(const std::string& text) {
  std::string t(absl::StripAsciiWhitespace(text));
  double unit = 1;
  if (!t.empty() && (t.back() == 's' || t.back() == 'm' || t.back() == 'h')) {
    unit = t.back() == 'h' ? 3600 : t.back() == 'm' ? 60 : 1;
    t.pop_back();
  }
  double value = 0;
  if (!absl::SimpleAtod(t, &value) || !std::isfinite(value) || value <= 0 ||
      value * unit > 366.0 * 24 * 3600) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", SanitizeUtf8(text, 64),
                     "\" is not a duration (seconds, or 90s, 30m, 2h; under a year)"));
  }
  return value * unit;
}

absl::StatusOr<TuneDefinition> ParseTuneText(const std::string& text, const std::string& source) {
  if (text.size() > kMaxSpecFileBytes) {
    return Invalid(source, absl::StrCat("more than ", kMaxSpecFileBytes, " bytes"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Invalid(source, absl::StrCat("not YAML: ", DescribeYamlError(e)));
  }
  if (!root.IsMap()) return Invalid(source, "a tune file is a mapping (name, base, grid, ...)");
  TuneDefinition tune;
  static const std::set<std::string> kTuneKeys = {
      "minimize", "target_accuracy", "max_wall_time", "max_slowdown", "search_budget", "min_epochs",
      "eta"};
  std::map<std::string, std::string> given;
  YAML::Node sweep(YAML::NodeType::Map);
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      if (kTuneKeys.count(key) == 0) {
        sweep[key] = kv.second;
        continue;
      }
      absl::StatusOr<std::string> v = Scalar(root, key.c_str(), source);
      if (!v.ok()) return v.status();
      given[key] = *v;
    }
  } catch (const YAML::Exception& e) {
    return Invalid(source, DescribeYamlError(e));
  }
  if (sweep["repeats"] && sweep["repeats"].IsScalar() && sweep["repeats"].Scalar() != "1") {
    return Invalid(source, "repeats: a tune runs each cell once (leave repeats out)");
  }
  absl::StatusOr<SweepDefinition> parsed = ParseSweepText(YAML::Dump(sweep), source);
  if (!parsed.ok()) return parsed.status();
  tune.sweep = *std::move(parsed);
  for (const SweepAxis& axis : tune.sweep.axes) {
    for (const std::string& field : axis.fields) {
      if (field == "epochs" || field == "resume_from_job") {
        return Invalid(source,
                       absl::StrCat("grid: ", field, " is the search's to set, not an axis"));
      }
    }
  }
  TuneOptions& o = tune.options;
  const std::string objective = given.count("minimize") ? given["minimize"] : "energy_to_accuracy";
  if (!ParseTuneObjective(objective, &o.objective)) {
    return Invalid(source,
                   absl::StrCat("minimize: \"", SanitizeUtf8(objective, 64),
                                "\" is not energy_to_accuracy, time_to_accuracy or energy"));
  }
  if (!given.count("target_accuracy") ||
      !absl::SimpleAtod(given["target_accuracy"], &o.target_accuracy) ||
      !(o.target_accuracy > 0 && o.target_accuracy < 1)) {
    return Invalid(source, "target_accuracy: required, a test accuracy in (0, 1)");
  }
  if (given.count("max_wall_time")) {
    absl::StatusOr<double> s = ParseDurationSeconds(given["max_wall_time"]);
    if (!s.ok()) return Invalid(source, absl::StrCat("max_wall_time: ", s.status().message()));
    o.max_wall_time_seconds = *s;
  }
  if (given.count("max_slowdown") && (!absl::SimpleAtod(given["max_slowdown"], &o.max_slowdown) ||
                                      !(o.max_slowdown >= 1) || o.max_slowdown > 1000)) {
    return Invalid(source, "max_slowdown: a factor of at least 1 (1.5: up to 50% slower)");
  }
  if (given.count("search_budget")) {
    absl::StatusOr<double> j = ParseEnergyBudget(given["search_budget"]);
    if (!j.ok()) return Invalid(source, absl::StrCat("search_budget: ", j.status().message()));
    tune.search_budget_joules = *j;
  }
  const YAML::Node epochs = tune.sweep.base["epochs"];
  int max_epochs = 0;
  if (!epochs || !epochs.IsScalar() || !absl::SimpleAtoi(epochs.Scalar(), &max_epochs) ||
      max_epochs < 1) {
    return Invalid(source, "base: epochs, the most a cell may train (the last rung), is required");
  }
  o.max_epochs = max_epochs;
  if (given.count("min_epochs") && (!absl::SimpleAtoi(given["min_epochs"], &o.min_epochs) ||
                                    o.min_epochs < 1 || o.min_epochs > max_epochs)) {
    return Invalid(
        source, absl::StrCat("min_epochs: the first rung's epochs, 1 to the base's ", max_epochs));
  }
  if (given.count("eta") && (!absl::SimpleAtoi(given["eta"], &o.eta) || o.eta < 2 || o.eta > 8)) {
    return Invalid(source, "eta: 2 to 8 (each rung keeps 1/eta of the cells)");
  }
  return tune;
}

absl::StatusOr<TuneDefinition> LoadTuneFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSpecFileText(path);
  if (!text.ok()) return text.status();
  return ParseTuneText(*text, path);
}

}  // namespace joule::client
