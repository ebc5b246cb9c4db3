#include "client/sweep.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/spec_file.h"
#include "common/job_spec.h"
#include "common/names.h"
#include "nlohmann/json.hpp"

namespace joule::client {
namespace {

constexpr int kMaxCells = 1000;  // the coordinator's default active jobs per client
constexpr int kMaxRepeats = 100;
constexpr size_t kMaxSweepName = 64;

absl::Status Invalid(const std::string& name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

// Counts a node's values (aliases expanded) against the job file's limits, so that a
// "billion laughs" grid or base is refused before it is copied.
absl::Status CheckSize(const YAML::Node& node, int depth, int* values, const std::string& name,
                       const std::string& where) {
  if (++*values > kMaxSpecValues) {
    return Invalid(name, absl::StrCat(where, ": more than ", kMaxSpecValues,
                                      " values once YAML aliases are expanded"));
  }
  if (depth > kMaxSpecDepth) {
    return Invalid(name, absl::StrCat(where, ": nested more than ", kMaxSpecDepth, " levels"));
  }
  if (node.IsSequence() || node.IsMap()) {
    for (const auto& child : node) {
      const YAML::Node v = node.IsMap() ? YAML::Node(child.second) : YAML::Node(child);
      if (absl::Status s = CheckSize(v, depth + 1, values, name, where); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

std::string Flow(const YAML::Node& node) {
  YAML::Emitter out;
  out.SetMapFormat(YAML::Flow);
  out.SetSeqFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

absl::StatusOr<SweepPreset> PresetNamed(const std::string& name, const std::string& v) {
  if (v == "strong-local") return SweepPreset::kStrongLocal;
  if (v == "strong-global") return SweepPreset::kStrongGlobal;
  if (v == "weak") return SweepPreset::kWeak;
  return Invalid(name, absl::StrCat("preset: '", v,
                                    "' is not one of strong-local, strong-global, weak"));
}

// FNV-1a, 64 bits: a stable digest of a cell's spec, so that a re-run submits the same
// request id only for the very same job.
std::string Digest(const v1::JobSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&out);
  }
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrFormat("%016x", h);
}

// Sets `field` ("optimizer.lr") of `node` to a copy of `value`.
void SetField(YAML::Node node, const std::string& field, const YAML::Node& value) {
  std::vector<std::string> parts = absl::StrSplit(field, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
    node.reset(node[parts[i]]);
  }
  node[parts.back()] = YAML::Clone(value);
}

// Fields that set a cell's parallelism (workers x threads): the axes holding one (with
// whatever is zipped with it) vary along a scaling series rather than name it.
bool IsParallelism(const std::string& field) {
  return field == "workers" || field == "intra_op_threads" || field == "intraOpThreads";
}

// The preset's rules on the base (before the cells) and on each parsed cell (so that a
// batch axis in any spelling, globalBatchSize say, is caught by what it changes).
absl::Status CheckPresetBase(const SweepDefinition& sweep, const v1::JobSpec& base) {
  if (sweep.preset == SweepPreset::kNone) return absl::OkStatus();
  if (std::none_of(sweep.axes.begin(), sweep.axes.end(),
                   [](const SweepAxis& a) {
                     return std::find(a.fields.begin(), a.fields.end(), "workers") !=
                            a.fields.end();
                   })) {
    return Invalid(sweep.name, "grid.workers: the preset needs a workers axis");
  }
  if (sweep.preset == SweepPreset::kStrongLocal &&
      (base.local_batch_size() <= 0 || base.global_batch_size() > 0)) {
    return Invalid(sweep.name, "base: strong-local keeps local_batch_size fixed; set it, "
                               "and not global_batch_size");
  }
  if (sweep.preset == SweepPreset::kStrongGlobal &&
      (base.global_batch_size() <= 0 || base.local_batch_size() > 0)) {
    return Invalid(sweep.name, "base: strong-global keeps global_batch_size fixed; set it, "
                               "and not local_batch_size");
  }
  if (sweep.preset == SweepPreset::kWeak && base.dataset_fraction() > 1) {
    return Invalid(sweep.name, "base.dataset_fraction: weak scaling sets it from the workers");
  }
  return absl::OkStatus();
}

absl::Status CheckPresetCell(const SweepDefinition& sweep, const v1::JobSpec& base,
                             const std::string& key, const v1::JobSpec& cell) {
  if (sweep.preset == SweepPreset::kNone) return absl::OkStatus();
  if (cell.local_batch_size() != base.local_batch_size() ||
      cell.global_batch_size() != base.global_batch_size()) {
    return Invalid(sweep.name, absl::StrCat("cell ", key, ": the preset fixes the batch; "
                                            "the grid may not change it"));
  }
  if (sweep.preset == SweepPreset::kWeak && cell.dataset_fraction() != base.dataset_fraction()) {
    return Invalid(sweep.name, absl::StrCat("cell ", key, ": weak scaling sets "
                                            "dataset_fraction; the grid may not"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<SweepCell>> ExpandSweep(const SweepDefinition& sweep) {
  absl::StatusOr<v1::JobSpec> base = ParseSpecNode(sweep.base, sweep.name + " base");
  if (!base.ok()) return base.status();
  if (absl::Status s = CheckPresetBase(sweep, *base); !s.ok()) return s;
  // Pass 1: every cell's spec (the weak preset needs the largest worker count).
  std::vector<SweepCell> cells;
  std::vector<size_t> at(sweep.axes.size(), 0);
  int max_workers = 1;
  for (int index = 0;; ++index) {
    YAML::Node node = YAML::Clone(sweep.base);
    SweepCell cell;
    cell.index = index;
    std::vector<std::string> key;
    std::vector<std::string> series;  // the key without the axes that set the parallelism
    for (size_t i = 0; i < sweep.axes.size(); ++i) {
      const SweepAxis& axis = sweep.axes[i];
      const YAML::Node& value = axis.values[at[i]];
      const bool parallelism = std::any_of(axis.fields.begin(), axis.fields.end(),
                                           [](const std::string& f) { return IsParallelism(f); });
      for (size_t k = 0; k < axis.fields.size(); ++k) {
        const YAML::Node part = axis.fields.size() == 1 ? value : YAML::Node(value[k]);
        const std::string text = axis.fields.size() == 1 ? axis.texts[at[i]] : Flow(part);
        SetField(node, axis.fields[k], part);
        cell.values[axis.fields[k]] = text;
        key.push_back(absl::StrCat(axis.fields[k], "=", text));
        if (!parallelism) series.push_back(key.back());
      }
    }
    cell.key = absl::StrJoin(key, ",");
    cell.series = absl::StrJoin(series, ",");
    if (cell.key.size() > 512) {
      return Invalid(sweep.name, absl::StrCat("cell ", cell.key.substr(0, 64),
                                              "...: its key is over 512 bytes (a label)"));
    }
    absl::StatusOr<v1::JobSpec> spec =
        ParseSpecNode(node, absl::StrCat(sweep.name, " cell ", cell.key));
    if (!spec.ok()) return spec.status();
    if (absl::Status s = CheckPresetCell(sweep, *base, cell.key, *spec); !s.ok()) return s;
    cell.spec = DefaultJobSpec();  // what `joule submit -f` would send for this file
    cell.spec.MergeFrom(*spec);
    max_workers = std::max(max_workers, spec->workers());
    cells.push_back(std::move(cell));
    size_t i = sweep.axes.size();
    while (i > 0 && ++at[i - 1] == sweep.axes[i - 1].values.size()) at[--i] = 0;
    if (i == 0) break;
  }
  // Pass 2: the preset, the checks the coordinator makes, the repeats and their ids.
  std::vector<SweepCell> out;
  std::map<std::string, std::string> digests;  // digest of repeat 0 -> cell key
  for (SweepCell& cell : cells) {
    if (sweep.preset == SweepPreset::kWeak) {
      const int n = std::max(1, cell.spec.workers());
      if (max_workers % n != 0) {
        return Invalid(sweep.name, absl::StrCat("cell ", cell.key, ": weak scaling trains on ",
                                                n, "/", max_workers,
                                                " of the data; the largest worker count must "
                                                "be a multiple of every other"));
      }
      cell.spec.set_dataset_fraction(max_workers / n);
    }
    v1::JobSpec checked = cell.spec;
    if (absl::Status s = NormalizeAndValidateSpec(checked); !s.ok()) {
      return Invalid(sweep.name, absl::StrCat("cell ", cell.key, ": ", s.message()));
    }
    const std::string digest = Digest(cell.spec);
    if (auto [it, fresh] = digests.emplace(digest, cell.key); !fresh) {
      return Invalid(sweep.name, absl::StrCat("cells ", it->second, " and ", cell.key,
                                              " are the same job"));
    }
    for (int r = 0; r < sweep.repeats; ++r) {
      SweepCell c = cell;
      c.repeat = r;
      c.spec.set_seed(cell.spec.seed() + r);  // repeat r: the base seed + r
      c.request_id = absl::StrCat("sweep/", sweep.name, "/", Digest(c.spec), "/r", r);
      auto& labels = *c.spec.mutable_labels();
      labels["sweep"] = sweep.name;
      labels["cell"] = cell.key;
      labels["series"] = cell.series;
      labels["repeat"] = std::to_string(r);
      if (sweep.preset == SweepPreset::kWeak) labels["sweep_preset"] = "weak";
      out.push_back(std::move(c));
    }
  }
  return out;
}

absl::StatusOr<SweepDefinition> ParseSweepText(const std::string& text, const std::string& name) {
  if (text.size() > kMaxSpecFileBytes) {
    return Invalid(name, absl::StrCat("more than ", kMaxSpecFileBytes, " bytes"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Invalid(name, absl::StrCat("not YAML: ", DescribeYamlError(e)));
  }
  if (!root.IsMap()) return Invalid(name, "a sweep file is a mapping (name, base, grid, ...)");
  int values = 0;
  if (absl::Status s = CheckSize(root, 0, &values, name, "the file"); !s.ok()) return s;
  SweepDefinition sweep;
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (key == "name") {
        sweep.name = v.as<std::string>();
      } else if (key == "base") {
        if (!v.IsMap()) return Invalid(name, "base: a job spec mapping, as in a job file");
        sweep.base = YAML::Clone(v);
      } else if (key == "repeats") {
        sweep.repeats = v.as<int>();
      } else if (key == "concurrency") {
        sweep.concurrency = v.as<int>();
        if (sweep.concurrency < 1 || sweep.concurrency > kMaxCells) {
          return Invalid(name, absl::StrCat("concurrency: ", sweep.concurrency, " is not in 1..",
                                            kMaxCells, " (jobs at once; omit it for all)"));
        }
      } else if (key == "preset") {
        absl::StatusOr<SweepPreset> p = PresetNamed(name, v.as<std::string>());
        if (!p.ok()) return p.status();
        sweep.preset = *p;
      } else if (key == "grid") {
        if (!v.IsMap()) return Invalid(name, "grid: a mapping of field: [values]");
        std::set<std::string> seen;
        for (const auto& axis : v) {
          SweepAxis a{axis.first.as<std::string>(), {}, {}, {}};
          for (absl::string_view f : absl::StrSplit(a.field, ',')) {
            const std::string field(absl::StripAsciiWhitespace(f));
            if (field.empty()) {
              return Invalid(name, absl::StrCat("grid.", a.field, ": an empty field name"));
            }
            if (!seen.insert(field).second) {
              return Invalid(name, absl::StrCat("grid.", a.field, ": ", field,
                                                " is in more than one axis"));
            }
            a.fields.push_back(field);
          }
          if (!axis.second.IsSequence() || axis.second.size() == 0) {
            return Invalid(name, absl::StrCat("grid.", a.field, ": a non-empty list of values"));
          }
          for (const auto& value : axis.second) {
            if (a.fields.size() > 1 &&
                (!value.IsSequence() || value.size() != a.fields.size())) {
              return Invalid(name, absl::StrCat("grid.", a.field, ": ", Flow(value),
                                                " is not a list of ", a.fields.size(),
                                                " values, one per field"));
            }
            a.values.push_back(YAML::Clone(value));
            a.texts.push_back(Flow(value));
          }
          sweep.axes.push_back(std::move(a));
        }
      } else {
        return Invalid(name, absl::StrCat("unknown key '", key,
                                          "' (name, base, grid, repeats, preset, concurrency)"));
      }
    }
  } catch (const YAML::Exception& e) {
    return Invalid(name, DescribeYamlError(e));
  }
  if (sweep.name.empty() || sweep.name.size() > kMaxSweepName ||
      !std::all_of(sweep.name.begin(), sweep.name.end(), [](unsigned char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
      })) {
    return Invalid(name, "name: 1 to 64 characters of A-Z a-z 0-9 . _ -");
  }
  if (!sweep.base.IsMap()) return Invalid(name, "base: missing (the job every cell starts from)");
  if (sweep.axes.empty()) return Invalid(name, "grid: missing (at least one field: [values])");
  if (sweep.repeats < 1 || sweep.repeats > kMaxRepeats) {
    return Invalid(name, absl::StrCat("repeats: ", sweep.repeats, " is not in 1..", kMaxRepeats));
  }
  int64_t cells = sweep.repeats;
  for (const SweepAxis& a : sweep.axes) {
    cells *= static_cast<int64_t>(a.values.size());
    if (cells > kMaxCells) {
      return Invalid(name, absl::StrCat("more than ", kMaxCells, " jobs (cells x repeats)"));
    }
  }
  return sweep;
}

absl::StatusOr<SweepDefinition> LoadSweepFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSpecFileText(path);
  if (!text.ok()) return text.status();
  return ParseSweepText(*text, path);
}

double StudentT975(int df) {
  // Two-sided 95% (0.975 quantile) of Student's t: NIST/SEMATECH e-Handbook of Statistical
  // Methods, table 1.3.6.7.2; between the tabulated df, linear in 1/df (exact to 3 digits).
  static constexpr struct { int df; double t; } kTable[] = {
      {1, 12.706}, {2, 4.303},  {3, 3.182},  {4, 2.776},  {5, 2.571},  {6, 2.447},
      {7, 2.365},  {8, 2.306},  {9, 2.262},  {10, 2.228}, {11, 2.201}, {12, 2.179},
      {13, 2.160}, {14, 2.145}, {15, 2.131}, {16, 2.120}, {17, 2.110}, {18, 2.101},
      {19, 2.093}, {20, 2.086}, {25, 2.060}, {30, 2.042}, {40, 2.021}, {60, 2.000},
      {120, 1.980}};
  if (df <= 1) return kTable[0].t;
  for (size_t i = 1; i < std::size(kTable); ++i) {
    if (df <= kTable[i].df) {
      const double a = 1.0 / kTable[i - 1].df, b = 1.0 / kTable[i].df, x = 1.0 / df;
      return kTable[i - 1].t + (kTable[i].t - kTable[i - 1].t) * (a - x) / (a - b);
    }
  }
  const double x = 1.0 / df, a = 1.0 / 120;  // toward 1.960 at df = infinity
  return 1.960 + (1.980 - 1.960) * x / a;
}

absl::StatusOr<LineFit> FitLine(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = std::min(x.size(), y.size());
  if (n < 2) return absl::FailedPreconditionError("a line needs at least 2 points");
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0, syy = 0, xx = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
    xx += x[i] * x[i];
  }
  // Relative: x spread below rounding of the x themselves is no spread.
  if (sxx <= 1e-12 * xx || sxx <= 0) {
    return absl::FailedPreconditionError("every x is the same: no slope to fit");
  }
  LineFit f;
  f.n = static_cast<int>(n);
  f.slope = sxy / sxx;
  f.intercept = my - f.slope * mx;
  double sse = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = y[i] - (f.slope * x[i] + f.intercept);
    sse += r * r;
  }
  f.r2 = syy > 0 ? 1 - sse / syy : 1;
  if (n >= 3) {
    const double s2 = sse / static_cast<double>(n - 2);
    const double t = StudentT975(static_cast<int>(n - 2));
    f.slope_ci95 = t * std::sqrt(s2 / sxx);
    f.intercept_ci95 = t * std::sqrt(s2 * (1.0 / n + mx * mx / sxx));
  }
  return f;
}

absl::StatusOr<LinearFit> FitLinear(const std::vector<std::vector<double>>& columns,
                                    const std::vector<double>& y) {
  const size_t k = columns.size(), p = k + 1, n = y.size();
  if (k < 1 || k > 4) return absl::InvalidArgumentError("1 to 4 regressors");
  for (const auto& c : columns) {
    if (c.size() != n) return absl::InvalidArgumentError("every column as long as y");
  }
  if (n < p) {
    return absl::FailedPreconditionError(
        absl::StrCat(p, " coefficients need at least ", p, " points, not ", n));
  }
  auto x = [&](size_t row, size_t col) { return col == 0 ? 1.0 : columns[col - 1][row]; };
  // [X'X | I] -> [I | (X'X)^-1] by Gauss-Jordan; beta = (X'X)^-1 X'y.
  std::vector<std::vector<double>> a(p, std::vector<double>(2 * p, 0.0));
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) {
      for (size_t r = 0; r < n; ++r) a[i][j] += x(r, i) * x(r, j);
    }
    a[i][p + i] = 1;
  }
  // Equilibrate (D^-1/2 X'X D^-1/2, unit diagonal) so that regressors of very different
  // magnitudes (1e8 samples per device-hour next to an intercept) keep their precision
  // and the collinearity test below is relative; undone on the inverse afterwards.
  std::vector<double> scale(p);
  for (size_t i = 0; i < p; ++i) {
    if (a[i][i] <= 0) return absl::FailedPreconditionError("a regressor is all zeros");
    scale[i] = 1 / std::sqrt(a[i][i]);
  }
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) a[i][j] *= scale[i] * scale[j];
  }
  constexpr double kCollinear = 1e-12;  // a pivot this small, on the unit diagonal
  for (size_t c = 0; c < p; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < p; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (std::abs(a[pivot][c]) <= kCollinear) {
      return absl::FailedPreconditionError("the regressors are collinear: no unique fit");
    }
    std::swap(a[c], a[pivot]);
    const double d = a[c][c];
    for (double& v : a[c]) v /= d;
    for (size_t r = 0; r < p; ++r) {
      if (r == c || a[r][c] == 0) continue;
      const double m = a[r][c];
      for (size_t j = 0; j < 2 * p; ++j) a[r][j] -= m * a[c][j];
    }
  }
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) a[i][p + j] *= scale[i] * scale[j];  // (X'X)^-1
  }
  LinearFit f;
  f.n = static_cast<int>(n);
  f.coefficients.assign(p, 0.0);
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) {
      double xty = 0;
      for (size_t r = 0; r < n; ++r) xty += x(r, j) * y[r];
      f.coefficients[i] += a[i][p + j] * xty;
    }
  }
  double mean = 0;
  for (double v : y) mean += v;
  mean /= static_cast<double>(n);
  double sse = 0, sst = 0;
  for (size_t r = 0; r < n; ++r) {
    double fitted = 0;
    for (size_t i = 0; i < p; ++i) fitted += f.coefficients[i] * x(r, i);
    sse += (y[r] - fitted) * (y[r] - fitted);
    sst += (y[r] - mean) * (y[r] - mean);
  }
  f.r2 = sst > 0 ? 1 - sse / sst : 1;
  f.ci95.assign(p, 0.0);
  if (n > p) {
    const double s2 = sse / static_cast<double>(n - p);
    const double t = StudentT975(static_cast<int>(n - p));
    for (size_t i = 0; i < p; ++i) f.ci95[i] = t * std::sqrt(std::max(0.0, s2 * a[i][p + i]));
  }
  return f;
}

