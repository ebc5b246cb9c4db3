// joule-export: a job's newest checkpoint as a TorchScript module, the half of
// `joule export --format torchscript` that needs LibTorch (the CLI has none; it finds the
// job and its checkpoint directory, then runs this program next to it).
//
//   joule-export --checkpoint-dir DIR --spec-hash H --model MODEL --out FILE
//
// Exit status: 0 written; 1 no usable checkpoint in DIR, or FILE could not be written;
// 2 a model TorchScript export does not cover (worker/models/export.h), or bad flags.
// The reason is one line on standard error, "export: ...".
#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "common/logging.h"
#include "worker/models/export.h"
#include "worker/train/checkpoint.h"

int main(int argc, char** argv) {
  CLI::App app{"joule-export: writes a Joule job's newest checkpoint as TorchScript (run by "
               "`joule export --format torchscript`)"};
  std::string dir, model, out;
  uint64_t spec_hash = 0;
  app.add_option("--checkpoint-dir", dir, "the job's checkpoint directory")->required();
  app.add_option("--spec-hash", spec_hash,
                 "the job's spec hash: checkpoints of another spec are skipped")
      ->required();
  app.add_option("--model", model, "the job's model (logreg or mlp)")->required();
  app.add_option("--out", out, "the TorchScript file to write")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  joule::InitLogging("joule-export", "warn");
  std::vector<std::string> skipped;
  absl::StatusOr<joule::v1::Checkpoint> c =
      joule::worker::LoadNewestCheckpoint(dir, spec_hash, &skipped);
  if (!c.ok()) {
    spdlog::error("export: {}", std::string(c.status().message()));
    return 1;
  }
  if (absl::Status s = joule::worker::SaveLinearChainTorchScript(model, *c, out); !s.ok()) {
    spdlog::error("export: {}", std::string(s.message()));
    return s.code() == absl::StatusCode::kUnimplemented ? 2 : 1;
  }
  return 0;
}
