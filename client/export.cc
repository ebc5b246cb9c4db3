// `joule export ID -o FILE.npz`: a job's trained model out of Joule, as a NumPy .npz of its
// state dict (the parameter and buffer names PyTorch's equivalent module has), from the
// job's newest checkpoint: the final one of a job submitted with --keep-model, else the
// last periodic one.
#include <grpcpp/grpcpp.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <cerrno>

#include <cstring>
#include <filesystem>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli.h"
#include "client/job_client.h"
#include "client/subprocess.h"
#include "common/atomic_file.h"
#include "common/names.h"
#include "common/text.h"
#include "worker/train/checkpoint.h"

namespace joule::client {
namespace {

struct ExportFlags {
  int64_t id = 0;
  std::string out, checkpoint_root, format = "npz";
};

// NumPy's .npy format 1.0 of a float32 tensor: magic, version, a little-endian header
// length, a Python-literal header padded with spaces to a multiple of 64 bytes, the data
// (NEP 1, numpy.lib.format).
std::string Npy(const v1::TensorData& t) {
  // A Python tuple: (), (3,), (3, 4).
  std::vector<std::string> dims;
  for (int64_t d : t.shape()) dims.push_back(absl::StrCat(d));
  const std::string shape = dims.size() == 1 ? absl::StrCat("(", dims[0], ",)")
                                             : absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ", shape, ", }");
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  const size_t bytes = static_cast<size_t>(t.values_size()) * sizeof(float);
  const size_t at = out.size();
  out.resize(at + bytes);
  if (bytes > 0) std::memcpy(out.data() + at, t.values().data(), bytes);  // x86/ARM: little-endian
  return out;
}

// Writes `arrays` (name -> .npy bytes) as an uncompressed zip (NumPy's .npz) with libzip,
// into a temporary file renamed into place (common/atomic_file.h).
absl::Status WriteNpz(const std::string& path,
                      const std::vector<std::pair<std::string, std::string>>& arrays) {
  return WriteFileAtomicallyWith(path, [&](const std::string& tmp) -> absl::Status {
    int error = 0;
    zip_t* z = zip_open(tmp.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
    if (z == nullptr) {
      zip_error_t e;
      zip_error_init_with_code(&e, error);
      const std::string why = zip_error_strerror(&e);
      zip_error_fini(&e);
      return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", why));
    }
    for (const auto& [name, bytes] : arrays) {
      zip_source_t* src = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
      zip_int64_t index =
          src ? zip_file_add(z, (name + ".npy").c_str(), src, ZIP_FL_ENC_UTF_8) : -1;
      if (index < 0) {
        if (src) zip_source_free(src);
        const std::string why = zip_strerror(z);
        zip_discard(z);
        return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", why));
      }
      zip_set_file_compression(z, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
    }
    if (zip_close(z) != 0) {  // the buffers must live until here: zip_close writes them
      const std::string why = zip_strerror(z);
      zip_discard(z);
      return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", why));
    }
    return absl::OkStatus();
  });
}

int Export(const GlobalOptions& g, const ExportFlags& f) {
  // A model is binary: refused on standard output (and a directory) before anything runs.
  std::error_code dir_error;
  if (f.out == "-" || std::filesystem::is_directory(f.out, dir_error)) {
    std::cerr << "error: export: -o " << SanitizeUtf8(f.out, 200)
              << (f.out == "-" ? ": a model is binary and is not written to standard output"
                               : ": is a directory")
              << "; give a file name (e.g. model.npz)\n";
    return kExitUsage;
  }
  JobClient client = JobClient::ForCoordinator(g);
  absl::StatusOr<v1::Job> got = client.GetJob(f.id);
  if (!got.ok()) return client.Report("export", got.status());
  const v1::Job& job = *got;
  const std::string root =
      f.checkpoint_root.empty() ? StateDir(g) + "/checkpoints" : f.checkpoint_root;
  const std::string dir = worker::CheckpointDirectory(root, job.id(), job.uid());
  std::vector<std::string> skipped;
  // A model's checkpoint: a genetic algorithm's islands (its own checkpoints) are not one.
  absl::StatusOr<v1::Checkpoint> c = worker::LoadNewestCheckpoint(
      dir, worker::SpecHash(job.spec()), &skipped, [](const v1::Checkpoint& c) {
        return c.parameters_size() > 0 && absl::StartsWith(c.parameters(0).name(), "island.")
                   ? std::string("a genetic algorithm's islands, not a model (keep_model "
                                 "keeps its winner)")
                   : std::string();
      });
  if (!c.ok()) {
    std::cerr << "error: export: job " << job.id() << " has no checkpoint in " << dir
              << (skipped.empty() ? "" : " (" + skipped.front() + ")")
              << ": submit with --keep-model (or checkpoints), and give --checkpoint-root "
                 "where its workers wrote them\n";
    return kExitFailed;
  }
  const bool final_model = c->next_epoch() >= job.spec().epochs();
  if (job.state() != v1::JOB_STATE_SUCCEEDED || !final_model) {
    std::cerr << "warning: job " << job.id() << " is " << JobStateName(job.state())
              << (final_model ? "" : "; this is its newest checkpoint, not a final model")
              << " (step " << c->global_step() << ")\n";
  }
  if (f.format == "torchscript") {
    // joule-export has LibTorch (this program does not): it writes the same checkpoint.
    std::string log;
    const absl::StatusOr<int> ran =
        RunProgram({ProgramPath("joule-export"), "--checkpoint-dir", dir, "--spec-hash",
                    absl::StrCat(worker::SpecHash(job.spec())), "--model", job.spec().model(),
                    "--out", f.out},
                   &log);
    if (!ran.ok()) {
      std::cerr << "error: export: " << ran.status().message() << "\n";
      return kExitFailed;
    }
    if (const int rc = *ran; rc != 0) {
      const size_t at = log.find("export: ");
      std::string why = at == std::string::npos ? log : log.substr(at + 8);
      std::replace(why.begin(), why.end(), '\n', ' ');
      std::cerr << "error: export: " << SanitizeUtf8(why, 400) << "\n";
      return rc == 2 ? kExitUsage : kExitFailed;
    }
    std::cout << absl::StrFormat(
        "wrote %s: job %d at step %d as TorchScript; in Python: torch.jit.load(FILE)(images)\n",
        f.out, job.id(), c->global_step());
    return kExitOk;
  }
  std::vector<std::pair<std::string, std::string>> arrays;
  for (const auto* list : {&c->parameters(), &c->statistics()}) {
    for (const v1::TensorData& t : *list) arrays.emplace_back(t.name(), Npy(t));
  }
  if (absl::Status w = WriteNpz(f.out, arrays); !w.ok()) {
    std::cerr << "error: export: " << w.message() << "\n";
    return kExitFailed;
  }
  // A checkpoint written before the first evaluation (a stop in epoch 1) has none: -1.
  std::cout << absl::StrFormat(
      "wrote %s: %d tensors of job %d at step %d (%s); in Python: "
      "model.load_state_dict({k: torch.from_numpy(v) for k, v in numpy.load(FILE).items()})\n",
      f.out, arrays.size(), job.id(), c->global_step(),
      c->test_accuracy() >= 0 ? absl::StrFormat("test accuracy %.4f then", c->test_accuracy())
                              : std::string("not evaluated yet: it was written in epoch 1"));
  return kExitOk;
}

}  // namespace

void AddExportCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<ExportFlags>();
  KeepAlive(f);
  CLI::App* cmd = app.add_subcommand(
      "export", "write a job's trained model (its newest checkpoint) as a NumPy .npz state dict or TorchScript");
  cmd->add_option("id", f->id, "job id")->required();
  cmd->add_option("-o,--out", f->out, "the file to write (.npz; a .pt with --format torchscript)")
      ->required();
  cmd->add_option("--format", f->format,
                  "npz (a state dict: parameters and buffers by PyTorch's names; any model) or "
                  "torchscript (a module torch.jit.load runs; logreg and mlp)")
      ->check(CLI::IsMember({"npz", "torchscript"}))
      ->capture_default_str();
  cmd->add_option("--checkpoint-root", f->checkpoint_root,
                  "where the job's workers wrote checkpoints (default: the local cluster's, "
                  "STATE_DIR/checkpoints)");
  cmd->callback([&g, f, rc] { *rc = Export(g, *f); });
}

}  // namespace joule::client