std::string UnrunnableReason(const v1::JobSpec& spec,
                             const std::map<v1::DeviceKind, int>& registered) {
  const v1::DeviceKind kind =
      spec.device_kind() == v1::DEVICE_KIND_GPU ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU;
  auto it = registered.find(kind);
  const int have = it == registered.end() ? 0 : it->second;
  if (spec.workers() <= have) return "";
  return absl::StrCat("needs ", spec.workers(), " ", DeviceKindName(kind),
                      spec.workers() == 1 ? " worker" : " workers", " and only ", have,
                      have == 1 ? " is" : " are", " registered");
}

std::string LineFitText(const LineFit& fit) {
  if (fit.n < 3) {
    return absl::StrFormat(
        "%.1f J per device-hour, intercept %.2f J (n=%d: a line through %d points fits them "
        "exactly; too few points for an interval or R^2)",
        fit.slope, fit.intercept, fit.n, fit.n);
  }
  return absl::StrFormat(
      "%.1f +- %.1f J per device-hour, intercept %.2f +- %.2f J, R^2 %.4f (n=%d, 95%% "
      "intervals)",
      fit.slope, fit.slope_ci95, fit.intercept, fit.intercept_ci95, fit.r2, fit.n);
}

std::string LinearFitText(const LinearFit& fit, const std::vector<std::string>& names) {
  const size_t p = fit.coefficients.size();
  const bool intervals = static_cast<size_t>(fit.n) > p;
  std::string out;
  for (size_t i = 0; i < p; ++i) {
    const std::string term =
        intervals ? absl::StrFormat("%.4g (+- %.2g)", fit.coefficients[i], fit.ci95[i])
                  : absl::StrFormat("%.4g", fit.coefficients[i]);
    absl::StrAppend(&out, i == 0 ? "" : " + ", term,
                    i > 0 && i - 1 < names.size() ? " " + names[i - 1] : "");
  }
  if (intervals) {
    absl::StrAppend(&out, absl::StrFormat(", R^2 %.4f (n=%d, 95%% intervals)", fit.r2, fit.n));
  } else {
    absl::StrAppend(&out, absl::StrFormat(" (n=%d for %d coefficients: an exact fit; too few "
                                          "points for an interval or R^2)",
                                          fit.n, p));
  }
  return out;
}

