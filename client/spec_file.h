#ifndef JOULE_CLIENT_SPEC_FILE_H_
#define JOULE_CLIENT_SPEC_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "joule/v1/job.pb.h"

namespace joule::client {

// Parses a job file, YAML or JSON (JSON is YAML), whose fields are those of
// joule.v1.JobSpec in snake_case or lowerCamelCase, e.g.
//   model: mlp
//   dataset: fashion-mnist
//   workers: 2
//   global_batch_size: 128
//   optimizer: {lr: 0.05, momentum: 0.9}
// Enums may be written short: device_kind: cpu, sync: {strategy: allreduce}.
// Errors: NOT_FOUND (file), INVALID_ARGUMENT naming the file and the bad field.
absl::StatusOr<v1::JobSpec> ParseSpecText(const std::string& text, const std::string& name);
absl::StatusOr<v1::JobSpec> LoadSpecFile(const std::string& path);

}  // namespace joule::client

#endif  // JOULE_CLIENT_SPEC_FILE_H_
