#include "client/spec_file.h"

#include <fcntl.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <vector>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/utf8.h"
#include "common/text.h"

namespace joule::client {
namespace {

using google::protobuf::Value;

// Short enum spellings -> the proto enum names, by field.
std::string ExpandEnum(const std::string& key, const std::string& v) {
  std::string upper = absl::AsciiStrToUpper(v);
  if ((key == "device_kind" || key == "deviceKind") && upper.rfind("DEVICE_KIND_", 0) != 0) {
    return "DEVICE_KIND_" + upper;
  }
  if (key == "strategy" && upper.rfind("SYNC_STRATEGY_", 0) != 0) {
    if (upper == "LOCAL-SGD") upper = "LOCAL_SGD";
    return "SYNC_STRATEGY_" + upper;
  }
  return v;
}

// Converts a YAML tree to a protobuf Value, expanding aliases while counting what it expands
// against the limits in spec_file.h. `path` names the node in errors ("optimizer.lr").
class Converter {
 public:
  explicit Converter(const std::string& name) : name_(name) {}

  absl::Status ToValue(const YAML::Node& node, const std::string& key, const std::string& path,
                       int depth, Value* out) {
    if (++values_ > kMaxSpecValues) {
      return Error(absl::StrCat("more than ", kMaxSpecValues,
                                " values once YAML aliases are expanded (a job spec has a few "
                                "dozen; is it a \"billion laughs\" file?)"));
    }
    if (depth > kMaxSpecDepth) {
      // The path of a node that deep is long: its start says where.
      const std::string shown = path.size() > 40 ? path.substr(0, 40) + "..." : path;
      return Error(absl::StrCat(At(node, shown), "nested more than ", kMaxSpecDepth,
                                " levels deep"));
    }
    switch (node.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        out->set_null_value(google::protobuf::NULL_VALUE);
        return absl::OkStatus();
      case YAML::NodeType::Scalar: {
        const std::string& s = node.Scalar();
        scalar_bytes_ += s.size();
        if (scalar_bytes_ > kMaxSpecScalarBytes) {
          return Error(absl::StrCat("more than ", kMaxSpecScalarBytes,
                                    " bytes of values once YAML aliases are expanded"));
        }
        if (absl::Status st = CheckUtf8(s, Where(node, path)); !st.ok()) {
          return Error(std::string(st.message()));
        }
        double d;
        if (node.Tag() != "!" && absl::SimpleAtod(s, &d) && !s.empty() &&
            s.find_first_not_of("0123456789+-.eE") == std::string::npos) {
          if (!std::isfinite(d)) {
            return Error(absl::StrCat(At(node, path), s, " is out of range"));
          }
          out->set_number_value(d);
        } else if (node.Tag() != "!" && (s == "true" || s == "false")) {
          out->set_bool_value(s == "true");
        } else {
          out->set_string_value(ExpandEnum(key, s));
        }
        return absl::OkStatus();
      }
      case YAML::NodeType::Sequence: {
        int i = 0;
        for (const YAML::Node& item : node) {
          if (absl::Status s = ToValue(item, key, absl::StrCat(path, "[", i++, "]"), depth + 1,
                                       out->mutable_list_value()->add_values());
              !s.ok()) {
            return s;
          }
        }
        if (i == 0) out->mutable_list_value();
        return absl::OkStatus();
      }
      case YAML::NodeType::Map:
        out->mutable_struct_value();
        for (const auto& kv : node) {
          if (!kv.first.IsScalar()) {
            return Error(absl::StrCat(At(kv.first, path),
                                      "a key must be a field name, not a list or mapping"));
          }
          const std::string& k = kv.first.Scalar();
          if (absl::Status st = CheckUtf8(
                  k, absl::StrCat(Where(kv.first, ""), path.empty() ? ", a key" : ", a key in ",
                                  path));
              !st.ok()) {
            return Error(std::string(st.message()));
          }
          const std::string child = path.empty() ? k : absl::StrCat(path, ".", k);
          Value v;
          if (absl::Status s = ToValue(kv.second, k, child, depth + 1, &v); !s.ok()) return s;
          (*out->mutable_struct_value()->mutable_fields())[k] = std::move(v);
        }
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  // "line 3, field optimizer.lr" (lines counted from 1); empty when neither is known.
  static std::string Where(const YAML::Node& node, const std::string& path) {
    std::string out;
    const YAML::Mark mark = node.Mark();
    if (!mark.is_null()) absl::StrAppend(&out, "line ", mark.line + 1);
    if (!path.empty()) absl::StrAppend(&out, out.empty() ? "" : ", ", "field ", path);
    return out;
  }
  // Where(...) followed by ": ", or nothing.
  static std::string At(const YAML::Node& node, const std::string& path) {
    std::string w = Where(node, path);
    return w.empty() ? w : w + ": ";
  }

  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", what));
  }

  const std::string& name_;
  int values_ = 0;
  size_t scalar_bytes_ = 0;
};

const char* KindOf(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "empty";
    case YAML::NodeType::Scalar:
      return "a single value";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
  }
  return "unknown";
}

// The first line of `s`: yaml-cpp's messages are one line, but be sure.
std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::Status NotRegular(const std::string& path, mode_t mode) {
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": is ", FileKind(mode), "; want a job file (a regular YAML or JSON file)"));
}

