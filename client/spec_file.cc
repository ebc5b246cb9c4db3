#include "client/spec_file.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

absl::Status ToValue(const YAML::Node& node, const std::string& key, Value* out) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      out->set_null_value(google::protobuf::NULL_VALUE);
      return absl::OkStatus();
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      double d;
      if (node.Tag() != "!" && absl::SimpleAtod(s, &d) && !s.empty() &&
          s.find_first_not_of("0123456789+-.eE") == std::string::npos) {
        out->set_number_value(d);
      } else if (node.Tag() != "!" && (s == "true" || s == "false")) {
        out->set_bool_value(s == "true");
      } else {
        out->set_string_value(ExpandEnum(key, s));
      }
      return absl::OkStatus();
    }
    case YAML::NodeType::Sequence:
      for (const YAML::Node& item : node) {
        if (absl::Status s = ToValue(item, key, out->mutable_list_value()->add_values()); !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    case YAML::NodeType::Map:
      for (const auto& kv : node) {
        std::string k = kv.first.as<std::string>();
        Value v;
        if (absl::Status s = ToValue(kv.second, k, &v); !s.ok()) return s;
        (*out->mutable_struct_value()->mutable_fields())[k] = std::move(v);
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseSpecText(const std::string& text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not valid YAML or JSON: ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": want a mapping of JobSpec fields"));
  }
  Value value;
  if (absl::Status s = ToValue(root, "", &value); !s.ok()) return s;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(value, &json).ok()) {
    return absl::InternalError(absl::StrCat(name, ": could not convert to JSON"));
  }
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a valid job spec: ", std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadSpecFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseSpecText(ss.str(), path);
}

}  // namespace joule::client
