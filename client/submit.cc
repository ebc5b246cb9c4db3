#include <grpcpp/grpcpp.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/carbon_flags.h"
#include "client/cli.h"
#include "client/estimate.h"
#include "client/job_client.h"
#include "client/spec_file.h"
#include "client/utf8.h"
#include "common/job_spec.h"
#include "common/names.h"
#include "common/text.h"

namespace joule::client {
namespace {

struct SubmitFlags {
  std::string file;
  std::vector<std::string> sets;  // --set FIELD=VALUE, applied to the file's YAML
  std::string name, model, dataset, device;
  int workers = 0, global_batch = 0, local_batch = 0, epochs = 0, priority = 0, threads = 0;
  int checkpoint_steps = 0, checkpoint_epochs = 0, keep_checkpoints = 0, max_restarts = 0;
  std::string sync, lr_scaling, algorithm;
  int accumulation = 0, fraction = 0;
  double lr_warmup_epochs = 0;
  std::string energy_budget;
  CarbonFlags carbon;
  double target_accuracy = 0, target_loss = 0;
  std::string target_metric;
  int sync_period = 0, sync_warmup = 0, powersgd_rank = 0;
  int64_t bucket_bytes = 0;
  bool average_momentum = false;
  bool fp16_compression = false;
  std::string optimizer;
  double lr = 0, momentum = -1, weight_decay = -1;
  int64_t seed = -1, max_train = -1, max_test = -1;
  std::vector<int> hidden;
  std::vector<std::string> labels;
  std::string request_id;
  bool watch = false;
  bool keep_model = false;
  bool estimate = false, force = false, calibrate = false;
  int holdout = 0;
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

// The spec the flags and the file describe; a usage error (exit 2) names what is wrong.
absl::StatusOr<v1::JobSpec> BuildSpec(const SubmitFlags& f, CLI::App& cmd) {
  if (absl::Status s = CheckStringFlags(f); !s.ok()) return s;
  // Defaults for what neither the file nor the flags say (the same as --help states).
  v1::JobSpec spec = DefaultJobSpec();
  if (!f.file.empty() && f.sets.empty()) {
    absl::StatusOr<v1::JobSpec> loaded = LoadSpecFile(f.file);
    if (!loaded.ok()) return loaded.status();
    spec.MergeFrom(*loaded);  // the file's fields replace the defaults
  } else if (!f.sets.empty()) {
    // The file's YAML (or none) with the --set fields replaced, then parsed as a file.
    YAML::Node root(YAML::NodeType::Map);
    const std::string name = f.file.empty() ? "--set" : f.file;
    if (!f.file.empty()) {
      absl::StatusOr<std::string> text = ReadSpecFileText(f.file);
      if (!text.ok()) return text.status();
      try {
        root = YAML::Load(*text);
      } catch (const YAML::Exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", DescribeYamlError(e)));
      }
    }
    for (const std::string& set : f.sets) {
      if (absl::Status s = SetSpecField(root, set); !s.ok()) return s;
    }
    absl::StatusOr<v1::JobSpec> loaded = ParseSpecNode(root, name);
    if (!loaded.ok()) return loaded.status();
    spec.MergeFrom(*loaded);
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
  if (given("--optimizer")) spec.mutable_optimizer()->set_name(f.optimizer);
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
  if (given("--target-metric")) spec.set_target_metric(f.target_metric);
  if (given("--target-loss")) spec.set_target_loss(f.target_loss);
  if (given("--keep-model")) spec.set_keep_model(f.keep_model);
  if (given("--algorithm")) spec.set_algorithm(f.algorithm);
  if (given("--energy-budget")) {
    absl::StatusOr<double> joules = ParseEnergyBudget(f.energy_budget);
    if (!joules.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--energy-budget: ", joules.status().message()));
    }
    spec.set_energy_budget_joules(*joules);
  }
  if (absl::Status st = ApplyCarbonFlags(f.carbon, cmd, &spec); !st.ok()) return st;
  if (given("--sync")) {
    spec.mutable_sync()->set_strategy(f.sync == "local-sgd"  ? v1::SYNC_STRATEGY_LOCAL_SGD
                                      : f.sync == "powersgd" ? v1::SYNC_STRATEGY_POWERSGD
                                                             : v1::SYNC_STRATEGY_ALLREDUCE);
  }
  if (given("--sync-period")) spec.mutable_sync()->set_period(f.sync_period);
  if (given("--bucket-bytes")) spec.mutable_sync()->set_bucket_bytes(f.bucket_bytes);
  if (given("--fp16-compression")) spec.mutable_sync()->set_fp16_compression(f.fp16_compression);
  if (given("--sync-warmup-steps")) spec.mutable_sync()->set_warmup_steps(f.sync_warmup);
  if (given("--powersgd-rank")) spec.mutable_sync()->set_powersgd_rank(f.powersgd_rank);
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
  if (absl::Status s = CheckUtf8Fields(spec, "job spec field "); !s.ok()) return s;
  return spec;
}

std::string EstimateText(const JobEstimate& e, const v1::JobSpec& spec) {
  auto pm = [](double ci, const char* fmt) {
    return ci > 0 ? absl::StrFormat(fmt, ci) : std::string(" (uncertainty unknown)");
  };
  std::string out = absl::StrFormat(
      "estimate for %s: %d workers, global batch %d, %d epochs (%d samples, %d updates)\n"
      "  wall time     %.1f s%s\n"
      "  device-hours  %.6f\n"
      "  energy        %.1f J%s%s\n"
      "  from %d finished job(s) of the family: %s\n",
      e.family, spec.workers(), spec.global_batch_size(), spec.epochs(), e.samples, e.updates,
      e.wall_seconds, pm(e.wall_ci95, " +- %.1f s (95%%)"), e.device_hours, e.joules,
      pm(e.joules_ci95, " +- %.1f J (95%%)"), e.energy_estimated ? " (history estimated)" : "",
      e.job_ids.size(), e.method);
  if (!e.extrapolation.empty()) {
    absl::StrAppend(&out, "  note: the job is ", e.extrapolation, "; take it as rough\n");
  }
  if (e.wall_ci95 > e.wall_seconds || e.joules_ci95 > e.joules) {
    absl::StrAppend(&out, "  note: the interval is wider than the estimate: the history is too "
                          "small or too noisy to tell (run more jobs of the family)\n");
  }
  if (spec.energy_budget_joules() > 0) {
    absl::StrAppend(&out, absl::StrFormat("  budget        %.1f J: the estimate is %.0f%% of it\n",
                                          spec.energy_budget_joules(),
                                          100 * e.joules / spec.energy_budget_joules()));
  }
  return out;
}

// Submits `spec` and waits for it to end; its id, or an error.
absl::StatusOr<int64_t> RunAndWait(JobClient& client, const v1::JobSpec& spec,
                                   const std::string& request_id) {
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  req.set_request_id(request_id);
  absl::StatusOr<v1::SubmitJobResponse> resp = client.Submit(req);
  if (!resp.ok()) return absl::UnavailableError(resp.status().message());
  for (;;) {
    absl::StatusOr<v1::Job> got = client.GetJob(resp->job_id());
    if (!got.ok()) return absl::UnavailableError(got.status().message());
    const v1::Job& job = *got;
    if (IsTerminal(job.state())) {
      if (job.state() != v1::JOB_STATE_SUCCEEDED) {
        return absl::AbortedError(absl::StrCat("calibration job ", job.id(), " ",
                                               JobStateName(job.state()), ": ", job.reason()));
      }
      return job.id();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// `joule estimate` and `submit --estimate`: prints the estimate (or the hold-out
// evaluation); with --calibrate and no history, runs the calibration jobs first.
int Estimate(const GlobalOptions& g, const SubmitFlags& f, CLI::App& cmd) {
  absl::StatusOr<v1::JobSpec> built = BuildSpec(f, cmd);
  if (!built.ok()) {
    std::cerr << "error: " << built.status().message() << "\n";
    return kExitUsage;
  }
  v1::JobSpec spec = *built;
  if (absl::Status s = NormalizeAndValidateSpec(spec); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitUsage;
  }
  JobClient client = JobClient::ForCoordinator(g);
  absl::StatusOr<std::vector<v1::Job>> history = FinishedJobs(client);
  if (!history.ok()) {
    std::cerr << "error: estimate: " << client.address() << ": " << history.status().message()
              << "\n";
    return kExitUnavailable;
  }
  if (f.holdout > 0) {
    std::vector<HoldoutRow> rows = EvaluateHoldout(spec, *history, f.holdout);
    std::cout << absl::StrFormat("%-6s %5s %10s %10s %7s %12s %12s %7s\n", "job", "from",
                                 "wall s", "predicted", "err %", "energy J", "predicted",
                                 "err %");
    double sum_t = 0, sum_e = 0;
    int n = 0;
    for (const HoldoutRow& r : rows) {
      if (!r.error.empty()) {
        std::cout << absl::StrFormat("%-6d %5d  no estimate: %s\n", r.job_id, r.jobs_used, r.error);
        continue;
      }
      const double et = 100 * (r.predicted_seconds - r.actual_seconds) / r.actual_seconds;
      const double ee = 100 * (r.predicted_joules - r.actual_joules) / r.actual_joules;
      std::cout << absl::StrFormat("%-6d %5d %10.2f %10.2f %+7.1f %12.1f %12.1f %+7.1f\n",
                                   r.job_id, r.jobs_used, r.actual_seconds, r.predicted_seconds,
                                   et, r.actual_joules, r.predicted_joules, ee);
      sum_t += std::abs(et);
      sum_e += std::abs(ee);
      ++n;
    }
    if (n > 0) {
      std::cout << absl::StrFormat("mean absolute error over %d held-out jobs: wall time %.1f%%, "
                                   "energy %.1f%%\n",
                                   n, sum_t / n, sum_e / n);
    }
    return n > 0 ? kExitOk : kExitFailed;
  }
  absl::StatusOr<JobEstimate> e = EstimateJob(spec, *history);
  if (!e.ok() && f.calibrate && e.status().code() == absl::StatusCode::kFailedPrecondition) {
    std::cerr << "no history for " << JobFamily(spec) << ": running 2 calibration jobs\n";
    int k = 0;
    for (const v1::JobSpec& c : CalibrationSpecs(spec)) {
      absl::StatusOr<int64_t> id =
          RunAndWait(client, c, absl::StrCat("calibrate/", JobFamily(c), "/", c.global_batch_size(),
                                            "/", c.workers(), "/", k++));
      if (!id.ok()) {
        std::cerr << "error: estimate: calibration: " << id.status().message() << "\n";
        return kExitFailed;
      }
    }
    history = FinishedJobs(client);
    if (!history.ok()) {
      std::cerr << "error: estimate: " << client.address() << ": " << history.status().message()
                << "\n";
      return kExitUnavailable;
    }
    e = EstimateJob(spec, *history);
    if (e.ok()) e->method += " (calibration runs: rough, extrapolated from short jobs)";
  }
  if (!e.ok()) {
    std::cerr << "error: estimate: " << e.status().message() << "\n";
    return kExitFailed;
  }
  std::cout << EstimateText(*e, spec);
  return kExitOk;
}

int Submit(const GlobalOptions& g, const SubmitFlags& f, CLI::App& cmd) {
  if (f.estimate) return Estimate(g, f, cmd);
  absl::StatusOr<v1::JobSpec> built = BuildSpec(f, cmd);
  if (!built.ok()) {
    std::cerr << "error: " << built.status().message() << "\n";
    return kExitUsage;
  }
  const v1::JobSpec& spec = *built;

  JobClient client = JobClient::ForCoordinator(g);
  v1::JobSpec planned = spec;
  if (planned.carbon_aware() && !(planned.expected_run_seconds() > 0)) {
    // The run to plan a carbon-aware start for: the estimate's upper bound.
    if (absl::Status st = FillCarbonRun(FinishedJobs(client), &planned); !st.ok()) {
      std::cerr << "error: submit: " << st.message() << "\n";
      return kExitUsage;
    }
  }
  // A budgeted job whose estimate is confidently above its budget would only be stopped.
  if (spec.energy_budget_joules() > 0 && !f.force) {
    v1::JobSpec normalized = spec;
    absl::StatusOr<std::vector<v1::Job>> history = FinishedJobs(client);
    if (NormalizeAndValidateSpec(normalized).ok() && history.ok()) {
      absl::StatusOr<JobEstimate> e = EstimateJob(normalized, *history);
      const bool above = e.ok() && ConfidentlyAboveBudget(*e, spec.energy_budget_joules());
      if (above) {
        std::cerr << absl::StrFormat(
            "error: submit: the estimate, %.1f J%s (from %d jobs), is above the energy "
            "budget of %.1f J; raise --energy-budget, or submit anyway with --force\n",
            e->joules,
            e->joules_ci95 > 0 ? absl::StrFormat(" +- %.1f", e->joules_ci95) : std::string(),
            e->job_ids.size(), spec.energy_budget_joules());
        return kExitFailed;
      }
    }
  }
  v1::SubmitJobRequest req;
  *req.mutable_spec() = planned;
  req.set_request_id(f.request_id);
  absl::StatusOr<v1::SubmitJobResponse> resp = client.Submit(req);
  if (!resp.ok()) return client.Report("submit", resp.status());
  if (!resp->warning().empty()) std::cerr << "warning: " << resp->warning() << "\n";
  if (f.watch) {
    std::cout << "job " << resp->job_id() << (resp->existing() ? " (already submitted)" : "")
              << " submitted\n";
    return WatchJob(client, resp->job_id());
  }
  std::cout << resp->job_id() << "\n";
  return kExitOk;
}

// The flags that describe a job (submit and estimate take the same).
void AddSpecFlags(CLI::App* cmd, SubmitFlags* f) {
  cmd->add_option("-f,--file", f->file,
                  "job spec, YAML or JSON, a regular file of at most 1 MiB, or - for standard "
                  "input (flags override it)");
  cmd->add_option("--name", f->name, "job name");
  cmd->add_option("--model", f->model,
                  "logreg, mlp, cnn, resnet18, resnet50, or torchscript:FILE (a module saved "
                  "with torch.jit.save, under a data root)");
  cmd->add_option("--dataset", f->dataset,
                  "fashion-mnist (default), idx:DIR, csv:FILE (numbers; label column \"label\" "
                  "or the last) or synthetic:CxHxW:CLASSES:N");
  cmd->add_option("--workers", f->workers, "world size N (default 1)");
  cmd->add_option("--device,--device-kind", f->device, "cpu (default) or gpu")
      ->check(CLI::IsMember({"cpu", "gpu"}));
  cmd->add_option("--global-batch-size", f->global_batch, "GBS = LBS x N");
  cmd->add_option("--local-batch-size", f->local_batch, "LBS per worker");
  cmd->add_option("--epochs", f->epochs, "epochs (default 1)");
  cmd->add_option("--set", f->sets,
                  "FIELD=VALUE: set a job-file field (nested ones dotted: augment.size=32), "
                  "over the file's; repeatable")
      ->expected(1)
      ->take_all();
  cmd->add_option("--optimizer", f->optimizer, "sgd (default), adamw or lars")
      ->check(CLI::IsMember({"sgd", "adamw", "lars"}));
  cmd->add_option("--lr", f->lr, "learning rate (default 0.05)");
  cmd->add_option("--momentum", f->momentum, "sgd and lars momentum (default 0)");
  cmd->add_option("--weight-decay", f->weight_decay,
                  "weight decay: L2 for sgd and lars, decoupled for adamw (default 0)");
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
  cmd->add_option("--algorithm", f->algorithm,
                  "sgd (default) or ga: an island genetic algorithm over logreg weights, set "
                  "up by the job file's `ga:` (population, generations, ...)")
      ->check(CLI::IsMember({"sgd", "ga"}));
  cmd->add_flag("--keep-model", f->keep_model,
                "keep the trained model (a final checkpoint) for `joule export`");
  cmd->add_option("--target-accuracy", f->target_accuracy,
                  "accuracy (0..1) of --target-metric whose energy and time to reach the "
                  "report gives");
  cmd->add_option("--target-metric", f->target_metric,
                  "the figure targets are read from: test_accuracy (default), "
                  "test_top_k_accuracy, train_accuracy, train_top_k_accuracy, or a loss: "
                  "test_loss, test_rmse (a regression's default), train_eval_loss");
  cmd->add_option("--target-loss", f->target_loss,
                  "for a loss --target-metric: the value to reach (at or under it)");
  cmd->add_option("--energy-budget", f->energy_budget,
                  "stop the job (after a checkpoint) once it has spent this much energy, "
                  "e.g. 50kJ, 2MJ, 0.5kWh (above 0; none: no budget); warned at 90%");
  AddCarbonFlags(cmd, &f->carbon, "the job");
  cmd->add_option("--sync", f->sync,
                  "allreduce (default), local-sgd, or powersgd (low-rank compressed gradients "
                  "with error feedback)")
      ->check(CLI::IsMember({"allreduce", "local-sgd", "powersgd"}));
  cmd->add_option("--powersgd-rank", f->powersgd_rank,
                  "powersgd: the rank R of each gradient matrix's approximation (default 1)");
  cmd->add_option("--sync-period", f->sync_period, "local SGD: average parameters every H steps");
  cmd->add_flag("--fp16-compression", f->fp16_compression,
                "allreduce: exchange gradients as half precision (half the bytes)");
  cmd->add_option("--bucket-bytes", f->bucket_bytes,
                  "allreduce: gradient bucket size in bytes (default 25 MiB, as PyTorch DDP)");
  cmd->add_option("--sync-warmup-steps", f->sync_warmup,
                  "local SGD and powersgd: steps of exact gradient allreduce first");
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
}

}  // namespace

void AddSubmitCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<SubmitFlags>();
  KeepAlive(f);
  CLI::App* cmd = app.add_subcommand(
      "submit", "submit a training job; prints its id (or follows it with --watch)");
  AddSpecFlags(cmd, f.get());
  cmd->add_option("--request-id", f->request_id,
                  "idempotency key: a retried submit with it returns the same job");
  cmd->add_flag("-w,--watch", f->watch, "follow the job until it ends");
  cmd->add_flag("--estimate", f->estimate,
                "print the predicted time, device-hours and energy (joule estimate); submit "
                "nothing");
  cmd->add_flag("--force", f->force,
                "submit a budgeted job even when its estimate is above its --energy-budget");
  cmd->callback([&g, f, rc, cmd] { *rc = Submit(g, *f, *cmd); });
}


void AddEstimateCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<SubmitFlags>();
  KeepAlive(f);
  CLI::App* cmd = app.add_subcommand(
      "estimate",
      "predict a job's wall time, device-hours and energy from finished jobs of its family "
      "(model, dataset, device kind); takes submit's job flags; submits nothing");
  AddSpecFlags(cmd, f.get());
  cmd->add_flag("--calibrate", f->calibrate,
                "with no history: run two short calibration jobs first (labelled "
                "calibration=true)");
  cmd->add_option("--holdout", f->holdout,
                  "evaluate the estimator instead: predict each of the newest N finished jobs "
                  "of the family from the older ones, and print the errors")
      ->check(CLI::Range(1, 1000));
  cmd->callback([&g, f, rc, cmd] { *rc = Estimate(g, *f, *cmd); });
}

absl::StatusOr<std::vector<v1::Job>> ListAllJobs(JobClient& client, v1::ListJobsRequest request,
                                                 size_t max_jobs) {
  std::vector<v1::Job> jobs;
  request.set_page_size(500);
  request.set_before_id(0);
  do {
    absl::StatusOr<v1::ListJobsResponse> resp = client.ListJobs(request);
    if (!resp.ok()) return resp.status();  // its code kept: unreachable, refused, ...
    for (v1::Job& j : *resp->mutable_jobs()) {
      if (jobs.size() < max_jobs) jobs.push_back(std::move(j));
    }
    request.set_before_id(resp->next_before_id());
  } while (request.before_id() > 0 && jobs.size() < max_jobs);
  return jobs;
}

absl::StatusOr<std::vector<v1::Job>> FinishedJobs(JobClient& client) {
  v1::ListJobsRequest request;
  request.set_state(v1::JOB_STATE_SUCCEEDED);
  return ListAllJobs(client, std::move(request), 5000);
}

}  // namespace joule::client
