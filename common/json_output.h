#ifndef JOULE_COMMON_JSON_OUTPUT_H_
#define JOULE_COMMON_JSON_OUTPUT_H_
// `-o json` of the CLI and the web UI's API: protocol buffers as JSON a script can use
// without knowing proto3's JSON mapping. Unlike it (google::protobuf::util::MessageToJsonString):
//   - every field is present, zeros and empty lists included (rank 0 is a rank);
//   - 64-bit integers are numbers, not strings (exact up to 2^53, which ids, counts and
//     Unix milliseconds stay far below);
//   - enum values are their lower-case names without the type's prefix: JOB_STATE_RUNNING
//     is "running", DEVICE_KIND_GPU "gpu" (as the CLI's flags and tables write them);
//   - a field NAME_unix_ms (Unix milliseconds) gets a sibling NAME_time in RFC 3339 UTC
//     ("2026-12-01T18:14:25.123Z"), or null when it is 0 (not yet);
//   - field names are the proto's (snake_case); maps are objects; NaN and infinities null.
// Pure; thread-compatible.
#include <google/protobuf/message.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace joule {

nlohmann::json ProtoToJson(const google::protobuf::Message& message);

// "2026-12-01T18:14:25.123Z" for Unix milliseconds.
std::string Rfc3339(int64_t unix_ms);

// `value` as JSON text (2-space indent, a newline at the end); invalid UTF-8 is replaced
// (U+FFFD), never a throw.
std::string JsonText(const nlohmann::json& value);

}  // namespace joule

#endif  // JOULE_COMMON_JSON_OUTPUT_H_
