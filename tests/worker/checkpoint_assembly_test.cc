#include "worker/train/checkpoint_assembly.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "worker/train/checkpoint.h"

namespace joule::worker {
namespace {

// Parameters "w" [2, 3] and "b" [2], statistic "bn.mean" [3], filled with `base` + index.
ModelTensors Tensors(float base) {
  ModelTensors t;
  t.parameter_names = {"w", "b"};
  t.parameters = {(torch::arange(6, torch::kFloat32).reshape({2, 3}) + base).requires_grad_(true),
                  (torch::arange(2, torch::kFloat32) + base).requires_grad_(true)};
  t.statistic_names = {"bn.mean"};
  t.statistics = {torch::arange(3, torch::kFloat32) + base};
  return t;
}

OptimizerOptions WithMomentum() {
  OptimizerOptions o;
  o.momentum = 0.9;
  return o;
}

OptimizerOptions AdamW() {
  OptimizerOptions o;
  o.kind = OptimizerOptions::Kind::kAdamW;
  return o;
}

v1::Assignment Assignment() {
  v1::Assignment a;
  a.set_job_id(7);
  a.set_attempt(3);
  return a;
}

TEST(CheckpointAssemblyTest, DirectoryNamesTheJobAndItsUid) {
  v1::Assignment a = Assignment();
  EXPECT_EQ(CheckpointDirectory("", a), "");
  EXPECT_EQ(CheckpointDirectory("/ckpt", a), "/ckpt/job-7");
  a.set_job_uid("f00d");
  EXPECT_EQ(CheckpointDirectory("/ckpt", a), "/ckpt/job-7-f00d");
}

TEST(CheckpointAssemblyTest, AssemblesPositionTensorsAndMomentumOnceStarted) {
  ModelTensors t = Tensors(1.0f);
  Optimizer sgd(t.parameters, WithMomentum());
  const CheckpointPosition at{2, 5, 133, 0.75, 0.5, PlateauState{0.25, 1.5, 3}};
  v1::Checkpoint c = AssembleCheckpoint(Assignment(), 42, at, t, sgd, t.statistics);
  EXPECT_EQ(c.format_version(), 1);
  EXPECT_EQ(c.spec_hash(), 42u);
  EXPECT_EQ(c.job_id(), 7);
  EXPECT_EQ(c.attempt(), 3);
  EXPECT_EQ(c.next_epoch(), 2);
  EXPECT_EQ(c.next_step_in_epoch(), 5);
  EXPECT_EQ(c.global_step(), 133);
  EXPECT_EQ(c.test_accuracy(), 0.75);
  EXPECT_EQ(c.test_loss(), 0.5);
  ASSERT_EQ(c.parameters_size(), 2);
  EXPECT_EQ(c.parameters(0).name(), "w");
  EXPECT_EQ(std::vector<int64_t>(c.parameters(0).shape().begin(), c.parameters(0).shape().end()),
            (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c.parameters(0).values(5), 6.0f);
  EXPECT_EQ(c.momentum_size(), 0) << "no momentum before the first step";
  ASSERT_EQ(c.statistics_size(), 1);
  EXPECT_EQ(c.statistics(0).name(), "bn.mean");
  sgd.set_steps(1);
  c = AssembleCheckpoint(Assignment(), 42, at, t, sgd, t.statistics);
  EXPECT_EQ(c.momentum_size(), 2);
  EXPECT_EQ(c.momentum(1).name(), "b");
  const ResumePoint p = ResumePointOf(c);
  // The plateau schedule's state travels with the position.
  EXPECT_EQ(p, (ResumePoint{2, 5, 133, true, 0.75, true, PlateauState{0.25, 1.5, 3}}));
}

TEST(CheckpointAssemblyTest, RestoreRoundTripsEveryTensor) {
  ModelTensors saved = Tensors(1.0f);
  Optimizer saved_sgd(saved.parameters, WithMomentum());
  for (auto& b : saved_sgd.state()[0]) b.fill_(-3.0f);
  saved_sgd.set_steps(1);
  const v1::Checkpoint c = AssembleCheckpoint(Assignment(), 1, CheckpointPosition{}, saved,
                                              saved_sgd, saved.statistics);
  ModelTensors fresh = Tensors(100.0f);
  Optimizer fresh_sgd(fresh.parameters, WithMomentum());
  ASSERT_TRUE(RestoreCheckpoint(c, fresh, fresh_sgd).ok());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(torch::equal(fresh.parameters[i], saved.parameters[i])) << i;
    EXPECT_TRUE(torch::equal(fresh_sgd.state()[0][i], saved_sgd.state()[0][i]));
  }
  EXPECT_TRUE(torch::equal(fresh.statistics[0], saved.statistics[0]));
  EXPECT_FALSE(fresh_sgd.started()) << "the resume point carries it";
}

TEST(CheckpointAssemblyTest, AdamWKeepsBothMomentsAndRestoresThem) {
  ModelTensors saved = Tensors(1.0f);
  Optimizer saved_adamw(saved.parameters, AdamW());
  for (auto& t : saved_adamw.state()[0]) t.fill_(-3.0f);
  for (auto& t : saved_adamw.state()[1]) t.fill_(0.5f);
  const v1::Checkpoint before = AssembleCheckpoint(Assignment(), 1, CheckpointPosition{}, saved,
                                                   saved_adamw, saved.statistics);
  EXPECT_EQ(before.momentum_size(), 0);
  EXPECT_EQ(before.second_moment_size(), 0) << "no state before the first step";
  saved_adamw.set_steps(4);
  const v1::Checkpoint c = AssembleCheckpoint(Assignment(), 1, CheckpointPosition{}, saved,
                                              saved_adamw, saved.statistics);
  ASSERT_EQ(c.second_moment_size(), 2);
  EXPECT_EQ(c.second_moment(1).name(), "b");
  EXPECT_TRUE(ResumePointOf(c).has_optimizer_state);
  ModelTensors fresh = Tensors(100.0f);
  Optimizer fresh_adamw(fresh.parameters, AdamW());
  ASSERT_TRUE(RestoreCheckpoint(c, fresh, fresh_adamw).ok());
  for (size_t slot = 0; slot < 2; ++slot) {
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(torch::equal(fresh_adamw.state()[slot][i], saved_adamw.state()[slot][i]))
          << Optimizer::SlotName(static_cast<int>(slot)) << " " << i;
    }
  }
  // State written by another optimizer than the one restoring it is data loss, both ways.
  ModelTensors t = Tensors(0.0f);
  Optimizer sgd(t.parameters, WithMomentum());
  absl::Status s = RestoreCheckpoint(c, t, sgd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("checkpoint holds 2 optimizer state slots"), std::string::npos) << s;
  Optimizer sgd_started(saved.parameters, WithMomentum());
  sgd_started.set_steps(1);
  const v1::Checkpoint of_sgd = AssembleCheckpoint(Assignment(), 1, CheckpointPosition{}, saved,
                                                   sgd_started, saved.statistics);
  Optimizer adamw(t.parameters, AdamW());
  s = RestoreCheckpoint(of_sgd, t, adamw);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("the optimizer keeps 2"), std::string::npos) << s;
  // Second moments without first ones.
  v1::Checkpoint odd = c;
  odd.clear_momentum();
  Optimizer lone(t.parameters, OptimizerOptions{});
  Optimizer one_slot(t.parameters, WithMomentum());
  EXPECT_EQ(RestoreCheckpoint(odd, t, one_slot).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(RestoreCheckpoint(odd, t, lone).code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointAssemblyTest, TensorsThatDoNotFitAreDataLoss) {
  const ModelTensors saved = Tensors(1.0f);
  Optimizer saved_sgd(saved.parameters, WithMomentum());
  saved_sgd.set_steps(1);
  const v1::Checkpoint good =
      AssembleCheckpoint(Assignment(), 1, CheckpointPosition{}, saved, saved_sgd, saved.statistics);
  struct Case {
    const char* what;
    std::function<void(v1::Checkpoint&)> edit;
    const char* message;
  };
  for (const Case& c : {
           Case{"a parameter too many", [](v1::Checkpoint& k) { *k.add_parameters() = k.parameters(0); },
                "checkpoint holds 3 parameters, the model has 2"},
           Case{"momentum for one parameter", [](v1::Checkpoint& k) { k.mutable_momentum()->RemoveLast(); },
                "checkpoint holds 1 momentum tensors, the model has 2 parameters"},
           Case{"another name", [](v1::Checkpoint& k) { k.mutable_parameters(1)->set_name("bias"); },
                "checkpoint tensor bias (2 values) does not fit b (2)"},
           Case{"another size", [](v1::Checkpoint& k) { k.mutable_momentum(0)->add_values(1); },
                "checkpoint tensor w (7 values) does not fit w (6)"},
           Case{"statistics too many", [](v1::Checkpoint& k) { *k.add_statistics() = k.statistics(0); },
                "checkpoint holds 2 statistics tensors, the model has 1"},
           Case{"statistics of another size",
                [](v1::Checkpoint& k) { k.mutable_statistics(0)->mutable_values()->RemoveLast(); },
                "checkpoint statistics bn.mean (2 values) do not fit bn.mean (3)"},
       }) {
    v1::Checkpoint bad = good;
    c.edit(bad);
    ModelTensors t = Tensors(0.0f);
    Optimizer sgd(t.parameters, WithMomentum());
    absl::Status s = RestoreCheckpoint(bad, t, sgd);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.what << ": " << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.what << ": " << s;
  }
}

TEST(CheckpointAssemblyTest, RankZeroRestoresTheNewestMatchingCheckpoint) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("joule-assembly-", getpid());
  std::filesystem::remove_all(dir);
  ModelTensors t = Tensors(0.0f);
  Optimizer sgd(t.parameters, WithMomentum());
  // No directory configured, or none on disk: start from scratch.
  absl::StatusOr<std::optional<ResumePoint>> none = RestoreNewestCheckpoint("", 9, 7, t, sgd);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  none = RestoreNewestCheckpoint(dir.string(), 9, 7, t, sgd);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  ModelTensors saved = Tensors(5.0f);
  Optimizer saved_sgd(saved.parameters, WithMomentum());
  for (int64_t step : {10, 20}) {
    const CheckpointPosition at{1, step / 10, step, 0.5, 0.25, std::nullopt};
    ASSERT_TRUE(WriteCheckpoint(dir.string(),
                                AssembleCheckpoint(Assignment(), 9, at, saved, saved_sgd,
                                                   saved.statistics),
                                2)
                    .ok());
  }
  absl::StatusOr<std::optional<ResumePoint>> got =
      RestoreNewestCheckpoint(dir.string(), 9, 7, t, sgd);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, (ResumePoint{1, 2, 20, false, 0.5, false, PlateauState{}}));
  EXPECT_TRUE(torch::equal(t.parameters[0], saved.parameters[0]));
  // A checkpoint of another spec is never resumed.
  ModelTensors other = Tensors(0.0f);
  Optimizer other_sgd(other.parameters, WithMomentum());
  got = RestoreNewestCheckpoint(dir.string(), 10, 7, other, other_sgd);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  EXPECT_TRUE(torch::equal(other.parameters[0], Tensors(0.0f).parameters[0]));
  std::filesystem::remove_all(dir);
}

