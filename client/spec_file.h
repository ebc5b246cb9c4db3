#ifndef JOULE_CLIENT_SPEC_FILE_H_
#define JOULE_CLIENT_SPEC_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace YAML {
class Node;
class Exception;
}

namespace joule::client {

// The most a job file may hold: 1 MiB, thousands of times a real spec (a few hundred bytes).
inline constexpr size_t kMaxSpecFileBytes = size_t{1} << 20;
// Limits on the YAML once its aliases are expanded: a "billion laughs" file of a few hundred
// bytes names one node 10^9 times through nested aliases, and a real spec has a few dozen
// values nested three deep.
inline constexpr int kMaxSpecValues = 100000;           // scalars, lists and mappings
inline constexpr int kMaxSpecDepth = 32;                // nesting of lists and mappings
inline constexpr size_t kMaxSpecScalarBytes = size_t{4} << 20;  // all scalars together

// Parses a job file, YAML or JSON (JSON is YAML), whose fields are those of
// joule.v1.JobSpec in snake_case or lowerCamelCase, e.g.
//   model: mlp
//   dataset: fashion-mnist
//   workers: 2
//   global_batch_size: 128
//   optimizer: {lr: 0.05, momentum: 0.9}
// Enums may be written short: device_kind: cpu, sync: {strategy: allreduce}.
// `name` (the file's path) prefixes every error. Errors, each one line: INVALID_ARGUMENT for
// text over kMaxSpecFileBytes, YAML that is not a mapping or expands past the limits above,
// a string that is not valid UTF-8 (naming the field, its line and the byte), an unknown
// field or a bad value (naming the field).
// What a YAML parser error means to a user, in one line: "line L: MSG", or, for yaml-cpp's
// depth guard (it refuses more than 2,000 nested levels, saying only "bad file"), "nested
// too deeply (more than 2000 levels of [ ], { } or indentation) at line L".
std::string DescribeYamlError(const YAML::Exception& e);

absl::StatusOr<v1::JobSpec> ParseSpecText(const std::string& text, const std::string& name);
// The same for YAML already loaded (a sweep's cells): the checks after loading, with the
// alias limits counted as the tree is converted.
absl::StatusOr<v1::JobSpec> ParseSpecNode(const YAML::Node& root, const std::string& name);

// Reads `path` (a regular file of at most kMaxSpecFileBytes; it reads no more than that) and
// parses it with ParseSpecText. A FIFO, device or socket is refused without reading it, so
// neither /dev/zero nor a FIFO without a writer can hang or exhaust memory.
// Errors: NOT_FOUND when `path` does not exist or cannot be opened; INVALID_ARGUMENT for a
// directory, another non-regular file or a file over the limit; ParseSpecText's errors.
absl::StatusOr<v1::JobSpec> LoadSpecFile(const std::string& path);

// The spec a job file or the flags start from: what they leave out takes these defaults
// (as `joule submit --help` states): fashion-mnist, 1 worker, 1 epoch, lr 0.05.
v1::JobSpec DefaultJobSpec();

// Applies `assignment`, "FIELD=VALUE" (FIELD as in a job file, nested ones dotted:
// `augment.size`, `optimizer.lr`; VALUE as YAML: `32`, `[0.5, 1.0]`, `{name: adamw}`), to
// the mapping `root`, replacing what was there: `--set` of submit and sweep run, to run a
// file shrunk without editing it. Errors: INVALID_ARGUMENT (naming the assignment) for
// one without '=', an empty field or part, or a VALUE that is not YAML.
absl::Status SetSpecField(YAML::Node& root, const std::string& assignment);

// Reads `path` as LoadSpecFile does (a regular file of at most kMaxSpecFileBytes, refused
// unread otherwise), for other files with a job file's rules (sweep files). Errors as there.
absl::StatusOr<std::string> ReadSpecFileText(const std::string& path);

}  // namespace joule::client

#endif  // JOULE_CLIENT_SPEC_FILE_H_