namespace {

struct Stats {
  double mean = 0, sd = 0;
};
Stats MeanSd(const std::vector<double>& v) {
  Stats s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / (v.size() - 1));
  }
  return s;
}

// The cell's values other than workers and threads: cells that share it form one scaling
// series. (Keys are "field=value" joined by ','; a list value's own commas stay inside
// its brackets, which split apart and join back alike.)
std::string SeriesKey(const std::string& cell_key) {
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(cell_key, ',')) {
    if (!absl::StartsWith(p, "workers=") && !absl::StartsWith(p, "intra_op_threads=") &&
        !absl::StartsWith(p, "intraOpThreads=")) {
      parts.emplace_back(p);
    }
  }
  return absl::StrJoin(parts, ",");
}

int Parallelism(const SweepRow& r) { return std::max(1, r.workers) * std::max(1, r.threads); }

}  // namespace

std::vector<SweepRow> SummariseSweep(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const v1::Job*>> by_cell;
  std::map<std::string, std::string> series_of;  // cell -> its scaling series
  for (const v1::Job& j : jobs) {
    auto it = j.spec().labels().find("cell");
    if (it == j.spec().labels().end()) continue;
    if (!by_cell.count(it->second)) order.push_back(it->second);
    by_cell[it->second].push_back(&j);
    // The sweep's own series label where it set one (zipped axes), else from the key.
    auto series = j.spec().labels().find("series");
    series_of[it->second] =
        series != j.spec().labels().end() ? series->second : SeriesKey(it->second);
  }
  std::vector<SweepRow> rows;
  std::set<std::string> weak;  // cells of weak-scaling sweeps
  for (const v1::Job& j : jobs) {
    auto p = j.spec().labels().find("sweep_preset");
    auto c = j.spec().labels().find("cell");
    if (p != j.spec().labels().end() && p->second == "weak" && c != j.spec().labels().end()) {
      weak.insert(c->second);
    }
  }
  for (const std::string& key : order) {
    SweepRow r;
    r.key = key;
    r.series = series_of[key];
    std::vector<double> wall, acc, energy, dh, spdh, updh, spj, tta, eta, watts;
    for (const v1::Job* j : by_cell[key]) {
      ++r.jobs;
      r.workers = j->spec().workers();
      r.threads = j->spec().intra_op_threads();
      r.global_batch = j->spec().global_batch_size();
      r.local_batch = j->spec().local_batch_size();
      r.target_accuracy = j->spec().target_accuracy();
      if (j->state() != v1::JOB_STATE_SUCCEEDED) continue;
      ++r.succeeded;
      for (const v1::AccuracyTarget& t : j->result().to_accuracy()) {
        if (r.target_accuracy > 0 && t.target() == r.target_accuracy && t.reached()) {
          tta.push_back(t.seconds());
          eta.push_back(t.joules());
        }
      }
      const v1::EnergyReport& e = j->result().energy();
      wall.push_back(j->result().wall_seconds());
      acc.push_back(j->result().test_accuracy());
      energy.push_back(e.total_joules());
      dh.push_back(e.device_hours());
      spdh.push_back(e.device_hours() > 0 ? j->result().samples() / e.device_hours() : 0);
      updh.push_back(e.updates_per_device_hour());
      spj.push_back(e.samples_per_joule());
      if (j->result().wall_seconds() > 0) {
        watts.push_back(e.total_joules() / j->result().wall_seconds());
      }
      r.estimated = r.estimated || e.estimated();
    }
    const Stats w = MeanSd(wall), en = MeanSd(energy);
    r.wall_mean = w.mean;
    r.wall_sd = w.sd;
    r.accuracy_mean = MeanSd(acc).mean;
    r.energy_mean = en.mean;
    r.energy_sd = en.sd;
    r.device_hours_mean = MeanSd(dh).mean;
    r.joules_per_device_hour = r.device_hours_mean > 0 ? r.energy_mean / r.device_hours_mean : 0;
    r.samples_per_device_hour = MeanSd(spdh).mean;
    r.updates_per_device_hour = MeanSd(updh).mean;
    r.samples_per_joule = MeanSd(spj).mean;
    r.average_watts = MeanSd(watts).mean;
    r.reached_target = static_cast<int>(tta.size());
    r.tta_mean = MeanSd(tta).mean;
    r.eta_mean = MeanSd(eta).mean;
    rows.push_back(r);
  }
  // Speedup and parallel efficiency against the least parallel cell of the same series.
  for (SweepRow& r : rows) {
    const SweepRow* ref = nullptr;
    for (const SweepRow& o : rows) {
      if (series_of[o.key] != series_of[r.key] || o.succeeded == 0) continue;
      if (!ref || Parallelism(o) < Parallelism(*ref)) ref = &o;
    }
    if (ref && r.succeeded > 0 && r.wall_mean > 0) {
      r.speedup = ref->wall_mean / r.wall_mean;
      // Weak scaling: N workers do N times the work, so ideal is T = T0.
      r.efficiency = weak.count(r.key)
                         ? r.speedup
                         : r.speedup * Parallelism(*ref) / static_cast<double>(Parallelism(r));
    }
  }
  return rows;
}