TEST(CheckpointAssemblyTest, APowerSgdStateTravelsATensorAtATimeAndComesBackWhole) {
  // Its tensors are top-level repeated fields (16, 17), so a state far larger than one
  // protobuf piece is written piece by piece; the restore puts it back together.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("joule-assembly-psgd-", getpid());
  std::filesystem::remove_all(dir);
  v1::PowerSgdState state;
  state.set_matrix_rank(2);
  state.set_world_size(3);
  auto add = [](v1::TensorData* t, const std::string& name, int n, float v) {
    t->set_name(name);
    t->add_shape(n);
    for (int i = 0; i < n; ++i) t->add_values(v + static_cast<float>(i));
  };
  add(state.add_q(), "fc.weight", 8, 1.0f);
  for (int r = 0; r < 3; ++r) add(state.add_error(), "fc.weight", 40, 10.0f * r);
  const v1::PowerSgdState want = state;
  ModelTensors saved = Tensors(5.0f);
  Optimizer saved_sgd(saved.parameters, WithMomentum());
  v1::Checkpoint c = AssembleCheckpoint(Assignment(), 9, CheckpointPosition{1, 0, 4, 0.5, 0.25, {}},
                                        saved, saved_sgd, saved.statistics, &state);
  EXPECT_EQ(state.ByteSizeLong(), 0u) << "moved into the checkpoint";
  EXPECT_EQ(c.powersgd().q_size() + c.powersgd().error_size(), 0);
  EXPECT_EQ(c.powersgd_q_size(), 1);
  EXPECT_EQ(c.powersgd_error_size(), 3);
  // Each error tensor fits a piece; the state as one message would not.
  std::string bytes;
  ASSERT_TRUE(AppendCheckpointPayload(c, 400, &bytes).ok());
  ASSERT_TRUE(WriteCheckpoint(dir.string(), c, 2).ok());
  ModelTensors t = Tensors(0.0f);
  Optimizer sgd(t.parameters, WithMomentum());
  v1::PowerSgdState got;
  got.set_world_size(99);  // cleared first
  absl::StatusOr<std::optional<ResumePoint>> point =
      RestoreNewestCheckpoint(dir.string(), 9, 7, t, sgd, &got);
  ASSERT_TRUE(point.ok() && point->has_value()) << point.status();
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
  // A checkpoint without one leaves the state empty.
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(WriteCheckpoint(
                  dir.string(),
                  AssembleCheckpoint(Assignment(), 9, CheckpointPosition{1, 0, 4, 0.5, 0.25, {}},
                                     saved, saved_sgd, saved.statistics),
                  2)
                  .ok());
  got.set_world_size(99);
  point = RestoreNewestCheckpoint(dir.string(), 9, 7, t, sgd, &got);
  ASSERT_TRUE(point.ok() && point->has_value()) << point.status();
  EXPECT_EQ(got.world_size(), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace joule::worker