// `size`: "is 2000000 bytes", "holds more than 1048576 bytes".
absl::Status TooLarge(const std::string& path, const std::string& size) {
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": ", size, "; a job file may hold at most ", kMaxSpecFileBytes, " bytes (1 MiB)"));
}

}  // namespace

absl::Status SetSpecField(YAML::Node& root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  const std::string field = eq == std::string::npos ? "" : assignment.substr(0, eq);
  std::vector<std::string> parts = absl::StrSplit(field, '.');
  if (eq == std::string::npos || field.empty() ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--set \"", assignment, "\": want FIELD=VALUE (e.g. augment.size=32)"));
  }
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set \"", assignment, "\": the value is not YAML: ", DescribeYamlError(e)));
  }
  if (root.IsNull() || !root.IsDefined()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set \"", assignment, "\": the job file is not a mapping of fields"));
  }
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
    node.reset(node[parts[i]]);
  }
  node[parts.back()] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSpecFileText(const std::string& path) {
  if (path == "-") {  // standard input (a pipe, a terminal or a file), at most 1 MiB
    std::string text(kMaxSpecFileBytes + 1, '\0');
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = read(STDIN_FILENO, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("standard input: cannot read: ", std::strerror(errno)));
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    if (got > kMaxSpecFileBytes) {
      return TooLarge("standard input", absl::StrCat("holds more than ", kMaxSpecFileBytes,
                                                     " bytes"));
    }
    text.resize(got);
    return text;
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode);
  if (static_cast<uint64_t>(st.st_size) > kMaxSpecFileBytes) {
    return TooLarge(path, absl::StrCat("is ", st.st_size, " bytes"));
  }
  // O_NONBLOCK: should the path have become a FIFO since stat, open does not wait for a writer.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string text;
  absl::Status status;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = NotRegular(path, st.st_mode);
  } else {
    // One byte past the limit tells a file at the limit from one over it, whatever st_size
    // said (files in /proc report 0).
    text.resize(kMaxSpecFileBytes + 1);
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = absl::InvalidArgumentError(
            absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
        break;
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    text.resize(got);
    if (status.ok() && got > kMaxSpecFileBytes) {
      status = TooLarge(path, absl::StrCat("holds more than ", kMaxSpecFileBytes, " bytes"));
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

std::string DescribeYamlError(const YAML::Exception& e) {
  if (dynamic_cast<const YAML::DeepRecursion*>(&e) != nullptr) {
    return absl::StrCat("nested too deeply (more than 2000 levels of [ ], { } or indentation) "
                        "at line ", e.mark.line + 1);
  }
  if (e.mark.is_null()) return FirstLine(e.msg);
  return absl::StrCat("line ", e.mark.line + 1, ": ", FirstLine(e.msg));
}

absl::StatusOr<v1::JobSpec> ParseSpecText(const std::string& text, const std::string& name) {
  if (text.size() > kMaxSpecFileBytes) {
    return TooLarge(name, absl::StrCat("is ", text.size(), " bytes"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not valid YAML or JSON: ", DescribeYamlError(e)));
  }
  return ParseSpecNode(root, name);
}

// Every key of `node` (a mapping, at `path`) that names no field of `type`, and so on
// down the message fields, as "optimizer.lrr (line 4; did you mean optimizer.lr?)".
// Maps (labels) take any key; JSON names (camelCase) are accepted as the parser does.
void UnknownKeys(const YAML::Node& node, const google::protobuf::Descriptor* type,
                 const std::string& path, int depth, std::vector<std::string>* out) {
  if (!node.IsMap() || depth > 8 || out->size() >= 32) return;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) continue;  // reported by the converter
    const std::string& k = kv.first.Scalar();
    const google::protobuf::FieldDescriptor* f = type->FindFieldByName(k);
    for (int i = 0; f == nullptr && i < type->field_count(); ++i) {
      if (type->field(i)->json_name() == k) f = type->field(i);  // camelCase, as JSON allows
    }
    const std::string child = path.empty() ? k : absl::StrCat(path, ".", k);
    if (f == nullptr) {
      std::vector<std::string> names;
      for (int i = 0; i < type->field_count(); ++i) names.push_back(type->field(i)->name());
      const std::string near = ClosestMatch(k, names);
      const YAML::Mark mark = kv.first.Mark();
      std::string where = mark.is_null() ? "" : absl::StrCat("line ", mark.line + 1);
      if (!near.empty()) {
        absl::StrAppend(&where, where.empty() ? "" : "; ", "did you mean ",
                        path.empty() ? near : absl::StrCat(path, ".", near), "?");
      }
      out->push_back(absl::StrCat(SanitizeUtf8(child, 128), where.empty() ? "" : " (" + where + ")"));
      if (out->size() >= 32) return;
      continue;
    }
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map() &&
        !f->is_repeated()) {
      UnknownKeys(kv.second, f->message_type(), child, depth + 1, out);
    }
  }
}

absl::StatusOr<v1::JobSpec> ParseSpecNode(const YAML::Node& root, const std::string& name) {
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": is ", KindOf(root), "; want a mapping of JobSpec fields (model: ..., "
        "dataset: ...)"));
  }
  Value value;
  try {
    Converter converter(name);
    if (absl::Status s = converter.ToValue(root, "", "", 0, &value); !s.ok()) return s;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not valid YAML or JSON: ", DescribeYamlError(e)));
  }
  // Within the converter's limits (sizes, aliases): every unknown key at once.
  {
    std::vector<std::string> unknown;
    try {
      UnknownKeys(root, v1::JobSpec::descriptor(), "", 0, &unknown);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": not valid YAML or JSON: ", DescribeYamlError(e)));
    }
    if (!unknown.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", unknown.size() == 1 ? "unknown field " : "unknown fields ",
          absl::StrJoin(unknown, ", ")));
    }
  }
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(value, &json); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": cannot convert to JSON: ", FirstLine(std::string(s.message()))));
  }
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": not a valid job spec: ", FirstLine(std::string(status.message()))));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadSpecFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSpecFileText(path);
  if (!text.ok()) return text.status();
  return ParseSpecText(*text, path == "-" ? "standard input" : path);
}

v1::JobSpec DefaultJobSpec() {
  v1::JobSpec spec;
  spec.set_dataset("fashion-mnist");
  spec.set_workers(1);
  spec.set_epochs(1);
  spec.mutable_optimizer()->set_lr(0.05);
  return spec;
}

}  // namespace joule::client