std::string SweepTable(const std::vector<SweepRow>& rows) {
  std::ostringstream out;
  out << absl::StrFormat("%-40s %4s %7s %9s %8s %7s %6s %10s %10s %7s %12s %9s %s\n", "cell",
                         "runs", "ok", "wall s", "+-", "speedup", "eff", "accuracy", "energy J",
                         "avg W", "J/device-h", "samples/J", "source");
  for (const SweepRow& r : rows) {
    if (r.succeeded == 0) {
      // Nothing measured: no figure is a zero (issue 23 showed "accuracy 0.0000, measured").
      out << absl::StrFormat("%-40s %4d %7d %9s %8s %7s %6s %10s %10s %7s %12s %9s %s\n", r.key,
                             r.jobs, 0, "-", "-", "-", "-", "-", "-", "-", "-", "-",
                             "none succeeded");
      continue;
    }
    out << absl::StrFormat(
        "%-40s %4d %7d %9.2f %8.2f %7.2f %6.2f %10.4f %10.1f %7.2f %12.1f %9.1f %s\n", r.key,
        r.jobs, r.succeeded, r.wall_mean, r.wall_sd, r.speedup, r.efficiency, r.accuracy_mean,
        r.energy_mean, r.average_watts, r.joules_per_device_hour, r.samples_per_joule,
                           r.estimated ? "estimated" : "measured");
  }
  bool targets = false;
  for (const SweepRow& r : rows) targets = targets || r.target_accuracy > 0;
  if (targets) {
    out << absl::StrFormat("\n%-40s %8s %8s %10s %12s\n", "to accuracy (Zeus TTA/ETA)", "target",
                           "reached", "time s", "energy J");
    for (const SweepRow& r : rows) {
      if (r.target_accuracy <= 0) continue;
      out << absl::StrFormat("%-40s %8.4f %5d/%-2d %10s %12s\n", r.key, r.target_accuracy,
                             r.reached_target, r.succeeded,
                             r.reached_target ? absl::StrFormat("%.2f", r.tta_mean) : "-",
                             r.reached_target ? absl::StrFormat("%.1f", r.eta_mean) : "-");
    }
  }
  return out.str();
}

