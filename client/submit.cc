#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "client/spec_file.h"
#include "client/utf8.h"
#include "common/text.h"

namespace joule::client {
namespace {

struct SubmitFlags {
  std::string file;
  std::string name, model, dataset, device;
  int workers = 0, global_batch = 0, local_batch = 0, epochs = 0, priority = 0, threads = 0;
  int checkpoint_steps = 0, checkpoint_epochs = 0, keep_checkpoints = 0, max_restarts = 0;
  std::string sync, lr_scaling;
  int accumulation = 0, fraction = 0;
  double lr_warmup_epochs = 0;
  std::string energy_budget;
  double target_accuracy = 0;
  int sync_period = 0, sync_warmup = 0;
  int64_t bucket_bytes = 0;
  bool average_momentum = false;
  bool fp16_compression = false;
  double lr = 0, momentum = -1, weight_decay = -1;
  int64_t seed = -1, max_train = -1, max_test = -1;
  std::vector<int> hidden;
  std::vector<std::string> labels;
  std::string request_id;
  bool watch = false;
};

// Protocol-buffer strings must be valid UTF-8 (else the request cannot be serialised and
// the RPC fails with an empty message): check every string flag that reaches the request,
// naming it. (The job file's path is a path, any bytes.)
absl::Status CheckStringFlags(const SubmitFlags& f) {
  const std::pair<const char*, const std::string*> flags[] = {
      {"--name", &f.name},         {"--model", &f.model},
      {"--dataset", &f.dataset},   {"--lr-scaling", &f.lr_scaling},
      {"--request-id", &f.request_id}};
  for (const auto& [flag, value] : flags) {
    if (absl::Status s = CheckUtf8(*value, flag); !s.ok()) return s;
  }
  for (const std::string& l : f.labels) {
    if (absl::Status s = CheckUtf8(l, "--label"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

int Submit(const GlobalOptions& g, const SubmitFlags& f, CLI::App& cmd) {
  if (absl::Status s = CheckStringFlags(f); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitUsage;
  }
  // Defaults for what neither the file nor the flags say (the same as --help states).
  v1::JobSpec spec = DefaultJobSpec();
  if (!f.file.empty()) {
    absl::StatusOr<v1::JobSpec> loaded = LoadSpecFile(f.file);
    if (!loaded.ok()) {
      std::cerr << "error: " << loaded.status().message() << "\n";
      return kExitUsage;
    }
    spec.MergeFrom(*loaded);  // the file's fields replace the defaults
  }
  // Flags given on the command line override the file.
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  if (given("--name")) spec.set_name(f.name);
  if (given("--model")) spec.set_model(f.model);
  if (given("--dataset")) spec.set_dataset(f.dataset);
  if (given("--workers")) spec.set_workers(f.workers);
  if (given("--device")) {
    spec.set_device_kind(f.device == "gpu" ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU);
  }
  if (given("--global-batch-size")) spec.set_global_batch_size(f.global_batch);
  if (given("--local-batch-size")) spec.set_local_batch_size(f.local_batch);
  if (given("--epochs")) spec.set_epochs(f.epochs);
  if (given("--lr")) spec.mutable_optimizer()->set_lr(f.lr);
  if (given("--momentum")) spec.mutable_optimizer()->set_momentum(f.momentum);
  if (given("--weight-decay")) spec.mutable_optimizer()->set_weight_decay(f.weight_decay);
  if (given("--seed")) spec.set_seed(static_cast<uint64_t>(f.seed));
  if (given("--priority")) spec.set_priority(f.priority);
  if (given("--threads")) spec.set_intra_op_threads(f.threads);
  if (given("--max-train-samples")) spec.set_max_train_samples(f.max_train);
  if (given("--max-test-samples")) spec.set_max_test_samples(f.max_test);
  if (given("--accumulation-steps")) spec.set_accumulation_steps(f.accumulation);
  if (given("--dataset-fraction")) spec.set_dataset_fraction(f.fraction);
  if (given("--lr-scaling")) spec.set_lr_scaling(f.lr_scaling);
  if (given("--lr-warmup-epochs")) spec.set_lr_warmup_epochs(f.lr_warmup_epochs);
  if (given("--target-accuracy")) spec.set_target_accuracy(f.target_accuracy);
  if (given("--energy-budget")) {
    absl::StatusOr<double> joules = ParseEnergy(f.energy_budget);
    if (!joules.ok()) {
      std::cerr << "error: --energy-budget: " << joules.status().message() << "\n";
      return kExitUsage;
    }
    spec.set_energy_budget_joules(*joules);
  }
  if (given("--sync")) {
    spec.mutable_sync()->set_strategy(f.sync == "local-sgd" ? v1::SYNC_STRATEGY_LOCAL_SGD
                                                            : v1::SYNC_STRATEGY_ALLREDUCE);
  }
  if (given("--sync-period")) spec.mutable_sync()->set_period(f.sync_period);
  if (given("--bucket-bytes")) spec.mutable_sync()->set_bucket_bytes(f.bucket_bytes);
  if (given("--fp16-compression")) spec.mutable_sync()->set_fp16_compression(f.fp16_compression);
  if (given("--sync-warmup-steps")) spec.mutable_sync()->set_warmup_steps(f.sync_warmup);
  if (given("--average-momentum")) spec.mutable_sync()->set_average_momentum(f.average_momentum);
  if (given("--checkpoint-every-steps")) spec.set_checkpoint_every_steps(f.checkpoint_steps);
  if (given("--checkpoint-every-epochs")) spec.set_checkpoint_every_epochs(f.checkpoint_epochs);
  if (given("--keep-checkpoints")) spec.set_keep_checkpoints(f.keep_checkpoints);
  if (given("--max-restarts")) {
    spec.set_max_restarts(f.max_restarts);
    spec.set_no_restarts(f.max_restarts == 0);
  }
  if (given("--hidden")) {
    spec.clear_hidden_sizes();
    for (int h : f.hidden) spec.add_hidden_sizes(h);
  }
  for (const std::string& l : f.labels) {
    std::pair<std::string, std::string> kv = absl::StrSplit(l, absl::MaxSplits('=', 1));
    (*spec.mutable_labels())[kv.first] = kv.second;
  }

  // Whatever set them, no string may reach the request unless it is valid UTF-8.
  if (absl::Status s = CheckUtf8Fields(spec, "job spec field "); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitUsage;
  }

  const std::string address = ResolveCoordinator(g);
  auto stub = JobStub(address);
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  req.set_request_id(f.request_id);
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("submit", address, s);
  if (f.watch) {
    std::cout << "job " << resp.job_id() << (resp.existing() ? " (already submitted)" : "")
              << " submitted\n";
    return WatchJob(*stub, address, resp.job_id());
  }
  std::cout << resp.job_id() << "\n";
  return kExitOk;
}

}  // namespace

void AddSubmitCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<SubmitFlags>();
  CLI::App* cmd = app.add_subcommand(
      "submit", "submit a training job; prints its id (or follows it with --watch)");
  cmd->add_option("-f,--file", f->file,
                  "job spec, YAML or JSON, a regular file of at most 1 MiB (flags override it)");
  cmd->add_option("--name", f->name, "job name");
  cmd->add_option("--model", f->model,
                  "logreg, mlp, cnn, resnet18, resnet50, or torchscript:FILE (a module saved "
                  "with torch.jit.save, under a data root)");
  cmd->add_option("--dataset", f->dataset,
                  "fashion-mnist (default), idx:DIR, csv:FILE (numbers; label column \"label\" "
                  "or the last) or synthetic:CxHxW:CLASSES:N");
  cmd->add_option("--workers", f->workers, "world size N (default 1)");
  cmd->add_option("--device", f->device, "cpu (default) or gpu")
      ->check(CLI::IsMember({"cpu", "gpu"}));
  cmd->add_option("--global-batch-size", f->global_batch, "GBS = LBS x N");
  cmd->add_option("--local-batch-size", f->local_batch, "LBS per worker");
  cmd->add_option("--epochs", f->epochs, "epochs (default 1)");
  cmd->add_option("--lr", f->lr, "SGD learning rate (default 0.05)");
  cmd->add_option("--momentum", f->momentum, "SGD momentum (default 0)");
  cmd->add_option("--weight-decay", f->weight_decay, "L2 penalty (default 0)");
  cmd->add_option("--seed", f->seed, "random seed for initialisation and shuffling");
  cmd->add_option("--priority", f->priority, "higher runs first (default 0)");
  cmd->add_option("--threads", f->threads, "intra-op threads per worker (default: worker's)");
  cmd->add_option("--hidden", f->hidden, "mlp hidden sizes (default 512 256)");
  cmd->add_option("--max-train-samples", f->max_train, "train on the first N examples only");
  cmd->add_option("--max-test-samples", f->max_test, "test on the first N examples only");
  cmd->add_option("--dataset-fraction", f->fraction,
                  "train on a stratified 1/k of the training examples (weak scaling)");
  cmd->add_option("--accumulation-steps", f->accumulation,
                  "micro-batches per worker per step (GBS = LBS x workers x this)");
  cmd->add_option("--lr-scaling", f->lr_scaling, "none (default) or linear (lr x GBS / 256)")
      ->check(CLI::IsMember({"none", "linear"}));
  cmd->add_option("--lr-warmup-epochs", f->lr_warmup_epochs,
                  "linear scaling: ramp from --lr to the scaled rate over these epochs");
  cmd->add_option("--target-accuracy", f->target_accuracy,
                  "test accuracy (0..1) whose energy and time to reach the report gives");
  cmd->add_option("--energy-budget", f->energy_budget,
                  "stop the job (after a checkpoint) once it has spent this much energy, "
                  "e.g. 50kJ, 2MJ, 0.5kWh; warned at 90%");
  cmd->add_option("--sync", f->sync, "allreduce (default) or local-sgd")
      ->check(CLI::IsMember({"allreduce", "local-sgd"}));
  cmd->add_option("--sync-period", f->sync_period, "local SGD: average parameters every H steps");
  cmd->add_flag("--fp16-compression", f->fp16_compression,
                "allreduce: exchange gradients as half precision (half the bytes)");
  cmd->add_option("--bucket-bytes", f->bucket_bytes,
                  "allreduce: gradient bucket size in bytes (default 25 MiB, as PyTorch DDP)");
  cmd->add_option("--sync-warmup-steps", f->sync_warmup,
                  "local SGD: steps of gradient allreduce before going local");
  cmd->add_flag("--average-momentum", f->average_momentum,
                "local SGD: average momentum buffers with the parameters");
  cmd->add_option("--checkpoint-every-steps", f->checkpoint_steps,
                  "rank 0 checkpoints every N steps (default: never)");
  cmd->add_option("--checkpoint-every-epochs", f->checkpoint_epochs,
                  "rank 0 checkpoints every N epochs (default: never)");
  cmd->add_option("--keep-checkpoints", f->keep_checkpoints, "newest checkpoints kept (default 2)");
  cmd->add_option("--max-restarts", f->max_restarts,
                  "attempts after a failed one, resuming from the newest checkpoint (default 3)");
  cmd->add_option("--label", f->labels, "KEY=VALUE label, repeatable");
  cmd->add_option("--request-id", f->request_id,
                  "idempotency key: a retried submit with it returns the same job");
  cmd->add_flag("-w,--watch", f->watch, "follow the job until it ends");
  cmd->callback([&g, f, rc, cmd] { *rc = Submit(g, *f, *cmd); });
}

}  // namespace joule::client
