#ifndef JOULE_CLIENT_UTF8_H_
#define JOULE_CLIENT_UTF8_H_

#include <google/protobuf/message.h>

#include <cstddef>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace joule::client {

// The offset of the first byte of `s` that does not start a well-formed UTF-8 sequence (the
// lead byte of a broken or cut-short sequence, as Python's decoder reports it), or nullopt
// when all of `s` is well-formed. Well-formed as the Unicode Standard's table 3-7 defines it:
// no overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no truncated
// sequence. Protocol-buffer string fields must hold well-formed UTF-8, or serialising the
// message fails. (common/text.h's FirstInvalidUtf8, as an optional.)
std::optional<size_t> FirstInvalidUtf8Byte(absl::string_view s);

// OK, or INVALID_ARGUMENT "<what>: not valid UTF-8 (byte N is 0xHH)", N counted from 0.
absl::Status CheckUtf8(absl::string_view s, absl::string_view what);

// CheckUtf8 for every string in `message`: nested messages, repeated fields, map keys and
// values. The error names the field as a path, e.g. `labels["team"]` or `optimizer.name`,
// after `prefix` (e.g. "job.yaml: ").
absl::Status CheckUtf8Fields(const google::protobuf::Message& message, absl::string_view prefix);

}  // namespace joule::client

#endif  // JOULE_CLIENT_UTF8_H_
