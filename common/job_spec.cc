#include "common/job_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/carbon_intensity.h"
#include "common/energy_report.h"
#include "common/text.h"

namespace joule {
namespace {

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

}  // namespace

bool IsKnownModel(const std::string& model) {
  return model == "logreg" || model == "mlp" || model == "cnn" || model == "resnet18" ||
         model == "resnet50" || (absl::StartsWith(model, "torchscript:") && model.size() > 12);
}

std::vector<std::string> UserPaths(const v1::JobSpec& spec) {
  std::vector<std::string> out;
  for (absl::string_view prefix : {"idx:", "csv:", "imagefolder:"}) {
    if (absl::StartsWith(spec.dataset(), prefix)) {
      out.push_back(spec.dataset().substr(prefix.size()));
    }
  }
  if (absl::StatusOr<Hdf5Dataset> h = ParseHdf5Dataset(spec.dataset()); h.ok()) {
    out.push_back(h->file);
  }
  if (absl::StartsWith(spec.model(), "torchscript:")) out.push_back(spec.model().substr(12));
  return out;
}

absl::Status ResolveDataset(const std::string& dataset, const std::string& data_root,
                            std::string* dir) {
  if (dataset == "fashion-mnist") {
    *dir = absl::StrCat(data_root.empty() ? "/usr/share/datasets" : data_root, "/", dataset);
    return absl::OkStatus();
  }
  if (absl::StartsWith(dataset, "idx:")) {
    std::string path = dataset.substr(4);
    if (path.empty()) return Invalid("dataset \"idx:\" names no directory");
    *dir = path;
    return absl::OkStatus();
  }
  if (absl::StartsWith(dataset, "csv:")) {
    std::string path = dataset.substr(4);
    if (path.empty()) return Invalid("dataset \"csv:\" names no file");
    *dir = path;
    return absl::OkStatus();
  }
  if (absl::StartsWith(dataset, "hdf5:")) {
    absl::StatusOr<Hdf5Dataset> h = ParseHdf5Dataset(dataset);
    if (!h.ok()) return h.status();
    *dir = h->file;
    return absl::OkStatus();
  }
  if (absl::StartsWith(dataset, "imagefolder:")) {
    std::string path = dataset.substr(12);
    if (path.empty()) return Invalid("dataset \"imagefolder:\" names no directory");
    *dir = path;
    return absl::OkStatus();
  }
  if (absl::StartsWith(dataset, "synthetic:")) {
    absl::StatusOr<SyntheticSpec> syn = ParseSynthetic(dataset);
    if (!syn.ok()) return syn.status();
    dir->clear();
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat("dataset \"", dataset,
                              "\" is unknown (want fashion-mnist, idx:DIR, csv:FILE, "
                              "imagefolder:DIR, hdf5:FILE:INPUTS:TARGETS or "
                              "synthetic:CxHxW:CLASSES:N)"));
}

absl::StatusOr<Hdf5Dataset> ParseHdf5Dataset(const std::string& dataset) {
  if (!absl::StartsWith(dataset, "hdf5:")) return Invalid("not an hdf5: dataset");
  const std::string rest = dataset.substr(5);
  const size_t t = rest.rfind(':');
  const size_t i = t == std::string::npos || t == 0 ? std::string::npos : rest.rfind(':', t - 1);
  if (i == std::string::npos || i == 0 || t == i + 1 || t + 1 == rest.size()) {
    return Invalid(absl::StrCat("dataset \"", dataset,
                                "\" is malformed (want hdf5:FILE:INPUTS:TARGETS, e.g. "
                                "hdf5:/data/era5.h5:/fields:/next)"));
  }
  return Hdf5Dataset{rest.substr(0, i), rest.substr(i + 1, t - i - 1), rest.substr(t + 1)};
}

absl::StatusOr<SyntheticSpec> ParseSynthetic(const std::string& dataset) {
  std::vector<std::string> parts = absl::StrSplit(dataset, ':');
  auto bad = [&](const std::string& why) {
    return Invalid(absl::StrCat("dataset \"", dataset, "\": ", why,
                                " (want synthetic:CxHxW:CLASSES:N, e.g. synthetic:3x224x224:1000:12800)"));
  };
  if (parts.size() != 4 || parts[0] != "synthetic") return bad("malformed");
  std::vector<std::string> dims = absl::StrSplit(parts[1], 'x');
  SyntheticSpec s;
  if (dims.size() != 3 || !absl::SimpleAtoi(dims[0], &s.channels) ||
      !absl::SimpleAtoi(dims[1], &s.height) || !absl::SimpleAtoi(dims[2], &s.width)) {
    return bad("the shape is not CxHxW");
  }
  if (s.channels < 1 || s.channels > 64 || s.height < 1 || s.height > 1024 || s.width < 1 ||
      s.width > 1024) {
    return bad("the shape is out of range");
  }
  if (!absl::SimpleAtoi(parts[2], &s.classes) || s.classes < 2 || s.classes > 100000) {
    return bad("classes must be 2..100000");
  }
  if (!absl::SimpleAtoi(parts[3], &s.size) || s.size < 1 || s.size > 10000000) {
    return bad("the number of images must be 1..10000000");
  }
  return s;
}

absl::StatusOr<ResourceEstimate> EstimateResources(const v1::JobSpec& spec) {
  // The input's shape and size: fashion-mnist is 60,000 + 10,000 images of 1x28x28 in 10
  // classes (Xiao et al. 2017); synthetic sets say theirs; files are read by the workers.
  int64_t c = 1, h = 28, w = 28, classes = 10, train = 0, test = 0;
  if (spec.dataset() == "fashion-mnist") {
    train = 60000;
    test = 10000;
  } else if (absl::StartsWith(spec.dataset(), "synthetic:")) {
    absl::StatusOr<SyntheticSpec> syn = ParseSynthetic(spec.dataset());
    if (!syn.ok()) return syn.status();
    c = syn->channels, h = syn->height, w = syn->width, classes = syn->classes;
    train = syn->size;
    test = std::max<int64_t>(1, syn->size / 10);  // see SyntheticSpec
  } else if (absl::StartsWith(spec.dataset(), "imagefolder:")) {
    // RGB at the transform's side; the classes are the folder's (unknown here).
    c = 3;
    h = w = spec.augment().size() > 0 ? spec.augment().size() : 224;
  }
  if (spec.max_train_samples() > 0 && train > 0) train = std::min(train, spec.max_train_samples());
  if (spec.max_test_samples() > 0 && test > 0) test = std::min(test, spec.max_test_samples());
  const int64_t features = c * h * w;
  // Parameter counts of worker/models/models.cc, in closed form; saturating, so that
  // absurd widths give a huge estimate, not an overflow.
  const auto mul = [](int64_t a, int64_t b) -> int64_t {
    if (a != 0 && b > INT64_MAX / 4 / a) return INT64_MAX / 4;
    return a * b;
  };
  int64_t params = 0;
  if (spec.model() == "logreg") {
    params = mul(features, classes) + classes;
  } else if (spec.model() == "mlp") {
    int64_t in = features;
    for (int32_t width : spec.hidden_sizes()) {
      params = std::min(INT64_MAX / 4, params + mul(in, width) + width);
      in = width;
    }
    params = std::min(INT64_MAX / 4, params + mul(in, classes) + classes);
  } else if (spec.model() == "cnn") {
    const int64_t ph = std::max<int64_t>(0, (h - 4) / 2), pw = std::max<int64_t>(0, (w - 4) / 2);
    params = (c * 9 * 32 + 32) + (32 * 9 * 64 + 64) + mul(64 * ph * pw, 128) + 128 +
             128 * classes + classes;
  } else if (spec.model() == "resnet18" || spec.model() == "resnet50") {
    // torchvision's, without the stem's 7x7 convolution (its input channels vary) and the
    // fc; models_test builds every model and holds these to its count.
    const int64_t stem = 64 * c * 7 * 7;
    params = spec.model() == "resnet18" ? 11'167'104 + stem + 512 * classes + classes
                                        : 23'498'624 + stem + 2048 * classes + classes;
  }
  ResourceEstimate e;
  e.parameters = params;
  e.model_bytes = mul(params, 4 * 4);
  if (spec.algorithm() == "ga") {
    // An island's genomes (a genome is the model's parameters), with the copies Evolve makes
    // of them (parents drawn, children, the next generation): 4 float32 copies (ga.cc).
    const int64_t island = std::max(1, spec.ga().population()) / std::max(1, spec.workers());
    e.ga_island_floats = mul(params, std::max<int64_t>(1, island));
    e.model_bytes = mul(e.ga_island_floats, 4 * 4);
  }
  e.dataset_bytes = mul(train + test, features * 4 + 8);
  return e;
}

absl::Status CheckUnderRoots(const std::string& path, const std::vector<std::string>& roots) {
  return ResolveUnderRoots(path, roots).status();
}

absl::Status ResolveUserPaths(v1::JobSpec& spec, const std::vector<std::string>& roots) {
  for (absl::string_view prefix : {"idx:", "csv:", "imagefolder:"}) {
    if (!absl::StartsWith(spec.dataset(), prefix)) continue;
    absl::StatusOr<std::string> p =
        ResolveUnderRoots(spec.dataset().substr(prefix.size()), roots);
    if (!p.ok()) return p.status();
    spec.set_dataset(absl::StrCat(prefix, *p));
  }
  if (absl::StartsWith(spec.dataset(), "hdf5:")) {
    absl::StatusOr<Hdf5Dataset> h = ParseHdf5Dataset(spec.dataset());
    if (!h.ok()) return h.status();
    absl::StatusOr<std::string> p = ResolveUnderRoots(h->file, roots);
    if (!p.ok()) return p.status();
    spec.set_dataset(absl::StrCat("hdf5:", *p, ":", h->inputs, ":", h->targets));
  }
  if (absl::StartsWith(spec.model(), "torchscript:")) {
    absl::StatusOr<std::string> p = ResolveUnderRoots(spec.model().substr(12), roots);
    if (!p.ok()) return p.status();
    spec.set_model(absl::StrCat("torchscript:", *p));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveUnderRoots(const std::string& path,
                                              const std::vector<std::string>& roots) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) return Invalid(absl::StrCat("path \"", path, "\" cannot be resolved: ", ec.message()));
  for (const std::string& root : roots) {
    std::error_code rec;
    const fs::path r = fs::weakly_canonical(fs::absolute(root, rec), rec);
    if (rec) continue;
    auto [root_end, _] = std::mismatch(r.begin(), r.end(), p.begin(), p.end());
    if (root_end == r.end()) return p.string();
  }
  return Invalid(absl::StrCat("path \"", path, "\" (", p.string(),
                              ") is outside the allowed data roots (", absl::StrJoin(roots, ", "),
                              ")"));
}

namespace {

// Every string and map field: UTF-8 without controls, within its bound.
absl::Status CheckStrings(v1::JobSpec& spec, const SpecLimits& limits) {
  // Strings first: the messages below quote them.
  if (absl::Status s = CheckText("name", spec.name(), limits.max_name_bytes); !s.ok()) return s;
  if (absl::Status s = CheckText("model", spec.model(), limits.max_path_bytes); !s.ok()) return s;
  if (absl::Status s = CheckText("dataset", spec.dataset(), limits.max_path_bytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckText("optimizer.name", spec.optimizer().name(), 64); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckText("lr_scaling", spec.lr_scaling(), 64); !s.ok()) return s;
  if (static_cast<size_t>(spec.labels_size()) > limits.max_labels) {
    return Invalid(absl::StrCat("labels has ", spec.labels_size(), " entries, more than ",
                                limits.max_labels));
  }
  for (const auto& [key, value] : spec.labels()) {
    const std::string quoted = absl::StrCat("labels[\"", SanitizeUtf8(key, 64), "\"]");
    if (key.empty()) return Invalid("labels has an empty key");
    if (absl::Status s = CheckText(absl::StrCat(quoted, " key"), key, limits.max_label_key_bytes);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckText(quoted, value, limits.max_label_value_bytes); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// model, dataset, world size and device kind.
absl::Status CheckModelDataAndGang(v1::JobSpec& spec, const SpecLimits& limits) {
  constexpr const char* kModels = "logreg, mlp, cnn, resnet18, resnet50 or torchscript:FILE";
  if (spec.model().empty()) return Invalid(absl::StrCat("model is empty (want ", kModels, ")"));
  if (!IsKnownModel(spec.model())) {
    const std::string near = ClosestMatch(
        spec.model(), {"logreg", "mlp", "cnn", "resnet18", "resnet50", "torchscript:"});
    return Invalid(absl::StrCat("model \"", SanitizeUtf8(spec.model(), 128), "\" is unknown",
                                near.empty() ? "" : absl::StrCat(" (did you mean \"", near, "\"?)"),
                                " (want ", kModels, ")"));
  }
  if (spec.dataset().empty()) return Invalid("dataset is empty (want fashion-mnist or idx:DIR)");
  std::string dir;
  if (absl::Status s = ResolveDataset(spec.dataset(), "", &dir); !s.ok()) return s;

  if (spec.workers() < 1 || spec.workers() > limits.max_workers) {
    return Invalid(absl::StrCat("workers ", spec.workers(), " is out of range [1, ",
                                limits.max_workers, "]"));
  }
  if (spec.device_kind() == v1::DEVICE_KIND_UNSPECIFIED) {
    spec.set_device_kind(v1::DEVICE_KIND_CPU);
  }
  if (!v1::DeviceKind_IsValid(spec.device_kind())) {
    return Invalid(absl::StrCat("device_kind ", spec.device_kind(), " is unknown"));
  }
  return absl::OkStatus();
}

// Batch sizes of Huber et al.: GBS = LBS x workers x accumulation_steps; derives the
// missing one.
absl::Status NormalizeBatches(v1::JobSpec& spec, const SpecLimits& limits) {
  if (spec.accumulation_steps() < 0 || spec.accumulation_steps() > 1024) {
    return Invalid(absl::StrCat("accumulation_steps ", spec.accumulation_steps(),
                                " is out of range [0, 1024]"));
  }
  if (spec.accumulation_steps() == 0) spec.set_accumulation_steps(1);
  // Ranks x micro-batches: the number of local batches one step's global batch holds.
  const int64_t n = int64_t{spec.workers()} * spec.accumulation_steps();
  int64_t gbs = spec.global_batch_size();
  int64_t lbs = spec.local_batch_size();
  if (gbs < 0) return Invalid(absl::StrCat("global_batch_size ", gbs, " is negative"));
  if (lbs < 0) return Invalid(absl::StrCat("local_batch_size ", lbs, " is negative"));
  if (gbs == 0 && lbs == 0) {
    return Invalid("global_batch_size and local_batch_size are both unset; give one");
  }
  const std::string by = spec.accumulation_steps() == 1
                           ? absl::StrCat("workers ", spec.workers())
                           : absl::StrCat("workers ", spec.workers(), " x accumulation_steps ",
                                          spec.accumulation_steps());
  if (gbs > 0 && gbs % n != 0) {
    return Invalid(absl::StrCat("global_batch_size ", gbs, " is not divisible by ", by));
  }
  if (gbs > 0 && lbs > 0 && gbs != lbs * n) {
    return Invalid(absl::StrCat("global_batch_size ", gbs, " != local_batch_size ", lbs,
                                " x ", by));
  }
  if (gbs == 0) gbs = lbs * n;
  if (lbs == 0) lbs = gbs / n;
  if (lbs > limits.max_batch_size || gbs > limits.max_batch_size) {
    return Invalid(absl::StrCat("global_batch_size ", gbs, " exceeds the limit ",
                                limits.max_batch_size));
  }
  spec.set_global_batch_size(static_cast<int32_t>(gbs));
  spec.set_local_batch_size(static_cast<int32_t>(lbs));
  return absl::OkStatus();
}

// Epochs, the optimizer and the learning-rate schedule.
absl::Status CheckLrSchedule(v1::JobSpec& spec);

// What one optimizer takes: its own fields within their ranges (a 0 is PyTorch's default,
// filled in here so that the stored spec says what ran), the others' left unset.
absl::Status CheckOptimizerKind(v1::OptimizerSpec& opt) {
  const std::string& name = opt.name();
  auto only_for = [&](bool set, const char* field, const char* owners) -> absl::Status {
    if (!set) return absl::OkStatus();
    return Invalid(absl::StrCat("optimizer.", field, " is for ", owners, ", not ", name));
  };
  const bool sgd = name == "sgd", adamw = name == "adamw", lars = name == "lars";
  for (absl::Status s :
       {only_for(!sgd && opt.nesterov(), "nesterov", "sgd"),
        only_for(!sgd && opt.decoupled_weight_decay(), "decoupled_weight_decay", "sgd"),
        only_for(!adamw && opt.beta1() != 0, "beta1", "adamw"),
        only_for(!adamw && opt.beta2() != 0, "beta2", "adamw"),
        only_for(sgd && opt.eps() != 0, "eps", "adamw and lars"),
        only_for(!lars && opt.trust_coefficient() != 0, "trust_coefficient", "lars"),
        only_for(adamw && opt.momentum() != 0, "momentum", "sgd and lars (adamw has beta1)")}) {
    if (!s.ok()) return s;
  }
  if (opt.nesterov() && opt.momentum() <= 0) {
    return Invalid("optimizer.nesterov needs a momentum > 0 (as torch.optim.SGD)");
  }
  auto in_open_unit = [](double v) { return std::isfinite(v) && v > 0 && v < 1; };
  if (!opt.has_weight_decay()) opt.set_weight_decay(adamw ? 0.01 : 0.0);
  if (adamw) {
    if (opt.beta1() == 0) opt.set_beta1(0.9);
    if (opt.beta2() == 0) opt.set_beta2(0.999);
    for (auto [field, v] : {std::pair{"beta1", opt.beta1()}, std::pair{"beta2", opt.beta2()}}) {
      if (!in_open_unit(v)) {
        return Invalid(absl::StrCat("optimizer.", field, " ", v, " is out of range (0, 1)"));
      }
    }
  }
  if (adamw || lars) {
    if (opt.eps() == 0) opt.set_eps(1e-8);
    if (!std::isfinite(opt.eps()) || opt.eps() <= 0 || opt.eps() > 1e-2) {
      return Invalid(absl::StrCat("optimizer.eps ", opt.eps(), " is out of range (0, 0.01]"));
    }
  }
  if (lars) {
    if (opt.trust_coefficient() == 0) opt.set_trust_coefficient(0.001);
    if (!std::isfinite(opt.trust_coefficient()) || opt.trust_coefficient() <= 0 ||
        opt.trust_coefficient() > 1) {
      return Invalid(absl::StrCat("optimizer.trust_coefficient ", opt.trust_coefficient(),
                                  " is out of range (0, 1]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSchedule(v1::JobSpec& spec, const SpecLimits& limits) {
  if (spec.epochs() < 1 || spec.epochs() > limits.max_epochs) {
    return Invalid(absl::StrCat("epochs ", spec.epochs(), " is out of range [1, ",
                                limits.max_epochs, "]"));
  }

  v1::OptimizerSpec* opt = spec.mutable_optimizer();
  if (opt->name().empty()) opt->set_name("sgd");
  if (opt->name() != "sgd" && opt->name() != "adamw" && opt->name() != "lars") {
    return Invalid(absl::StrCat("optimizer.name \"", opt->name(),
                                "\" is unknown (want sgd, adamw or lars)"));
  }
  if (!std::isfinite(opt->lr()) || opt->lr() <= 0 || opt->lr() > limits.max_lr) {
    return Invalid(absl::StrCat("optimizer.lr ", opt->lr(), " is out of range (0, ",
                                limits.max_lr, "]"));
  }
  if (!std::isfinite(opt->momentum()) || opt->momentum() < 0 || opt->momentum() >= 1) {
    return Invalid(absl::StrCat("optimizer.momentum ", opt->momentum(),
                                " is out of range [0, 1)"));
  }
  if (!std::isfinite(opt->weight_decay()) || opt->weight_decay() < 0) {
    return Invalid(absl::StrCat("optimizer.weight_decay ", opt->weight_decay(),
                                " is negative or not finite"));
  }
  if (absl::Status s = CheckOptimizerKind(*opt); !s.ok()) return s;

  if (spec.lr_scaling().empty()) spec.set_lr_scaling("none");
  if (spec.lr_scaling() != "none" && spec.lr_scaling() != "linear") {
    return Invalid(absl::StrCat("lr_scaling \"", spec.lr_scaling(),
                                "\" is unknown (want none or linear)"));
  }
  if (!std::isfinite(spec.lr_warmup_epochs()) || spec.lr_warmup_epochs() < 0 ||
      spec.lr_warmup_epochs() > spec.epochs()) {
    return Invalid(absl::StrCat("lr_warmup_epochs ", spec.lr_warmup_epochs(),
                                " is out of range [0, epochs]"));
  }
  if (spec.top_k() != 0 && (spec.top_k() < 2 || spec.top_k() > 1000)) {
    return Invalid(absl::StrCat("top_k ", spec.top_k(),
                                " is out of range [2, 1000] (0: top-1 only)"));
  }
  return CheckLrSchedule(spec);
}

// The learning-rate schedule after the warm-up (worker/train/lr_schedule.h): a known
// name, and each of its fields in its range (0 where a default is documented).
absl::Status CheckLrSchedule(v1::JobSpec& spec) {
  v1::LrScheduleSpec* s = spec.mutable_lr_schedule();
  if (absl::Status t = CheckText("lr_schedule.name", s->name(), 64); !t.ok()) return t;
  if (s->name().empty()) s->set_name("constant");
  const std::string& name = s->name();
  if (name != "constant" && name != "step" && name != "cosine" && name != "plateau") {
    return Invalid(absl::StrCat("lr_schedule.name \"", name,
                                "\" is unknown (want constant, step, cosine or plateau)"));
  }
  if (name == "step" && (s->step_epochs() < 1 || s->step_epochs() > spec.epochs())) {
    return Invalid(absl::StrCat("lr_schedule.step_epochs ", s->step_epochs(),
                                " is out of range [1, epochs] for a step schedule"));
  }
  if (!std::isfinite(s->gamma()) || s->gamma() < 0 || s->gamma() > 1) {
    return Invalid(absl::StrCat("lr_schedule.gamma ", s->gamma(),
                                " is out of range [0, 1] (0: 0.1)"));
  }
  if (!std::isfinite(s->min_lr()) || s->min_lr() < 0 || s->min_lr() > spec.optimizer().lr()) {
    return Invalid(absl::StrCat("lr_schedule.min_lr ", s->min_lr(),
                                " is out of range [0, optimizer.lr]"));
  }
  if (!std::isfinite(s->factor()) || s->factor() < 0 || s->factor() >= 1) {
    return Invalid(absl::StrCat("lr_schedule.factor ", s->factor(),
                                " is out of range [0, 1) (0: 0.1)"));
  }
  if (s->has_patience() && (s->patience() < 0 || s->patience() > 1000000)) {
    return Invalid(absl::StrCat("lr_schedule.patience ", s->patience(),
                                " is out of range [0, 1000000]"));
  }
  if (!std::isfinite(s->threshold()) || s->threshold() < 0 || s->threshold() >= 1) {
    return Invalid(absl::StrCat("lr_schedule.threshold ", s->threshold(),
                                " is out of range [0, 1) (0: 1e-4)"));
  }
  return absl::OkStatus();
}

// PowerSGD's rank: far above what compresses any of the models (a matrix is compressed only
// while (rows + columns) x R x 2 < rows x columns), so only typing errors are refused.
constexpr int kMaxPowerSgdRank = 1024;

// The sync strategy and its parameters.
absl::Status CheckSync(v1::JobSpec& spec, const SpecLimits& limits) {
  v1::SyncSpec* sync = spec.mutable_sync();
  if (sync->strategy() == v1::SYNC_STRATEGY_UNSPECIFIED) {
    sync->set_strategy(v1::SYNC_STRATEGY_ALLREDUCE);
  }
  if (!v1::SyncStrategy_IsValid(sync->strategy())) {
    return Invalid(absl::StrCat("sync.strategy ", sync->strategy(), " is unknown"));
  }
  if (sync->strategy() == v1::SYNC_STRATEGY_LOCAL_SGD) {
    if (sync->period() < 1 || sync->period() > 1000000) {
      return Invalid(absl::StrCat("sync.period ", sync->period(),
                                  " is out of range [1, 1000000] for local SGD"));
    }
    if (sync->warmup_steps() < 0) {
      return Invalid(absl::StrCat("sync.warmup_steps ", sync->warmup_steps(), " is negative"));
    }
  } else if (sync->strategy() == v1::SYNC_STRATEGY_POWERSGD) {
    if (sync->powersgd_rank() < 0 || sync->powersgd_rank() > kMaxPowerSgdRank) {
      return Invalid(absl::StrCat("sync.powersgd_rank ", sync->powersgd_rank(),
                                  " is out of range [1, ", kMaxPowerSgdRank, "] (0: 1)"));
    }
    if (sync->warmup_steps() < 0) {
      return Invalid(absl::StrCat("sync.warmup_steps ", sync->warmup_steps(), " is negative"));
    }
    if (sync->period() != 0 || sync->average_momentum()) {
      return Invalid(
          "sync.period and sync.average_momentum apply to SYNC_STRATEGY_LOCAL_SGD "
          "only");
    }
    if (sync->fp16_compression()) {
      return Invalid(
          "sync.fp16_compression and PowerSGD are two compressions; PowerSGD's "
          "factors travel as float32: choose one");
    }
    if (spec.algorithm() == "ga") {
      return Invalid(
          "algorithm ga exchanges individuals, not gradients: PowerSGD does not "
          "apply");
    }
    if (sync->bucket_bytes() != 0 && sync->warmup_steps() == 0) {
      return Invalid(
          "sync.bucket_bytes sizes the exact allreduce's buckets; PowerSGD without warm-up "
          "steps has none and would ignore it");
    }
  } else if (sync->period() != 0 || sync->warmup_steps() != 0 || sync->average_momentum()) {
    return Invalid(
        "sync.period, sync.warmup_steps and sync.average_momentum apply to "
        "SYNC_STRATEGY_LOCAL_SGD only (sync.warmup_steps to POWERSGD too)");
  }
  if (sync->powersgd_rank() != 0 && sync->strategy() != v1::SYNC_STRATEGY_POWERSGD) {
    return Invalid("sync.powersgd_rank applies to SYNC_STRATEGY_POWERSGD only");
  }
  // What a strategy would ignore is refused, not ignored (issue 23): local SGD averages
  // parameters in fp32 and compresses only its warm-up's gradient allreduces; NCCL's
  // gradient sync (GPU jobs) has no fp16 wire format.
  if (sync->fp16_compression() && sync->strategy() == v1::SYNC_STRATEGY_LOCAL_SGD &&
      sync->warmup_steps() == 0) {
    return Invalid("sync.fp16_compression compresses allreduce gradients; local SGD without "
                   "warm-up steps averages parameters only and would ignore it");
  }
  if (sync->fp16_compression() && spec.device_kind() == v1::DEVICE_KIND_GPU) {
    return Invalid("sync.fp16_compression is for CPU jobs (Gloo and shared memory); a GPU "
                   "job's NCCL allreduce would ignore it");
  }
  if (sync->bucket_bytes() < 0) {
    return Invalid(absl::StrCat("sync.bucket_bytes ", sync->bucket_bytes(), " is negative"));
  }
  return absl::OkStatus();
}

// algorithm ga: its defaults filled, every field in range, and what it does not do yet.
absl::Status CheckGeneticAlgorithm(v1::JobSpec& spec) {
  if (spec.algorithm() != "ga") return absl::OkStatus();
  if (spec.model() != "logreg" && spec.model() != "mlp") {
    return Invalid(absl::StrCat("algorithm ga evolves logreg or mlp weights; model \"",
                                spec.model(), "\" trains with sgd"));
  }
  v1::GaSpec* ga = spec.mutable_ga();
  if (ga->population() == 0) {  // 64, or the next multiple of the workers
    const int w = std::max(1, spec.workers());
    ga->set_population(std::max(64, 2 * w) + (w - std::max(64, 2 * w) % w) % w);
  }
  if (!ga->has_generations()) ga->set_generations(100);
  if (!ga->has_mutation_rate()) ga->set_mutation_rate(0.05);
  if (!ga->has_crossover_rate()) ga->set_crossover_rate(0.5);
  if (ga->mutation_scale() == 0) ga->set_mutation_scale(0.1);
  if (ga->fitness_batch() == 0) ga->set_fitness_batch(256);
  const auto bad = [](const char* field, auto value, const std::string& range) {
    return Invalid(absl::StrCat("ga.", field, " ", value, " is out of range ", range));
  };
  if (ga->population() < 2 || ga->population() > 100000) {
    return bad("population", ga->population(), "[2, 100000]");
  }
  if (ga->generations() < 1 || ga->generations() > 10000000) {
    return bad("generations", ga->generations(), "[1, 10000000]");
  }
  if (!std::isfinite(ga->mutation_rate()) || ga->mutation_rate() < 0 || ga->mutation_rate() > 1) {
    return bad("mutation_rate", ga->mutation_rate(), "[0, 1]");
  }
  if (!std::isfinite(ga->mutation_scale()) || ga->mutation_scale() <= 0 ||
      ga->mutation_scale() > 100) {
    return bad("mutation_scale", ga->mutation_scale(), "(0, 100]");
  }
  if (!std::isfinite(ga->crossover_rate()) || ga->crossover_rate() < 0 ||
      ga->crossover_rate() > 1) {
    return bad("crossover_rate", ga->crossover_rate(), "[0, 1]");
  }
  // The population is the job's, split evenly over the islands (one per worker), so that
  // 1 worker x T threads and N workers do the same work.
  const int workers = std::max(1, spec.workers());
  if (ga->population() % workers != 0 || ga->population() / workers < 2) {
    return Invalid(absl::StrCat("ga.population ", ga->population(),
                                " does not split into islands of at least 2 over ", workers,
                                " workers (it must be a multiple of the workers)"));
  }
  const int island = ga->population() / workers;
  if (ga->elite() < 0 || ga->elite() >= island) {
    return bad("elite", ga->elite(), absl::StrCat("[0, ", island, ") (an island's population)"));
  }
  if (ga->migration_interval() < 0) return bad("migration_interval", ga->migration_interval(), ">= 0");
  if (ga->migration_size() < 0 || ga->migration_size() >= island) {
    return bad("migration_size", ga->migration_size(),
               absl::StrCat("[0, ", island, ") (an island's population)"));
  }
  if (ga->fitness_batch() < 1 || ga->fitness_batch() > (1 << 20)) {
    return bad("fitness_batch", ga->fitness_batch(), "[1, 1048576]");
  }
  // One generation scores population x batch examples at once (logits of that many rows):
  // bounded so that it fits a worker's memory whatever the dataset (2^24 rows x classes).
  if (static_cast<int64_t>(ga->population()) * ga->fitness_batch() > (int64_t{1} << 24)) {
    return Invalid(absl::StrCat("ga.population x ga.fitness_batch = ",
                                static_cast<int64_t>(ga->population()) * ga->fitness_batch(),
                                " is over 16777216 (one generation's scores must fit)"));
  }
  // An mlp's hidden activations: population x batch x width floats at once.
  int64_t widest = 1;
  if (spec.model() == "mlp") {
    for (int h : spec.hidden_sizes()) widest = std::max<int64_t>(widest, h);
  }
  if (static_cast<int64_t>(ga->population()) * ga->fitness_batch() * widest > (int64_t{1} << 27)) {
    return Invalid(absl::StrCat("ga.population x ga.fitness_batch x the widest hidden layer = ",
                                static_cast<int64_t>(ga->population()) * ga->fitness_batch() * widest,
                                " is over 134217728 (one generation's activations must fit)"));
  }
  if (ga->migration_size() > 0 && ga->migration_interval() == 0) {
    return Invalid("ga.migration_size is set but ga.migration_interval is 0 (never)");
  }
  // What a ga job does not do yet: said at submit rather than ignored.
  if (spec.device_kind() == v1::DEVICE_KIND_GPU) {
    return Invalid("algorithm ga does not yet take a gpu device_kind");
  }
  return absl::OkStatus();
}

// Hidden layers, threads and how much of the data is used.
absl::Status CheckModelShapeAndData(v1::JobSpec& spec, const SpecLimits& limits) {
  if (spec.model() == "mlp") {
    if (spec.hidden_sizes().empty()) {
      spec.add_hidden_sizes(512);
      spec.add_hidden_sizes(256);
    }
    if (spec.hidden_sizes_size() > limits.max_hidden_layers) {
      return Invalid(absl::StrCat("hidden_sizes has ", spec.hidden_sizes_size(),
                                  " layers, more than ", limits.max_hidden_layers));
    }
    for (int i = 0; i < spec.hidden_sizes_size(); ++i) {
      int32_t w = spec.hidden_sizes(i);
      if (w < 1 || w > limits.max_hidden_width) {
        return Invalid(absl::StrCat("hidden_sizes[", i, "] ", w, " is out of range [1, ",
                                    limits.max_hidden_width, "]"));
      }
    }
  } else if (!spec.hidden_sizes().empty()) {
    return Invalid(absl::StrCat("hidden_sizes is set but model \"", spec.model(),
                                "\" has no configurable hidden layers"));
  }
  if (spec.intra_op_threads() < 0 || spec.intra_op_threads() > limits.max_intra_op_threads) {
    return Invalid(absl::StrCat("intra_op_threads ", spec.intra_op_threads(),
                                " is out of range [0, ", limits.max_intra_op_threads, "]"));
  }
  if (spec.max_train_samples() < 0) {
    return Invalid(absl::StrCat("max_train_samples ", spec.max_train_samples(), " is negative"));
  }
  if (spec.dataset_fraction() < 0 || spec.dataset_fraction() > 1000000) {
    return Invalid(absl::StrCat("dataset_fraction ", spec.dataset_fraction(),
                                " is out of range [0, 1000000]"));
  }
  if (spec.max_test_samples() < 0) {
    return Invalid(absl::StrCat("max_test_samples ", spec.max_test_samples(), " is negative"));
  }
  if (!std::isfinite(spec.target_accuracy()) || spec.target_accuracy() < 0 ||
      spec.target_accuracy() > 1) {
    return Invalid(absl::StrCat("target_accuracy ", spec.target_accuracy(),
                                " is out of range [0, 1] (a fraction: 0.85 for 85%)"));
  }
  if (!spec.algorithm().empty() && spec.algorithm() != "sgd" && spec.algorithm() != "ga") {
    return Invalid(absl::StrCat("algorithm \"", SanitizeUtf8(spec.algorithm(), 64),
                                "\" is unknown (want sgd or ga)"));
  }
  if (absl::Status st = CheckGeneticAlgorithm(spec); !st.ok()) return st;
  // An island's genomes must fit where the worker would refuse them (ga.cc): said at
  // submit where the data's shape is known (issue 23: accepted, then failed on the worker).
  if (spec.algorithm() == "ga") {
    absl::StatusOr<ResourceEstimate> need = EstimateResources(spec);
    if (need.ok() && need->ga_island_floats > kMaxGaIslandFloats) {
      return Invalid(absl::StrCat(
          "ga: an island of ", spec.ga().population() / std::max(1, spec.workers()),
          " genomes of ", need->parameters, " weights is ", need->ga_island_floats,
          " floats, over ", kMaxGaIslandFloats, " (1 GiB): use a smaller ga.population, "
          "more workers or smaller hidden_sizes"));
    }
  }
  if (spec.resume_from_job() < 0) {
    return Invalid(absl::StrCat("resume_from_job ", spec.resume_from_job(),
                                " is not a job id (0 = start from scratch)"));
  }
  // 1 PJ: far above any job (a 1000-GPU cluster at 1 MW for 11 days is 1 PJ).
  if (!std::isfinite(spec.energy_budget_joules()) || spec.energy_budget_joules() < 0 ||
      spec.energy_budget_joules() > 1e15) {
    return Invalid(absl::StrCat("energy_budget_joules ", spec.energy_budget_joules(),
                                " is out of range [0, 1e15] (joules; 0 = no budget)"));
  }
  if (spec.max_train_samples() > 0 && spec.max_train_samples() < spec.global_batch_size()) {
    return Invalid(absl::StrCat("max_train_samples ", spec.max_train_samples(),
                                " is smaller than one global batch (", spec.global_batch_size(), ")"));
  }
  return absl::OkStatus();
}

// A carbon-aware start's deadline (issue 31); whether it lies ahead is the coordinator's
// to say (it holds the clock).
absl::Status CheckCarbonAware(const v1::JobSpec& spec) {
  const bool before = spec.start_before_unix_ms() != 0, by = spec.finish_by_unix_ms() != 0;
  const double run = spec.expected_run_seconds();
  if (!std::isfinite(run) || run < 0 || run > 366 * 86400.0) {
    return Invalid(absl::StrCat("expected_run_seconds ", run,
                                " is out of range [0, 366 days] (seconds; 0 = unknown)"));
  }
  if (!spec.carbon_aware()) {
    if (before || by) {
      return Invalid(
          "start_before and finish_by are a carbon-aware job's deadline: set "
          "carbon_aware (joule submit --carbon-aware)");
    }
    return absl::OkStatus();
  }
  if (before == by) {
    return Invalid(
        "a carbon_aware job needs one deadline: start_before (the latest start) or "
        "finish_by (the time its run must end by)");
  }
  // Up to the year 2200 (kMaxIntensityTimeMs): later ones overflow the arithmetic on them.
  if (spec.start_before_unix_ms() < 0 || spec.finish_by_unix_ms() < 0 ||
      spec.start_before_unix_ms() > kMaxIntensityTimeMs ||
      spec.finish_by_unix_ms() > kMaxIntensityTimeMs) {
    return Invalid("start_before and finish_by are Unix ms from 1970 to the year 2200");
  }
  if (by && !(run > 0)) {
    return Invalid(
        "finish_by needs expected_run_seconds (the run's length to plan for: "
        "joule submit sets it from the estimate, or --expected-duration)");
  }
  return absl::OkStatus();
}

// Checkpoints, restarts, and the size of the whole spec.
absl::Status CheckCheckpointsAndSize(v1::JobSpec& spec, const SpecLimits& limits) {
  if (spec.checkpoint_every_steps() < 0 || spec.checkpoint_every_epochs() < 0) {
    return Invalid(absl::StrCat("checkpoint_every_steps ", spec.checkpoint_every_steps(),
                                " and checkpoint_every_epochs ", spec.checkpoint_every_epochs(),
                                " must not be negative"));
  }
  if (spec.keep_checkpoints() < 0 || spec.keep_checkpoints() > 100) {
    return Invalid(absl::StrCat("keep_checkpoints ", spec.keep_checkpoints(),
                                " is out of range [0, 100]"));
  }
  if (spec.keep_checkpoints() == 0) spec.set_keep_checkpoints(2);
  if (spec.max_restarts() < 0 || spec.max_restarts() > limits.max_restarts) {
    return Invalid(absl::StrCat("max_restarts ", spec.max_restarts(), " is out of range [0, ",
                                limits.max_restarts, "]"));
  }
  if (spec.no_restarts()) {
    spec.set_max_restarts(0);
  } else if (spec.max_restarts() == 0) {
    spec.set_max_restarts(3);
  }
  if (spec.ByteSizeLong() > kMaxSpecBytes) {
    return Invalid(absl::StrCat("the spec is ", spec.ByteSizeLong(), " bytes serialized, more than ",
                                kMaxSpecBytes));
  }
  return absl::OkStatus();
}

// The figure the report's targets are read from (JobSpec.target_metric): known, measured
// by this job, and given a value of its kind. Its default is filled in.
absl::Status CheckTarget(v1::JobSpec& spec, bool regression) {
  if (spec.target_metric().empty())
    spec.set_target_metric(regression ? "test_rmse" : "test_accuracy");
  const TargetMetric* metric = FindTargetMetric(spec.target_metric());
  if (metric == nullptr) {
    return Invalid(absl::StrCat("target_metric \"", SanitizeUtf8(spec.target_metric(), 64),
                                "\" is unknown (want one of ", TargetMetricNames(), ")"));
  }
  if (!std::isfinite(spec.target_loss()) || spec.target_loss() < 0) {
    return Invalid(absl::StrCat("target_loss ", spec.target_loss(), " is not a finite value >= 0"));
  }
  const std::string name(metric->name);
  if (metric->lower_is_better && spec.target_accuracy() != 0) {
    return Invalid(absl::StrCat("target_metric ", name,
                                " is a loss: give target_loss, "
                                "not target_accuracy"));
  }
  if (!metric->lower_is_better && spec.target_loss() != 0) {
    return Invalid(absl::StrCat("target_metric ", name,
                                " is an accuracy: give "
                                "target_accuracy, not target_loss"));
  }
  if (absl::StrContains(name, "top_k") && spec.top_k() == 0) {
    return Invalid(absl::StrCat("target_metric ", name, " needs top_k (e.g. 5)"));
  }
  if (absl::StartsWith(name, "train_") && !spec.evaluate_train()) {
    return Invalid(absl::StrCat("target_metric ", name, " needs evaluate_train: true"));
  }
  if (spec.algorithm() == "ga" && name != "test_accuracy" && name != "test_loss") {
    return Invalid(absl::StrCat("target_metric ", name,
                                ": algorithm ga measures only "
                                "test_accuracy and test_loss"));
  }
  if (regression && !metric->lower_is_better) {
    return Invalid(absl::StrCat("target_metric ", name,
                                " is for classification; an hdf5: "
                                "regression targets test_rmse, test_loss or train_eval_loss"));
  }
  if (!regression && name == "test_rmse") {
    return Invalid(
        "target_metric test_rmse is for an hdf5: regression (a classification "
        "targets test_loss, the cross-entropy)");
  }
  return absl::OkStatus();
}

// The loss: cross-entropy for the classification datasets, the (latitude-weighted) mean
// squared error for an hdf5: regression (which needs a TorchScript model mapping inputs to
// targets); and the targets of either.
absl::Status CheckLoss(v1::JobSpec& spec) {
  const bool regression = absl::StartsWith(spec.dataset(), "hdf5:");
  if (spec.stage().empty()) spec.set_stage("none");
  if (spec.stage() != "none" && spec.stage() != "local") {
    return Invalid(absl::StrCat("stage \"", spec.stage(), "\" is unknown (want none or local)"));
  }
  if (spec.stage() == "local" && !regression &&
      !absl::StartsWith(spec.dataset(), "imagefolder:")) {
    return Invalid(absl::StrCat("stage: local copies imagefolder: and hdf5: data; ",
                                spec.dataset(), " is read into memory anyway"));
  }
  if (spec.loss().empty()) spec.set_loss(regression ? "mse" : "cross_entropy");
  if (spec.loss() == "lat_weighted_mse") {
    if (spec.latitude_range_size() == 0) {
      spec.add_latitude_range(90);
      spec.add_latitude_range(-90);
    }
    if (spec.latitude_range_size() != 2) {
      return Invalid(absl::StrCat("latitude_range has ", spec.latitude_range_size(),
                                  " values; want two, the first and last rows' latitudes"));
    }
    const double first = spec.latitude_range(0), last = spec.latitude_range(1);
    for (double lat : {first, last}) {
      if (!std::isfinite(lat) || lat < -90 || lat > 90) {
        return Invalid(absl::StrCat("latitude_range value ", lat, " is not in [-90, 90] degrees"));
      }
    }
    if (first == last) {
      return Invalid(absl::StrCat("latitude_range [", first, ", ", last, "] spans no rows"));
    }
  } else if (spec.latitude_range_size() != 0) {
    return Invalid("latitude_range is for loss: lat_weighted_mse");
  }
  if (absl::Status s = CheckTarget(spec, regression); !s.ok()) return s;
  if (regression) {
    if (spec.loss() != "mse" && spec.loss() != "lat_weighted_mse") {
      return Invalid(absl::StrCat("loss \"", SanitizeUtf8(spec.loss(), 64),
                                  "\" does not fit an hdf5: regression (want mse or "
                                  "lat_weighted_mse)"));
    }
    if (!absl::StartsWith(spec.model(), "torchscript:")) {
      return Invalid(absl::StrCat("an hdf5: regression needs a torchscript: model mapping its "
                                  "inputs to its targets, not ", spec.model()));
    }
    if (spec.algorithm() == "ga") return Invalid("algorithm ga is for classification");
    if (spec.top_k() != 0 || spec.target_accuracy() != 0 || spec.dataset_fraction() > 1) {
      return Invalid("top_k, target_accuracy and dataset_fraction are for classification, "
                     "not an hdf5: regression");
    }
    return absl::OkStatus();
  }
  if (spec.loss() != "cross_entropy") {
    return Invalid(absl::StrCat("loss \"", SanitizeUtf8(spec.loss(), 64),
                                "\" does not fit classification (want cross_entropy; mse "
                                "and lat_weighted_mse are for hdf5: datasets)"));
  }
  return absl::OkStatus();
}

// The image pipeline of an imagefolder: job (AugmentSpec in job.proto): its defaults
// filled in so that the stored spec says what ran; on other datasets, none of it.
absl::Status CheckImagePipeline(v1::JobSpec& spec) {
  const bool folder = absl::StartsWith(spec.dataset(), "imagefolder:");
  if (!folder) {
    if (spec.has_augment() || spec.data_threads() != 0 || spec.has_max_corrupt_images()) {
      return Invalid("augment, data_threads and max_corrupt_images are for imagefolder: "
                     "datasets only");
    }
    return absl::OkStatus();
  }
  if (spec.algorithm() == "ga") {
    return Invalid("algorithm ga trains on datasets held in memory, not imagefolder:");
  }
  if (spec.data_threads() < 0 || spec.data_threads() > 256) {
    return Invalid(absl::StrCat("data_threads ", spec.data_threads(),
                                " is out of range [0, 256] (0: the host's cores / workers)"));
  }
  if (!spec.has_max_corrupt_images()) spec.set_max_corrupt_images(10);
  if (spec.max_corrupt_images() < 0) {
    return Invalid(absl::StrCat("max_corrupt_images ", spec.max_corrupt_images(),
                                " is negative"));
  }
  v1::AugmentSpec* a = spec.mutable_augment();
  if (a->normalize().empty()) a->set_normalize("imagenet");
  if (a->normalize() != "imagenet" && a->normalize() != "none") {
    return Invalid(absl::StrCat("augment.normalize \"", a->normalize(),
                                "\" is unknown (want imagenet or none)"));
  }
  if (a->has_random_resized_crop()) {
    v1::RandomResizedCropSpec* c = a->mutable_random_resized_crop();
    if (c->size() == 0) c->set_size(a->size() > 0 ? a->size() : 224);
    if (a->size() != 0 && a->size() != c->size()) {
      return Invalid(absl::StrCat("augment.size ", a->size(), " and random_resized_crop.size ",
                                  c->size(), " differ"));
    }
    a->set_size(c->size());
    if (c->scale().empty()) {
      c->add_scale(0.08);
      c->add_scale(1.0);
    }
    if (c->ratio().empty()) {
      c->add_ratio(3.0 / 4.0);
      c->add_ratio(4.0 / 3.0);
    }
    if (c->scale_size() != 2 || !(c->scale(0) > 0) || !(c->scale(0) <= c->scale(1)) ||
        !(c->scale(1) <= 1)) {
      return Invalid(absl::StrCat("augment.random_resized_crop.scale [",
                                  absl::StrJoin(c->scale(), ", "),
                                  "] is not [min, max] with 0 < min <= max <= 1"));
    }
    if (c->ratio_size() != 2 || !(c->ratio(0) >= 0.01) || !(c->ratio(0) <= c->ratio(1)) ||
        !(c->ratio(1) <= 100)) {
      return Invalid(absl::StrCat("augment.random_resized_crop.ratio [",
                                  absl::StrJoin(c->ratio(), ", "),
                                  "] is not [min, max] with 0.01 <= min <= max <= 100"));
    }
  }
  if (a->size() == 0) a->set_size(224);
  if (a->size() < 8 || a->size() > 1024) {
    return Invalid(absl::StrCat("augment.size ", a->size(), " is out of range [8, 1024]"));
  }
  if (a->eval_resize() == 0) {
    a->set_eval_resize(static_cast<int32_t>(std::lround(a->size() * 256.0 / 224.0)));
  }
  if (a->eval_resize() < a->size() || a->eval_resize() > 4096) {
    return Invalid(absl::StrCat("augment.eval_resize ", a->eval_resize(),
                                " is out of range [size ", a->size(), ", 4096]"));
  }
  return absl::OkStatus();
}

}  // namespace

double TargetLearningRate(double base_lr, bool linear, int64_t global_batch) {
  return linear ? base_lr * static_cast<double>(global_batch) / 256.0 : base_lr;
}

std::string CheckpointMismatch(const v1::JobSpec& from, const v1::JobSpec& to) {
  const auto optimizer = [](const v1::JobSpec& s) {
    return s.optimizer().name().empty() ? std::string("sgd") : s.optimizer().name();
  };
  const auto algorithm = [](const v1::JobSpec& s) {
    return s.algorithm().empty() ? std::string("sgd") : s.algorithm();
  };
  const std::vector<std::pair<const char*, std::pair<std::string, std::string>>> fields = {
      {"model", {from.model(), to.model()}},
      {"hidden_sizes",
       {absl::StrJoin(from.hidden_sizes(), ","), absl::StrJoin(to.hidden_sizes(), ",")}},
      {"dataset", {from.dataset(), to.dataset()}},
      {"max_train_samples",
       {absl::StrCat(from.max_train_samples()), absl::StrCat(to.max_train_samples())}},
      {"max_test_samples",
       {absl::StrCat(from.max_test_samples()), absl::StrCat(to.max_test_samples())}},
      {"global_batch_size",
       {absl::StrCat(from.global_batch_size()), absl::StrCat(to.global_batch_size())}},
      {"workers", {absl::StrCat(from.workers()), absl::StrCat(to.workers())}},
      {"seed", {absl::StrCat(from.seed()), absl::StrCat(to.seed())}},
      {"optimizer.name", {optimizer(from), optimizer(to)}},
      {"algorithm", {algorithm(from), algorithm(to)}}};
  for (const auto& [field, values] : fields) {
    if (values.first != values.second) {
      return absl::StrCat(field, " ", SanitizeUtf8(values.first, 64), " against ",
                          SanitizeUtf8(values.second, 64));
    }
  }
  return "";
}

absl::Status NormalizeAndValidateSpec(v1::JobSpec& spec, const SpecLimits& limits) {
  // In this order: the messages of later checks quote the strings checked first.
  if (absl::Status s = CheckStrings(spec, limits); !s.ok()) return s;
  if (absl::Status s = CheckModelDataAndGang(spec, limits); !s.ok()) return s;
  if (absl::Status s = NormalizeBatches(spec, limits); !s.ok()) return s;
  if (absl::Status s = CheckSchedule(spec, limits); !s.ok()) return s;
  if (absl::Status s = CheckSync(spec, limits); !s.ok()) return s;
  if (absl::Status s = CheckModelShapeAndData(spec, limits); !s.ok()) return s;
  if (absl::Status s = CheckImagePipeline(spec); !s.ok()) return s;
  if (absl::Status s = CheckLoss(spec); !s.ok()) return s;
  if (absl::Status s = CheckCheckpointsAndSize(spec, limits); !s.ok()) return s;
  if (absl::Status s = CheckCarbonAware(spec); !s.ok()) return s;
  return absl::OkStatus();
}

}  // namespace joule
