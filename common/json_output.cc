#include "common/json_output.h"

#include <google/protobuf/descriptor.h>

#include <cctype>
#include <cmath>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace joule {
namespace {

using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using nlohmann::json;

// JobState -> "JOB_STATE_".
std::string EnumPrefix(const std::string& type_name) {
  std::string prefix;
  for (size_t i = 0; i < type_name.size(); ++i) {
    const char c = type_name[i];
    if (i > 0 && std::isupper(static_cast<unsigned char>(c))) prefix += '_';
    prefix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return prefix + "_";
}

std::string EnumName(const EnumValueDescriptor* v) {
  std::string name = v->name();
  const std::string prefix = EnumPrefix(v->type()->name());
  if (absl::StartsWith(name, prefix)) name = name.substr(prefix.size());
  return absl::AsciiStrToLower(name);
}

json Number(double d) { return std::isfinite(d) ? json(d) : json(nullptr); }

json Scalar(const Message& m, const Reflection& r, const FieldDescriptor* f, int index) {
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r.GetRepeatedInt32(m, f, index) : r.GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return rep ? r.GetRepeatedInt64(m, f, index) : r.GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r.GetRepeatedUInt32(m, f, index) : r.GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r.GetRepeatedUInt64(m, f, index) : r.GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return Number(rep ? r.GetRepeatedDouble(m, f, index) : r.GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return Number(rep ? r.GetRepeatedFloat(m, f, index) : r.GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r.GetRepeatedBool(m, f, index) : r.GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM:
      return EnumName(rep ? r.GetRepeatedEnum(m, f, index) : r.GetEnum(m, f));
    case FieldDescriptor::CPPTYPE_STRING:
      return rep ? r.GetRepeatedString(m, f, index) : r.GetString(m, f);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToJson(rep ? r.GetRepeatedMessage(m, f, index) : r.GetMessage(m, f));
  }
  return nullptr;
}

}  // namespace

std::string Rfc3339(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                         static_cast<int>(unix_ms % 1000));
}

json ProtoToJson(const Message& m) {
  json out = json::object();
  const auto* d = m.GetDescriptor();
  const Reflection& r = *m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string& name = f->name();
    if (f->is_map()) {
      json map = json::object();
      const FieldDescriptor* key = f->message_type()->map_key();
      const FieldDescriptor* value = f->message_type()->map_value();
      for (int k = 0; k < r.FieldSize(m, f); ++k) {
        const Message& entry = r.GetRepeatedMessage(m, f, k);
        const Reflection& er = *entry.GetReflection();
        json key_json = Scalar(entry, er, key, -1);
        map[key_json.is_string() ? key_json.get<std::string>() : key_json.dump()] =
            Scalar(entry, er, value, -1);
      }
      out[name] = map;
    } else if (f->is_repeated()) {
      json list = json::array();
      for (int k = 0; k < r.FieldSize(m, f); ++k) list.push_back(Scalar(m, r, f, k));
      out[name] = list;
    } else {
      out[name] = Scalar(m, r, f, -1);
      if (absl::EndsWith(name, "_unix_ms") && f->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
        const int64_t ms = r.GetInt64(m, f);
        out[name.substr(0, name.size() - 8) + "_time"] = ms > 0 ? json(Rfc3339(ms)) : json(nullptr);
      }
    }
  }
  return out;
}

std::string JsonText(const json& value) {
  return value.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace joule
