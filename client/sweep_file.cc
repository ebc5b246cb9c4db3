#include "client/sweep_file.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/spec_file.h"
#include "common/job_spec.h"
#include "common/names.h"

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

// FNV-1a, 64 bits, as 16 hex digits: stable across runs and builds.
std::string Fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrFormat("%016x", h);
}

// A stable digest of a cell's spec, so that a re-run submits the same request id only for
// the very same job.
std::string Digest(const v1::JobSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&out);
  }
  return Fnv1a(bytes);
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

absl::Status OverrideSweep(SweepDefinition& sweep, const std::vector<std::string>& sets,
                           const std::vector<std::string>& grids) {
  for (const std::string& set : sets) {
    const std::string field = set.substr(0, set.find('='));
    for (const SweepAxis& axis : sweep.axes) {
      if (std::find(axis.fields.begin(), axis.fields.end(), field) != axis.fields.end()) {
        return Invalid(sweep.name, absl::StrCat("--set ", set, ": the grid varies ", field,
                                                "; use --grid ", field, "=[...]"));
      }
    }
    if (absl::Status s = SetSpecField(sweep.base, set); !s.ok()) return s;
  }
  for (const std::string& grid : grids) {
    const size_t eq = grid.find('=');
    const std::string field = grid.substr(0, eq);
    auto axis = std::find_if(sweep.axes.begin(), sweep.axes.end(),
                             [&](const SweepAxis& a) { return a.field == field; });
    if (eq == std::string::npos || axis == sweep.axes.end()) {
      return Invalid(sweep.name, absl::StrCat("--grid ", grid, ": want AXIS=[V1, ...] with "
                                              "AXIS one of the grid's"));
    }
    YAML::Node values;
    try {
      values = YAML::Load(grid.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      return Invalid(sweep.name, absl::StrCat("--grid ", grid, ": ", DescribeYamlError(e)));
    }
    if (!values.IsSequence() || values.size() == 0) {
      return Invalid(sweep.name, absl::StrCat("--grid ", grid, ": the values are not a "
                                              "non-empty list"));
    }
    axis->values.clear();
    axis->texts.clear();
    for (const YAML::Node& v : values) {
      if (axis->fields.size() > 1 && (!v.IsSequence() || v.size() != axis->fields.size())) {
        return Invalid(sweep.name, absl::StrCat("--grid ", grid, ": each value of a zipped "
                                                "axis is a list of ", axis->fields.size()));
      }
      axis->values.push_back(YAML::Clone(v));
      axis->texts.push_back(Flow(v));
    }
  }
  // The file's limit holds for the grid as overridden.
  int64_t cells = sweep.repeats;
  for (const SweepAxis& a : sweep.axes) {
    cells *= static_cast<int64_t>(a.values.size());
    if (cells > kMaxCells) {
      return Invalid(sweep.name, absl::StrCat("--grid: more than ", kMaxCells,
                                              " jobs (cells x repeats)"));
    }
  }
  // Another sweep than the file's: its jobs must not be tabulated with the file's own.
  // Digested in a canonical form: the fields set (the last value of each, as YAML in
  // flow style, by field name), then each overridden axis's values as parsed, so that the
  // same overrides in another order or spacing name the same sweep.
  if (!sets.empty() || !grids.empty()) {
    std::map<std::string, std::string> set_values;
    for (const std::string& set : sets) {
      const size_t eq = set.find('=');
      std::string value = set.substr(eq + 1);
      try {
        value = Flow(YAML::Load(value));
      } catch (const YAML::Exception&) {
        // SetSpecField took it: keep the text as given.
      }
      set_values[set.substr(0, eq)] = value;
    }
    std::string overrides;
    for (const auto& [field, value] : set_values) {
      absl::StrAppend(&overrides, "set\n", field, "\n", value, "\n");
    }
    std::set<std::string> overridden;
    for (const std::string& grid : grids) overridden.insert(grid.substr(0, grid.find('=')));
    for (const SweepAxis& a : sweep.axes) {
      if (overridden.count(a.field) == 0) continue;
      absl::StrAppend(&overrides, "grid\n", a.field, "\n", absl::StrJoin(a.texts, "\n"), "\n");
    }
    sweep.name =
        absl::StrCat(sweep.name.substr(0, kMaxSweepName - 9), "-", Fnv1a(overrides).substr(0, 8));
  }
  return absl::OkStatus();
}

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

}  // namespace joule::client
