#include "client/utf8.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text.h"

namespace joule::client {

std::optional<size_t> FirstInvalidUtf8Byte(absl::string_view s) {
  const size_t bad = FirstInvalidUtf8(std::string_view(s.data(), s.size()));
  if (bad == std::string_view::npos) return std::nullopt;
  return bad;
}

absl::Status CheckUtf8(absl::string_view s, absl::string_view what) {
  const std::optional<size_t> bad = FirstInvalidUtf8Byte(s);
  if (!bad) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s: not valid UTF-8 (byte %d is 0x%02X)", what,
                                                    *bad, static_cast<unsigned char>(s[*bad])));
}

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// A map key or value, printable in a path: invalid bytes as \xHH.
std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "\\x%02X", c);
    }
  }
  return out;
}

absl::Status CheckFields(const Message& m, const std::string& path, absl::string_view prefix) {
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string name = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (f->is_map()) {
      const FieldDescriptor* key = f->message_type()->map_key();
      const FieldDescriptor* value = f->message_type()->map_value();
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        const Message& entry = r->GetRepeatedMessage(m, f, i);
        const google::protobuf::Reflection* er = entry.GetReflection();
        std::string k;
        if (key->type() == FieldDescriptor::TYPE_STRING) {
          k = er->GetString(entry, key);
          if (absl::Status s = CheckUtf8(k, absl::StrCat(prefix, "a key of ", name)); !s.ok()) {
            return s;
          }
        }
        const std::string at = absl::StrCat(name, "[\"", Printable(k), "\"]");
        if (value->type() == FieldDescriptor::TYPE_STRING) {
          if (absl::Status s = CheckUtf8(er->GetString(entry, value), absl::StrCat(prefix, at));
              !s.ok()) {
            return s;
          }
        } else if (value->type() == FieldDescriptor::TYPE_MESSAGE) {
          if (absl::Status s = CheckFields(er->GetMessage(entry, value), at, prefix); !s.ok()) {
            return s;
          }
        }
      }
    } else if (f->type() == FieldDescriptor::TYPE_STRING) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          if (absl::Status s =
                  CheckUtf8(r->GetRepeatedString(m, f, i), absl::StrCat(prefix, name, "[", i, "]"));
              !s.ok()) {
            return s;
          }
        }
      } else if (absl::Status s = CheckUtf8(r->GetString(m, f), absl::StrCat(prefix, name));
                 !s.ok()) {
        return s;
      }
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          if (absl::Status s = CheckFields(r->GetRepeatedMessage(m, f, i),
                                           absl::StrCat(name, "[", i, "]"), prefix);
              !s.ok()) {
            return s;
          }
        }
      } else if (absl::Status s = CheckFields(r->GetMessage(m, f), name, prefix); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckUtf8Fields(const Message& message, absl::string_view prefix) {
  return CheckFields(message, "", prefix);
}

}  // namespace joule::client