std::string SweepCsv(const std::vector<SweepRow>& rows) {
  std::ostringstream out;
  out << "cell,workers,jobs,succeeded,wall_seconds_mean,wall_seconds_sd,speedup,efficiency,"
         "test_accuracy_mean,energy_joules_mean,energy_joules_sd,device_hours_mean,"
         "joules_per_device_hour,samples_per_device_hour,updates_per_device_hour,"
         "samples_per_joule,energy_source,global_batch_size,local_batch_size,"
         "target_accuracy,reached_target,time_to_target_seconds_mean,"
         "energy_to_target_joules_mean,intra_op_threads,average_watts\n";
  for (const SweepRow& r : rows) {
    out << "\"" << absl::StrReplaceAll(r.key, {{"\"", "\"\""}}) << "\","
        << absl::StrJoin(std::vector<std::string>{
                             absl::StrCat(r.workers), absl::StrCat(r.jobs),
                             absl::StrCat(r.succeeded), absl::StrCat(r.wall_mean),
                             absl::StrCat(r.wall_sd), absl::StrCat(r.speedup),
                             absl::StrCat(r.efficiency), absl::StrCat(r.accuracy_mean),
                             absl::StrCat(r.energy_mean), absl::StrCat(r.energy_sd),
                             absl::StrCat(r.device_hours_mean),
                             absl::StrCat(r.joules_per_device_hour),
                             absl::StrCat(r.samples_per_device_hour),
                             absl::StrCat(r.updates_per_device_hour),
                             absl::StrCat(r.samples_per_joule)},
                         ",")
        << "," << (r.estimated ? "estimated" : "measured") << ","
        << absl::StrJoin(std::vector<std::string>{absl::StrCat(r.global_batch),
                                                  absl::StrCat(r.local_batch),
                                                  absl::StrCat(r.target_accuracy),
                                                  absl::StrCat(r.reached_target),
                                                  absl::StrCat(r.tta_mean),
                                                  absl::StrCat(r.eta_mean),
                                                  absl::StrCat(r.threads),
                                                  absl::StrCat(r.average_watts)},
                         ",")
        << "\n";
  }
  return out.str();
}

