#include "worker/train/checkpoint_assembly.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/train/checkpoint.h"

namespace joule::worker {
namespace {

void AddTensor(v1::TensorData* out, const std::string& name, const torch::Tensor& t) {
  out->set_name(name);
  for (int64_t d : t.sizes()) out->add_shape(d);
  torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  out->mutable_values()->Add(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// The checkpoint's tensors of optimizer state slot `slot` (optimizer.h's order).
const google::protobuf::RepeatedPtrField<v1::TensorData>& Slot(const v1::Checkpoint& c,
                                                                int slot) {
  return slot == 0 ? c.momentum() : c.second_moment();
}

// Copies the checkpoint's parameters and optimizer state into `params` and `state`.
absl::Status RestoreParameters(const v1::Checkpoint& c, const std::vector<std::string>& names,
                               std::vector<torch::Tensor>& params,
                               std::vector<std::vector<torch::Tensor>>& state) {
  if (c.parameters_size() != static_cast<int>(params.size())) {
    return absl::DataLossError(absl::StrCat("checkpoint holds ", c.parameters_size(),
                                            " parameters, the model has ", params.size()));
  }
  // Either no state (written before the first step) or exactly the optimizer's slots.
  const int slots = (c.momentum_size() > 0) + (c.second_moment_size() > 0);
  if (slots != 0 && (slots != static_cast<int>(state.size()) ||
                     (slots == 1 && c.momentum_size() == 0))) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint holds ", slots, " optimizer state slots (momentum ", c.momentum_size(),
        ", second_moment ", c.second_moment_size(), " tensors), the optimizer keeps ",
        state.size()));
  }
  for (int slot = 0; slot < slots; ++slot) {
    if (Slot(c, slot).size() != static_cast<int>(params.size())) {
      return absl::DataLossError(absl::StrCat("checkpoint holds ", Slot(c, slot).size(), " ",
                                              Optimizer::SlotName(slot), " tensors, the model has ",
                                              params.size(), " parameters"));
    }
  }
  torch::NoGradGuard no_grad;
  auto copy = [&](const v1::TensorData& src, torch::Tensor& dst, size_t i) -> absl::Status {
    if (src.name() != names[i] || src.values_size() != dst.numel()) {
      return absl::DataLossError(absl::StrCat("checkpoint tensor ", src.name(), " (",
                                              src.values_size(), " values) does not fit ",
                                              names[i], " (", dst.numel(), ")"));
    }
    dst.copy_(torch::from_blob(const_cast<float*>(src.values().data()), dst.sizes(),
                               torch::kFloat32));
    return absl::OkStatus();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (absl::Status s = copy(c.parameters(static_cast<int>(i)), params[i], i); !s.ok()) return s;
    for (int slot = 0; slot < slots; ++slot) {
      if (absl::Status s = copy(Slot(c, slot)[static_cast<int>(i)], state[slot][i], i); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

// Copies a checkpoint's model statistics into `stats`.
absl::Status RestoreStatistics(const v1::Checkpoint& c, const std::vector<std::string>& names,
                               std::vector<torch::Tensor>& stats) {
  if (c.statistics_size() == 0) return absl::OkStatus();
  if (c.statistics_size() != static_cast<int>(stats.size())) {
    return absl::DataLossError(absl::StrCat("checkpoint holds ", c.statistics_size(),
                                            " statistics tensors, the model has ", stats.size()));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < stats.size(); ++i) {
    const v1::TensorData& src = c.statistics(static_cast<int>(i));
    if (src.name() != names[i] || src.values_size() != stats[i].numel()) {
      return absl::DataLossError(absl::StrCat("checkpoint statistics ", src.name(), " (",
                                              src.values_size(), " values) do not fit ",
                                              names[i], " (", stats[i].numel(), ")"));
    }
    stats[i].copy_(torch::from_blob(const_cast<float*>(src.values().data()), stats[i].sizes(),
                                    torch::kFloat32));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointDirectory(const std::string& root, const v1::Assignment& a) {
  return CheckpointDirectory(root, a.job_id(), a.job_uid());
}

v1::Checkpoint AssembleCheckpoint(const v1::Assignment& assignment, uint64_t spec_hash,
                                  const CheckpointPosition& position, const ModelTensors& model,
                                  const Optimizer& optimizer,
                                  const std::vector<torch::Tensor>& statistics,
                                  v1::PowerSgdState* sync_state) {
  v1::Checkpoint c;
  c.set_format_version(1);
  c.set_spec_hash(spec_hash);
  c.set_job_id(assignment.job_id());
  c.set_attempt(assignment.attempt());
  c.set_next_epoch(position.next_epoch);
  c.set_next_step_in_epoch(position.next_step_in_epoch);
  c.set_global_step(position.global_step);
  c.set_test_accuracy(position.test_accuracy);
  c.set_test_loss(position.test_loss);
  if (position.plateau.has_value()) {
    c.mutable_plateau()->set_scale(position.plateau->scale);
    c.mutable_plateau()->set_best(position.plateau->best);
    c.mutable_plateau()->set_bad_epochs(position.plateau->bad_epochs);
  }
  for (size_t i = 0; i < model.parameters.size(); ++i) {
    AddTensor(c.add_parameters(), model.parameter_names[i], model.parameters[i]);
    if (!optimizer.started()) continue;
    const auto& state = optimizer.state();
    AddTensor(c.add_momentum(), model.parameter_names[i], state[0][i]);
    if (state.size() > 1) {
      AddTensor(c.add_second_moment(), model.parameter_names[i], state[1][i]);
    }
  }
  for (size_t i = 0; i < statistics.size(); ++i) {
    AddTensor(c.add_statistics(), model.statistic_names[i], statistics[i]);
  }
  if (sync_state != nullptr && sync_state->world_size() > 0) {
    c.mutable_powersgd_q()->Swap(sync_state->mutable_q());
    c.mutable_powersgd_error()->Swap(sync_state->mutable_error());
    c.mutable_powersgd()->Swap(sync_state);
  }
  if (sync_state != nullptr) sync_state->Clear();
  return c;
}

ResumePoint ResumePointOf(const v1::Checkpoint& c) {
  ResumePoint p;
  p.next_epoch = c.next_epoch();
  p.next_step_in_epoch = c.next_step_in_epoch();
  p.global_step = c.global_step();
  p.has_optimizer_state = c.momentum_size() > 0;
  p.test_accuracy = c.test_accuracy();
  p.has_plateau = c.has_plateau();
  if (p.has_plateau) {
    p.plateau = PlateauState{c.plateau().scale(), c.plateau().best(), c.plateau().bad_epochs()};
  }
  return p;
}

absl::Status RestoreCheckpoint(const v1::Checkpoint& checkpoint, ModelTensors& model,
                               Optimizer& optimizer) {
  if (absl::Status s = RestoreParameters(checkpoint, model.parameter_names, model.parameters,
                                         optimizer.state());
      !s.ok()) {
    return s;
  }
  return RestoreStatistics(checkpoint, model.statistic_names, model.statistics);
}

absl::StatusOr<std::optional<ResumePoint>> RestoreNewestCheckpoint(
    const std::string& dir, uint64_t spec_hash, int64_t job_id, ModelTensors& model,
    Optimizer& optimizer, v1::PowerSgdState* sync_state) {
  if (sync_state != nullptr) sync_state->Clear();
  if (dir.empty()) return std::optional<ResumePoint>();
  std::vector<std::string> skipped;
  absl::StatusOr<v1::Checkpoint> ckpt = LoadNewestCheckpoint(dir, spec_hash, &skipped);
  for (const std::string& why : skipped) spdlog::warn("job {}: skipping {}", job_id, why);
  if (!ckpt.ok()) return std::optional<ResumePoint>();
  if (absl::Status s = RestoreCheckpoint(*ckpt, model, optimizer); !s.ok()) return s;
  if (sync_state != nullptr && ckpt->has_powersgd()) {
    sync_state->Swap(ckpt->mutable_powersgd());
    sync_state->mutable_q()->Swap(ckpt->mutable_powersgd_q());
    sync_state->mutable_error()->Swap(ckpt->mutable_powersgd_error());
  }
  return std::optional<ResumePoint>(ResumePointOf(*ckpt));
}

}  // namespace joule::worker