std::string SweepJson(const std::vector<SweepRow>& rows, const LineFit* fit,
                      const LinearFit* slope_model) {
  nlohmann::json cells = nlohmann::json::array();
  for (const SweepRow& r : rows) {
    cells.push_back({{"cell", r.key},
                     {"workers", r.workers},
                     {"jobs", r.jobs},
                     {"succeeded", r.succeeded},
                     {"wall_seconds_mean", r.wall_mean},
                     {"wall_seconds_sd", r.wall_sd},
                     {"speedup", r.speedup},
                     {"efficiency", r.efficiency},
                     {"test_accuracy_mean", r.accuracy_mean},
                     {"energy_joules_mean", r.energy_mean},
                     {"energy_joules_sd", r.energy_sd},
                     {"device_hours_mean", r.device_hours_mean},
                     {"joules_per_device_hour", r.joules_per_device_hour},
                     {"samples_per_device_hour", r.samples_per_device_hour},
                     {"updates_per_device_hour", r.updates_per_device_hour},
                     {"samples_per_joule", r.samples_per_joule},
                     {"energy_source", r.estimated ? "estimated" : "measured"},
                     {"global_batch_size", r.global_batch},
                     {"local_batch_size", r.local_batch},
                     {"target_accuracy", r.target_accuracy},
                     {"reached_target", r.reached_target},
                     {"time_to_target_seconds_mean", r.tta_mean},
                     {"energy_to_target_joules_mean", r.eta_mean},
                     {"intra_op_threads", r.threads},
                     {"average_watts", r.average_watts}});
  }
  nlohmann::json out = {{"cells", cells}};
  if (fit) {
    out["energy_vs_device_hours"] = {{"n", fit->n},
                                     {"slope_joules_per_device_hour", fit->slope},
                                     {"slope_ci95", fit->slope_ci95},
                                     {"intercept_joules", fit->intercept},
                                     {"intercept_ci95", fit->intercept_ci95},
                                     {"r2", fit->r2}};
  }
  if (slope_model) {
    const auto& b = slope_model->coefficients;
    const auto& ci = slope_model->ci95;
    out["joules_per_device_hour_model"] = {
        {"n", slope_model->n},
        {"intercept", b[0]},
        {"intercept_ci95", ci[0]},
        {"per_sample_per_device_hour", b[1]},
        {"per_sample_per_device_hour_ci95", ci[1]},
        {"per_update_per_device_hour", b[2]},
        {"per_update_per_device_hour_ci95", ci[2]},
        {"r2", slope_model->r2}};
  }
  return out.dump(2) + "\n";
}

}  // namespace joule::client
