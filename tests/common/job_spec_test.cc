#include "common/job_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace joule {
namespace {

v1::JobSpec Valid() {
  v1::JobSpec s;
  s.set_model("mlp");
  s.set_dataset("fashion-mnist");
  s.set_workers(2);
  s.set_global_batch_size(128);
  s.set_epochs(3);
  s.mutable_optimizer()->set_lr(0.05);
  s.mutable_optimizer()->set_momentum(0.9);
  return s;
}

// Valid() turned into an hdf5: regression (a TorchScript model, no hidden sizes).
void MakeRegression(v1::JobSpec& j) {
  j.set_dataset("hdf5:/d.h5:/x:/y");
  j.set_model("torchscript:/m.pt");
  j.clear_hidden_sizes();
}

using SpecEdit = std::function<void(v1::JobSpec&)>;

// Each case (name, edit of Valid(), text) is refused with INVALID_ARGUMENT, its message
// holding the text.
void ExpectEachRefused(const std::vector<std::tuple<const char*, SpecEdit, const char*>>& cases) {
  for (const auto& [name, edit, message] : cases) {
    v1::JobSpec bad = Valid();
    edit(bad);
    absl::Status st = NormalizeAndValidateSpec(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(std::string(st.message()).find(message), std::string::npos)
        << name << ": got \"" << st.message() << "\"";
  }
}

TEST(JobSpecTest, FillsDefaultsAndDerivesLocalBatch) {
  v1::JobSpec s = Valid();
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.local_batch_size(), 64);
  EXPECT_EQ(s.device_kind(), v1::DEVICE_KIND_CPU);
  EXPECT_EQ(s.optimizer().name(), "sgd");
  EXPECT_EQ(s.sync().strategy(), v1::SYNC_STRATEGY_ALLREDUCE);
  ASSERT_EQ(s.hidden_sizes_size(), 2);
  EXPECT_EQ(s.hidden_sizes(0), 512);
  EXPECT_EQ(s.hidden_sizes(1), 256);
}

TEST(JobSpecTest, DerivesGlobalBatchFromLocal) {
  v1::JobSpec s = Valid();
  s.clear_global_batch_size();
  s.set_local_batch_size(32);
  s.set_workers(4);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.global_batch_size(), 128);
}

struct BadCase {
  const char* name;
  std::function<void(v1::JobSpec&)> mutate;
  const char* message;  // must appear in the error
};

TEST(JobSpecTest, RejectsBadSpecsNamingFieldAndValue) {
  const BadCase cases[] = {
      {"unknown model", [](v1::JobSpec& s) { s.set_model("gpt5"); }, "model \"gpt5\" is unknown"},
      {"empty model", [](v1::JobSpec& s) { s.clear_model(); }, "model is empty"},
      {"unknown dataset", [](v1::JobSpec& s) { s.set_dataset("cifar"); },
       "dataset \"cifar\" is unknown"},
      {"idx without dir", [](v1::JobSpec& s) { s.set_dataset("idx:"); }, "names no directory"},
      {"zero workers", [](v1::JobSpec& s) { s.set_workers(0); }, "workers 0 is out of range"},
      {"too many workers", [](v1::JobSpec& s) { s.set_workers(100000); },
       "workers 100000 is out of range"},
      {"gbs not divisible",
       [](v1::JobSpec& s) {
         s.set_workers(3);
         s.set_global_batch_size(100);
       },
       "global_batch_size 100 is not divisible by workers 3"},
      {"gbs and lbs disagree", [](v1::JobSpec& s) { s.set_local_batch_size(32); },
       "global_batch_size 128 != local_batch_size 32 x workers 2"},
      {"no batch", [](v1::JobSpec& s) { s.clear_global_batch_size(); }, "both unset"},
      // Issue 23: what the strategy would ignore is refused.
      {"fp16 with local SGD",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD);
         s.mutable_sync()->set_period(4);
         s.mutable_sync()->set_fp16_compression(true);
       },
       "local SGD without warm-up steps averages parameters only"},
      {"fp16 on a GPU",
       [](v1::JobSpec& s) {
         s.set_device_kind(v1::DEVICE_KIND_GPU);
         s.mutable_sync()->set_fp16_compression(true);
       },
       "NCCL allreduce would ignore it"},
      {"negative gbs", [](v1::JobSpec& s) { s.set_global_batch_size(-8); },
       "global_batch_size -8 is negative"},
      {"absurd batch", [](v1::JobSpec& s) { s.set_global_batch_size(1 << 30); },
       "exceeds the limit"},
      {"zero epochs", [](v1::JobSpec& s) { s.set_epochs(0); }, "epochs 0 is out of range"},
      {"absurd epochs", [](v1::JobSpec& s) { s.set_epochs(1000000); },
       "epochs 1000000 is out of range"},
      {"zero lr", [](v1::JobSpec& s) { s.mutable_optimizer()->set_lr(0); },
       "optimizer.lr 0 is out of range"},
      {"nan lr", [](v1::JobSpec& s) { s.mutable_optimizer()->set_lr(std::nan("")); },
       "optimizer.lr nan"},
      {"momentum 1", [](v1::JobSpec& s) { s.mutable_optimizer()->set_momentum(1.0); },
       "optimizer.momentum 1 is out of range"},
      {"negative decay", [](v1::JobSpec& s) { s.mutable_optimizer()->set_weight_decay(-1); },
       "optimizer.weight_decay -1"},
      {"unknown optimizer", [](v1::JobSpec& s) { s.mutable_optimizer()->set_name("adam"); },
       "optimizer.name \"adam\" is unknown"},
      {"local sgd without a period",
       [](v1::JobSpec& s) { s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD); },
       "sync.period 0 is out of range [1, 1000000]"},
      {"negative warmup",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD);
         s.mutable_sync()->set_period(4);
         s.mutable_sync()->set_warmup_steps(-1);
       },
       "sync.warmup_steps -1 is negative"},
      {"period with allreduce", [](v1::JobSpec& s) { s.mutable_sync()->set_period(4); },
       "apply to SYNC_STRATEGY_LOCAL_SGD only"},
      {"hidden zero", [](v1::JobSpec& s) { s.add_hidden_sizes(0); }, "hidden_sizes[0] 0"},
      {"hidden on cnn",
       [](v1::JobSpec& s) {
         s.set_model("cnn");
         s.add_hidden_sizes(10);
       },
       "has no configurable hidden layers"},
      {"negative threads", [](v1::JobSpec& s) { s.set_intra_op_threads(-1); },
       "intra_op_threads -1"},
      {"subset below a batch", [](v1::JobSpec& s) { s.set_max_train_samples(100); },
       "max_train_samples 100 is smaller than one global batch (128)"},
      {"long name", [](v1::JobSpec& s) { s.set_name(std::string(1000, 'x')); },
       "name is 1000 bytes"},
  };
  for (const BadCase& c : cases) {
    v1::JobSpec s = Valid();
    c.mutate(s);
    absl::Status st = NormalizeAndValidateSpec(s);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(std::string(st.message()).find(c.message), std::string::npos)
        << c.name << ": got \"" << st.message() << "\"";
  }
}

TEST(JobSpecTest, RejectsBadPowerSgdAndUnknownStrategies) {
  ExpectEachRefused({
      {"powersgd rank negative",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
         s.mutable_sync()->set_powersgd_rank(-1);
       },
       "sync.powersgd_rank -1 is out of range [1, 1024]"},
      {"powersgd rank huge",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
         s.mutable_sync()->set_powersgd_rank(1025);
       },
       "sync.powersgd_rank 1025 is out of range"},
      {"powersgd rank with allreduce",
       [](v1::JobSpec& s) { s.mutable_sync()->set_powersgd_rank(4); },
       "sync.powersgd_rank applies to SYNC_STRATEGY_POWERSGD only"},
      {"powersgd rank with local sgd",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD);
         s.mutable_sync()->set_period(4);
         s.mutable_sync()->set_powersgd_rank(4);
       },
       "sync.powersgd_rank applies to SYNC_STRATEGY_POWERSGD only"},
      {"powersgd negative warm-up",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
         s.mutable_sync()->set_warmup_steps(-3);
       },
       "sync.warmup_steps -3 is negative"},
      {"powersgd with a period",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
         s.mutable_sync()->set_period(4);
       },
       "sync.period and sync.average_momentum apply to SYNC_STRATEGY_LOCAL_SGD only"},
      {"powersgd with momentum averaging",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
         s.mutable_sync()->set_average_momentum(true);
       },
       "sync.period and sync.average_momentum apply to SYNC_STRATEGY_LOCAL_SGD only"},
      {"powersgd with fp16",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
         s.mutable_sync()->set_fp16_compression(true);
       },
       "sync.fp16_compression and PowerSGD are two compressions"},
      {"powersgd buckets without warm-up",
       [](v1::JobSpec& s) {
         s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
         s.mutable_sync()->set_bucket_bytes(1 << 20);
       },
       "PowerSGD without warm-up steps has none"},
      {"unknown strategy",
       [](v1::JobSpec& s) { s.mutable_sync()->set_strategy(static_cast<v1::SyncStrategy>(9)); },
       "sync.strategy 9 is unknown"},
  });
}

TEST(JobSpecTest, PowerSgdTakesARankAndAWarmUpOnEitherDevice) {
  for (v1::DeviceKind device : {v1::DEVICE_KIND_CPU, v1::DEVICE_KIND_GPU}) {
    for (int rank : {0, 1, 4, 1024}) {
      v1::JobSpec s = Valid();
      s.set_device_kind(device);
      s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
      s.mutable_sync()->set_powersgd_rank(rank);
      s.mutable_sync()->set_warmup_steps(rank);
      absl::Status st = NormalizeAndValidateSpec(s);
      EXPECT_TRUE(st.ok()) << rank << ": " << st;
      EXPECT_EQ(s.sync().powersgd_rank(), rank) << "stored as given (0: 1)";
    }
  }
  v1::JobSpec ga = Valid();
  ga.set_algorithm("ga");
  ga.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
  absl::Status st = NormalizeAndValidateSpec(ga);
  EXPECT_NE(st.message().find("PowerSGD does not apply"), std::string::npos) << st;
}

TEST(JobSpecTest, EachOptimizerGetsPyTorchsDefaults) {
  v1::JobSpec s = Valid();
  s.mutable_optimizer()->set_name("adamw");
  s.mutable_optimizer()->set_momentum(0);
  s.mutable_optimizer()->set_weight_decay(0.05);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.optimizer().beta1(), 0.9);  // the stored spec says what ran
  s = Valid();
  s.mutable_optimizer()->set_name("adamw");
  s.mutable_optimizer()->set_momentum(0);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.optimizer().weight_decay(), 0.01) << "torch.optim.AdamW's default";
  s = Valid();
  s.mutable_optimizer()->set_name("adamw");
  s.mutable_optimizer()->set_momentum(0);
  s.mutable_optimizer()->set_weight_decay(0);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.optimizer().weight_decay(), 0) << "an explicit 0 stays";
  s = Valid();
  s.mutable_optimizer()->set_name("adamw");
  s.mutable_optimizer()->set_momentum(0);
  s.mutable_optimizer()->set_weight_decay(0.05);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.optimizer().beta2(), 0.999);
  EXPECT_EQ(s.optimizer().eps(), 1e-8);
  s = Valid();
  s.mutable_optimizer()->set_name("lars");
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.optimizer().trust_coefficient(), 0.001);
  EXPECT_EQ(s.optimizer().eps(), 1e-8);
  s = Valid();
  s.mutable_optimizer()->set_nesterov(true);
  s.mutable_optimizer()->set_decoupled_weight_decay(true);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.optimizer().eps(), 0) << "sgd has no eps";

}

TEST(JobSpecTest, EachOptimizerRefusesTheOthersFieldsAndBadValues) {
  using Edit = std::function<void(v1::OptimizerSpec&)>;
  struct Case {
    const char* name;
    Edit edit;
    const char* message;
  };
  const double nan = std::nan("");
  auto adamw = [](Edit more) -> Edit {
    return [more](v1::OptimizerSpec& o) {
      o.set_name("adamw");
      o.set_momentum(0);
      more(o);
    };
  };
  auto lars = [](Edit more) -> Edit {
    return [more](v1::OptimizerSpec& o) {
      o.set_name("lars");
      more(o);
    };
  };
  const std::vector<Case> cases = {
      // Each optimizer's own fields on another: named, never silently ignored.
      {"beta1 on sgd", [](v1::OptimizerSpec& o) { o.set_beta1(0.8); },
       "optimizer.beta1 is for adamw, not sgd"},
      {"beta2 on lars", lars([](v1::OptimizerSpec& o) { o.set_beta2(0.9); }),
       "optimizer.beta2 is for adamw, not lars"},
      {"eps on sgd", [](v1::OptimizerSpec& o) { o.set_eps(1e-6); },
       "optimizer.eps is for adamw and lars, not sgd"},
      {"trust on adamw", adamw([](v1::OptimizerSpec& o) { o.set_trust_coefficient(0.01); }),
       "optimizer.trust_coefficient is for lars, not adamw"},
      {"nesterov on lars", lars([](v1::OptimizerSpec& o) { o.set_nesterov(true); }),
       "optimizer.nesterov is for sgd, not lars"},
      {"decoupled on adamw",
       adamw([](v1::OptimizerSpec& o) { o.set_decoupled_weight_decay(true); }),
       "optimizer.decoupled_weight_decay is for sgd, not adamw"},
      {"momentum on adamw", [](v1::OptimizerSpec& o) { o.set_name("adamw"); },
       "optimizer.momentum is for sgd and lars (adamw has beta1), not adamw"},
      {"nesterov without momentum",
       [](v1::OptimizerSpec& o) {
         o.set_momentum(0);
         o.set_nesterov(true);
       },
       "optimizer.nesterov needs a momentum > 0"},
      // Ranges, at and past each bound, and NaN.
      {"beta1 1", adamw([](v1::OptimizerSpec& o) { o.set_beta1(1); }),
       "optimizer.beta1 1 is out of range (0, 1)"},
      {"beta1 negative", adamw([](v1::OptimizerSpec& o) { o.set_beta1(-0.5); }),
       "optimizer.beta1 -0.5 is out of range"},
      {"beta2 nan", adamw([=](v1::OptimizerSpec& o) { o.set_beta2(nan); }),
       "optimizer.beta2 nan is out of range"},
      {"eps negative", adamw([](v1::OptimizerSpec& o) { o.set_eps(-1e-8); }),
       "optimizer.eps -1e-08 is out of range (0, 0.01]"},
      {"eps large", lars([](v1::OptimizerSpec& o) { o.set_eps(0.5); }),
       "optimizer.eps 0.5 is out of range"},
      {"eps inf", lars([](v1::OptimizerSpec& o) { o.set_eps(INFINITY); }),
       "optimizer.eps inf is out of range"},
      {"trust 2", lars([](v1::OptimizerSpec& o) { o.set_trust_coefficient(2); }),
       "optimizer.trust_coefficient 2 is out of range (0, 1]"},
      {"trust negative", lars([](v1::OptimizerSpec& o) { o.set_trust_coefficient(-0.1); }),
       "optimizer.trust_coefficient -0.1 is out of range"},
      {"unknown", [](v1::OptimizerSpec& o) { o.set_name("Adam"); },
       "optimizer.name \"Adam\" is unknown (want sgd, adamw or lars)"},
  };
  for (const Case& c : cases) {
    v1::JobSpec bad = Valid();
    c.edit(*bad.mutable_optimizer());
    absl::Status st = NormalizeAndValidateSpec(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(std::string(st.message()).find(c.message), std::string::npos)
        << c.name << ": got \"" << st.message() << "\"";
  }
}

TEST(JobSpecTest, ImageFolderPipelinesGetTorchvisionsDefaults) {
  v1::JobSpec s = Valid();
  s.set_dataset("imagefolder:/data/imagenet");
  s.mutable_augment()->mutable_random_resized_crop();  // present, all defaults
  s.mutable_augment()->set_hflip(true);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  const v1::AugmentSpec& a = s.augment();
  EXPECT_EQ(a.random_resized_crop().size(), 224);
  EXPECT_EQ(std::vector<double>(a.random_resized_crop().scale().begin(),
                                a.random_resized_crop().scale().end()),
            (std::vector<double>{0.08, 1.0}));
  EXPECT_DOUBLE_EQ(a.random_resized_crop().ratio(1), 4.0 / 3.0);
  EXPECT_EQ(a.size(), 224);
  EXPECT_EQ(a.eval_resize(), 256);
  EXPECT_EQ(a.normalize(), "imagenet");
  EXPECT_EQ(s.max_corrupt_images(), 10);
  s = Valid();
  s.set_dataset("imagefolder:/d");
  s.mutable_augment()->set_size(112);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.augment().eval_resize(), 128);

}

TEST(JobSpecTest, ImageFolderPipelinesNameEveryBadValue) {
  using Edit = std::function<void(v1::JobSpec&)>;
  auto folder = [](Edit more) -> Edit {
    return [more](v1::JobSpec& j) {
      j.set_dataset("imagefolder:/d");
      more(j);
    };
  };
  const std::vector<std::tuple<const char*, Edit, const char*>> cases = {
      {"augment elsewhere", [](v1::JobSpec& j) { j.mutable_augment()->set_hflip(true); },
       "augment, data_threads and max_corrupt_images are for imagefolder: datasets only"},
      {"threads elsewhere", [](v1::JobSpec& j) { j.set_data_threads(2); }, "for imagefolder:"},
      {"ga on images", folder([](v1::JobSpec& j) { j.set_algorithm("ga"); j.set_model("logreg"); }),
       "algorithm ga trains on datasets held in memory"},
      {"threads", folder([](v1::JobSpec& j) { j.set_data_threads(-1); }), "data_threads -1"},
      {"threads many", folder([](v1::JobSpec& j) { j.set_data_threads(1000); }),
       "data_threads 1000 is out of range"},
      {"corrupt", folder([](v1::JobSpec& j) { j.set_max_corrupt_images(-2); }),
       "max_corrupt_images -2 is negative"},
      {"normalize", folder([](v1::JobSpec& j) { j.mutable_augment()->set_normalize("cifar"); }),
       "augment.normalize \"cifar\" is unknown"},
      {"size small", folder([](v1::JobSpec& j) { j.mutable_augment()->set_size(4); }),
       "augment.size 4 is out of range [8, 1024]"},
      {"crop size large",
       folder([](v1::JobSpec& j) { j.mutable_augment()->mutable_random_resized_crop()->set_size(5000); }),
       "augment.size 5000 is out of range"},
      {"sizes differ", folder([](v1::JobSpec& j) {
         j.mutable_augment()->set_size(100);
         j.mutable_augment()->mutable_random_resized_crop()->set_size(224);
       }), "augment.size 100 and random_resized_crop.size 224 differ"},
      {"scale reversed", folder([](v1::JobSpec& j) {
         auto* c = j.mutable_augment()->mutable_random_resized_crop();
         c->add_scale(1.0);
         c->add_scale(0.5);
       }), "augment.random_resized_crop.scale [1, 0.5] is not [min, max]"},
      {"scale past 1", folder([](v1::JobSpec& j) {
         auto* c = j.mutable_augment()->mutable_random_resized_crop();
         c->add_scale(0.5);
         c->add_scale(1.5);
       }), "scale [0.5, 1.5]"},
      {"scale one value", folder([](v1::JobSpec& j) {
         j.mutable_augment()->mutable_random_resized_crop()->add_scale(0.5);
       }), "scale [0.5]"},
      {"scale nan", folder([](v1::JobSpec& j) {
         auto* c = j.mutable_augment()->mutable_random_resized_crop();
         c->add_scale(std::nan(""));
         c->add_scale(1);
       }), "scale [nan, 1]"},
      {"ratio zero", folder([](v1::JobSpec& j) {
         auto* c = j.mutable_augment()->mutable_random_resized_crop();
         c->add_ratio(0);
         c->add_ratio(1);
       }), "ratio [0, 1] is not [min, max] with 0.01 <= min <= max <= 100"},
      {"ratio inf", folder([](v1::JobSpec& j) {
         auto* c = j.mutable_augment()->mutable_random_resized_crop();
         c->add_ratio(1);
         c->add_ratio(INFINITY);
       }), "ratio [1, inf]"},
      {"eval below size", folder([](v1::JobSpec& j) { j.mutable_augment()->set_eval_resize(100); }),
       "augment.eval_resize 100 is out of range [size 224, 4096]"},
      {"no directory", [](v1::JobSpec& j) { j.set_dataset("imagefolder:"); },
       "dataset \"imagefolder:\" names no directory"},
  };
  ExpectEachRefused(cases);
}

TEST(JobSpecTest, Hdf5RegressionsParseTheirNamesAndTakeOnlyWhatFitsThem) {
  absl::StatusOr<Hdf5Dataset> h = ParseHdf5Dataset("hdf5:/data/a:b.h5:/fields/t0:/fields/t1");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->file, "/data/a:b.h5");  // the last two fields are the datasets
  EXPECT_EQ(h->inputs, "/fields/t0");
  EXPECT_EQ(h->targets, "/fields/t1");
  for (const char* bad : {"hdf5:", "hdf5:/a.h5", "hdf5:/a.h5:/x", "hdf5:/a.h5::/y",
                          "hdf5:/a.h5:/x:", "hdf5::/x:/y", "hdf5:::"}) {
    EXPECT_EQ(ParseHdf5Dataset(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  v1::JobSpec s = Valid();
  s.set_dataset("hdf5:/data/era5.h5:/x:/y");
  s.set_model("torchscript:/data/fourcastnet.pt");
  s.clear_hidden_sizes();
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.loss(), "mse");
  EXPECT_EQ(s.stage(), "none");
  s.set_stage("local");
  EXPECT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(UserPaths(s), (std::vector<std::string>{"/data/era5.h5", "/data/fourcastnet.pt"}));
  v1::JobSpec c = Valid();
  ASSERT_TRUE(NormalizeAndValidateSpec(c).ok());
  EXPECT_EQ(c.loss(), "cross_entropy");

  using Edit = std::function<void(v1::JobSpec&)>;
  auto hdf5 = [](Edit more) -> Edit {
    return [more](v1::JobSpec& j) {
      j.set_dataset("hdf5:/d.h5:/x:/y");
      j.set_model("torchscript:/m.pt");
      j.clear_hidden_sizes();
      more(j);
    };
  };
  const std::vector<std::tuple<const char*, Edit, const char*>> cases = {
      {"mse on classes", [](v1::JobSpec& j) { j.set_loss("mse"); },
       "loss \"mse\" does not fit classification"},
      {"unknown loss", [](v1::JobSpec& j) { j.set_loss("hinge"); }, "loss \"hinge\""},
      {"cross entropy on fields", hdf5([](v1::JobSpec& j) { j.set_loss("cross_entropy"); }),
       "does not fit an hdf5: regression (want mse or lat_weighted_mse)"},
      {"a classifier model", hdf5([](v1::JobSpec& j) { j.set_model("mlp"); }),
       "an hdf5: regression needs a torchscript: model"},
      {"top-k", hdf5([](v1::JobSpec& j) { j.set_top_k(5); }), "are for classification"},
      {"target accuracy", hdf5([](v1::JobSpec& j) { j.set_target_accuracy(0.9); }),
       "target_metric test_rmse is a loss: give target_loss, not target_accuracy"},
      {"malformed", [](v1::JobSpec& j) { j.set_dataset("hdf5:/d.h5"); },
       "is malformed (want hdf5:FILE:INPUTS:TARGETS"},
      {"staging in-memory data", [](v1::JobSpec& j) { j.set_stage("local"); },
       "stage: local copies imagefolder: and hdf5: data; fashion-mnist is read into memory"},
      {"unknown stage", hdf5([](v1::JobSpec& j) { j.set_stage("nvme"); }),
       "stage \"nvme\" is unknown (want none or local)"},
  };
  ExpectEachRefused(cases);
}

// The report's target: each metric accepted where the job measures it, its default by the
// kind of job, and every mismatch (a value of the wrong kind, a metric the job does not
// measure) named at submit.
TEST(JobSpecTest, TargetMetricsAreAcceptedWhereTheJobMeasuresThem) {
  v1::JobSpec c = Valid();
  ASSERT_TRUE(NormalizeAndValidateSpec(c).ok());
  EXPECT_EQ(c.target_metric(), "test_accuracy");
  const auto regression = MakeRegression;
  v1::JobSpec r = Valid();
  regression(r);
  ASSERT_TRUE(NormalizeAndValidateSpec(r).ok());
  EXPECT_EQ(r.target_metric(), "test_rmse");
  EXPECT_EQ(r.latitude_range_size(), 0) << "only lat_weighted_mse takes latitudes";

  const std::vector<std::pair<const char*, SpecEdit>> good = {
      {"top-5 target",
       [](v1::JobSpec& j) {
         j.set_top_k(5);
         j.set_target_metric("test_top_k_accuracy");
         j.set_target_accuracy(0.9);
       }},
      {"train target",
       [](v1::JobSpec& j) {
         j.set_evaluate_train(true);
         j.set_target_metric("train_accuracy");
         j.set_target_accuracy(0.9);
       }},
      {"train top-5",
       [](v1::JobSpec& j) {
         j.set_evaluate_train(true);
         j.set_top_k(5);
         j.set_target_metric("train_top_k_accuracy");
       }},
      {"cross-entropy target",
       [](v1::JobSpec& j) {
         j.set_target_metric("test_loss");
         j.set_target_loss(0.4);
       }},
      {"rmse target",
       [&](v1::JobSpec& j) {
         regression(j);
         j.set_target_loss(0.05);
       }},
      {"train mse",
       [&](v1::JobSpec& j) {
         regression(j);
         j.set_evaluate_train(true);
         j.set_target_metric("train_eval_loss");
         j.set_target_loss(0.01);
       }},
      {"lat-weighted",
       [&](v1::JobSpec& j) {
         regression(j);
         j.set_loss("lat_weighted_mse");
       }},
      {"regional grid",
       [&](v1::JobSpec& j) {
         regression(j);
         j.set_loss("lat_weighted_mse");
         j.add_latitude_range(-10);
         j.add_latitude_range(60);
       }},
  };
  for (const auto& [name, edit] : good) {
    v1::JobSpec j = Valid();
    edit(j);
    EXPECT_TRUE(NormalizeAndValidateSpec(j).ok()) << name << ": " << NormalizeAndValidateSpec(j);
    if (j.loss() == "lat_weighted_mse") {
      ASSERT_EQ(j.latitude_range_size(), 2) << name;
      EXPECT_NE(j.latitude_range(0), j.latitude_range(1)) << name;
    }
  }
  v1::JobSpec global = Valid();
  regression(global);
  global.set_loss("lat_weighted_mse");
  ASSERT_TRUE(NormalizeAndValidateSpec(global).ok());
  EXPECT_EQ(global.latitude_range(0), 90);  // filled in: the stored spec says what ran
  EXPECT_EQ(global.latitude_range(1), -90);
}

// A target the job does not measure, a value of the wrong kind, and latitudes that do not
// fit: each named at submit.
TEST(JobSpecTest, TargetMetricsTheJobDoesNotMeasureAreRefused) {
  const auto regression = MakeRegression;
  ExpectEachRefused({
      {"unknown", [](v1::JobSpec& j) { j.set_target_metric("top5"); },
       "target_metric \"top5\" is unknown (want one of test_accuracy, test_top_k_accuracy"},
      {"top-k unmeasured", [](v1::JobSpec& j) { j.set_target_metric("test_top_k_accuracy"); },
       "needs top_k"},
      {"train unmeasured", [](v1::JobSpec& j) { j.set_target_metric("train_accuracy"); },
       "needs evaluate_train: true"},
      {"loss value for accuracy", [](v1::JobSpec& j) { j.set_target_loss(0.3); },
       "is an accuracy: give target_accuracy, not target_loss"},
      {"accuracy value for loss",
       [](v1::JobSpec& j) {
         j.set_target_metric("test_loss");
         j.set_target_accuracy(0.3);
       },
       "is a loss: give target_loss"},
      {"negative loss",
       [](v1::JobSpec& j) {
         j.set_target_metric("test_loss");
         j.set_target_loss(-1);
       },
       "target_loss -1 is not a finite value >= 0"},
      {"nan loss",
       [](v1::JobSpec& j) {
         j.set_target_metric("test_loss");
         j.set_target_loss(std::nan(""));
       },
       "is not a finite value"},
      {"rmse of classes", [](v1::JobSpec& j) { j.set_target_metric("test_rmse"); },
       "test_rmse is for an hdf5: regression"},
      {"accuracy of fields",
       [&](v1::JobSpec& j) {
         regression(j);
         j.set_target_metric("test_accuracy");
       },
       "is for classification; an hdf5: regression targets test_rmse"},
      {"latitudes on mse",
       [&](v1::JobSpec& j) {
         regression(j);
         j.add_latitude_range(90);
         j.add_latitude_range(-90);
       },
       "latitude_range is for loss: lat_weighted_mse"},
      {"one latitude",
       [&](v1::JobSpec& j) {
         regression(j);
         j.set_loss("lat_weighted_mse");
         j.add_latitude_range(90);
       },
       "latitude_range has 1 values; want two"},
      {"past the pole",
       [&](v1::JobSpec& j) {
         regression(j);
         j.set_loss("lat_weighted_mse");
         j.add_latitude_range(91);
         j.add_latitude_range(0);
       },
       "latitude_range value 91 is not in [-90, 90]"},
      {"no span",
       [&](v1::JobSpec& j) {
         regression(j);
         j.set_loss("lat_weighted_mse");
         j.add_latitude_range(45);
         j.add_latitude_range(45);
       },
       "spans no rows"},
      {"ga top-k",
       [](v1::JobSpec& j) {
         j.set_model("logreg");
         j.clear_hidden_sizes();
         j.set_algorithm("ga");
         j.set_top_k(5);
         j.set_target_metric("test_top_k_accuracy");
       },
       "algorithm ga measures only test_accuracy and test_loss"},
      {"weighted classes", [](v1::JobSpec& j) { j.set_loss("lat_weighted_mse"); },
       "does not fit classification"},
  });
}

TEST(JobSpecTest, GeneticAlgorithmSpecsGetDefaultsAndEveryBadValueIsNamed) {
  v1::JobSpec s = Valid();
  s.set_model("logreg");
  s.clear_hidden_sizes();
  s.set_algorithm("ga");
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.ga().population(), 64);
  EXPECT_EQ(s.ga().generations(), 100);
  EXPECT_EQ(s.ga().fitness_batch(), 256);
  EXPECT_DOUBLE_EQ(s.ga().mutation_rate(), 0.05);
  for (auto [workers, population] : {std::pair{3, 66}, {5, 65}, {64, 128}, {100, 200}}) {
    v1::JobSpec w = s;
    w.set_workers(workers);
    w.set_global_batch_size(workers);
    w.clear_local_batch_size();
    w.mutable_ga()->clear_population();
    ASSERT_TRUE(NormalizeAndValidateSpec(w).ok()) << workers;
    EXPECT_EQ(w.ga().population(), population) << workers;
  }
  EXPECT_DOUBLE_EQ(s.ga().crossover_rate(), 0.5);
  // An explicit 0 is a choice (no mutation, no crossover), not "unset".
  v1::JobSpec zeros = Valid();
  zeros.set_model("logreg");
  zeros.clear_hidden_sizes();
  zeros.set_algorithm("ga");
  zeros.mutable_ga()->set_mutation_rate(0);
  zeros.mutable_ga()->set_crossover_rate(0);
  ASSERT_TRUE(NormalizeAndValidateSpec(zeros).ok());
  EXPECT_EQ(zeros.ga().mutation_rate(), 0);
  EXPECT_EQ(zeros.ga().crossover_rate(), 0);
  const std::vector<std::pair<std::function<void(v1::JobSpec&)>, std::string>> bad = {
      {[](v1::JobSpec& x) { x.set_algorithm("adam"); }, "algorithm \"adam\" is unknown"},
      {[](v1::JobSpec& x) { x.set_model("cnn"); },
       "algorithm ga evolves logreg or mlp weights; model \"cnn\" trains with sgd"},
      {[](v1::JobSpec& x) {
         x.set_model("mlp");
         x.add_hidden_sizes(4096);
         x.mutable_ga()->set_population(256);
         x.mutable_ga()->set_fitness_batch(1024);
       },
       "the widest hidden layer = 1073741824 is over 134217728"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_population(1); }, "ga.population 1"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_generations(-3); }, "ga.generations -3"},
      // Issue 23: an island the worker would refuse is refused at submit, with the figures.
      {[](v1::JobSpec& x) {
         x.mutable_ga()->set_population(100000);
         x.mutable_ga()->set_fitness_batch(128);
       }, "genomes of 7850 weights is 392500000 floats, over 268435456"},
      // Issue 23: 0 given is refused, not taken for unset (which runs 100).
      {[](v1::JobSpec& x) { x.mutable_ga()->set_generations(0); }, "ga.generations 0"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_mutation_rate(1.5); }, "ga.mutation_rate 1.5"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_mutation_scale(-1); }, "ga.mutation_scale -1"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_mutation_scale(std::nan("")); },
       "ga.mutation_scale nan"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_crossover_rate(-0.1); }, "ga.crossover_rate"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_elite(32); },
       "ga.elite 32 is out of range [0, 32) (an island's population)"},  // 64 over 2 workers
      {[](v1::JobSpec& x) { x.mutable_ga()->set_population(63); },
       "ga.population 63 does not split into islands of at least 2 over 2 workers"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_population(2); },
       "ga.population 2 does not split into islands of at least 2"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_migration_size(32); }, "ga.migration_size 32"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_migration_interval(-1); },
       "ga.migration_interval -1"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_migration_size(64); }, "ga.migration_size 64"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_fitness_batch(-5); }, "ga.fitness_batch -5"},
      {[](v1::JobSpec& x) {
         x.mutable_ga()->set_population(100000);
         x.mutable_ga()->set_fitness_batch(1000);
       },
       "is over 16777216"},
      {[](v1::JobSpec& x) { x.mutable_ga()->set_migration_size(2); },
       "ga.migration_size is set but ga.migration_interval is 0"},
      {[](v1::JobSpec& x) { x.set_device_kind(v1::DEVICE_KIND_GPU); }, "does not yet take"},
  };
  for (const auto& [edit, want] : bad) {
    v1::JobSpec b = Valid();
    b.set_model("logreg");
    b.clear_hidden_sizes();
    b.set_algorithm("ga");
    edit(b);
    absl::Status st = NormalizeAndValidateSpec(b);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  }
}

TEST(JobSpecTest, AccumulationStepsJoinTheBatchArithmetic) {
  v1::JobSpec s = Valid();  // GBS 128, 2 workers
  s.set_accumulation_steps(4);
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_EQ(s.local_batch_size(), 16);  // 128 = 16 x 2 workers x 4 micro-batches
  v1::JobSpec bad = Valid();
  bad.set_accumulation_steps(3);
  absl::Status st = NormalizeAndValidateSpec(bad);
  EXPECT_NE(std::string(st.message()).find("not divisible by workers 2 x accumulation_steps 3"),
            std::string::npos)
      << st;
  v1::JobSpec scaling = Valid();
  scaling.set_lr_scaling("sqrt");
  EXPECT_FALSE(NormalizeAndValidateSpec(scaling).ok());
  scaling.set_lr_scaling("linear");
  scaling.set_lr_warmup_epochs(5);  // more than the 3 epochs
  EXPECT_FALSE(NormalizeAndValidateSpec(scaling).ok());
}

TEST(JobSpecTest, ParsesSyntheticDatasets) {
  auto s = ParseSynthetic("synthetic:3x224x224:1000:12800");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->channels, 3);
  EXPECT_EQ(s->height, 224);
  EXPECT_EQ(s->classes, 1000);
  EXPECT_EQ(s->size, 12800);
  for (const char* bad : {"synthetic:", "synthetic:3x224:10:5", "synthetic:3x224x224:1:5",
                          "synthetic:3x224x224:10:0", "synthetic:0x2x2:10:5",
                          "synthetic:3x224x224:10:many"}) {
    EXPECT_EQ(ParseSynthetic(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  v1::JobSpec spec = Valid();
  spec.set_dataset("synthetic:1x8x8:4:1024");
  EXPECT_TRUE(NormalizeAndValidateSpec(spec).ok());
  spec.set_dataset_fraction(-2);
  EXPECT_FALSE(NormalizeAndValidateSpec(spec).ok());
}

TEST(JobSpecTest, ResolvesDatasets) {
  std::string dir;
  ASSERT_TRUE(ResolveDataset("fashion-mnist", "/data", &dir).ok());
  EXPECT_EQ(dir, "/data/fashion-mnist");
  ASSERT_TRUE(ResolveDataset("idx:/tmp/x", "/data", &dir).ok());
  EXPECT_EQ(dir, "/tmp/x");
  EXPECT_FALSE(ResolveDataset("imagenet", "/data", &dir).ok());
  EXPECT_FALSE(ResolveDataset("mnist", "/data", &dir).ok());  // not packaged: use idx:DIR
  ASSERT_TRUE(ResolveDataset("csv:/tmp/t.csv", "/data", &dir).ok());
  EXPECT_EQ(dir, "/tmp/t.csv");
  EXPECT_FALSE(ResolveDataset("csv:", "/data", &dir).ok());
}

TEST(JobSpecTest, KnowsTheModelZooAndTheUserPathsItNames) {
  for (const char* m : {"logreg", "mlp", "cnn", "resnet18", "resnet50", "torchscript:/m.pt"}) {
    EXPECT_TRUE(IsKnownModel(m)) << m;
  }
  for (const char* m : {"resnet34", "torchscript:", "TorchScript:/m.pt", ""}) {
    EXPECT_FALSE(IsKnownModel(m)) << m;
  }
  v1::JobSpec spec = Valid();
  spec.set_model("torchscript:/models/m.pt");
  spec.set_dataset("csv:/data/t.csv");
  EXPECT_EQ(UserPaths(spec), (std::vector<std::string>{"/data/t.csv", "/models/m.pt"}));
  spec.set_model("resnet50");
  spec.set_dataset("fashion-mnist");
  EXPECT_TRUE(UserPaths(spec).empty());
  spec.set_model("resnet34");
  absl::Status s = NormalizeAndValidateSpec(spec);
  EXPECT_NE(std::string(s.message()).find("resnet18, resnet50 or torchscript:FILE"),
            std::string::npos) << s;
}


// Every string field of a spec, with a setter: each is bounded and must be valid UTF-8.
std::vector<std::pair<std::string, std::function<void(v1::JobSpec&, const std::string&)>>>
StringFields() {
  return {
      {"name", [](v1::JobSpec& s, const std::string& v) { s.set_name(v); }},
      {"model", [](v1::JobSpec& s, const std::string& v) { s.set_model("torchscript:" + v); }},
      {"dataset", [](v1::JobSpec& s, const std::string& v) { s.set_dataset("idx:" + v); }},
      {"optimizer.name",
       [](v1::JobSpec& s, const std::string& v) { s.mutable_optimizer()->set_name(v); }},
      {"lr_scaling", [](v1::JobSpec& s, const std::string& v) { s.set_lr_scaling(v); }},
      {"lr_schedule.name",
       [](v1::JobSpec& s, const std::string& v) { s.mutable_lr_schedule()->set_name(v); }},
      {"labels", [](v1::JobSpec& s, const std::string& v) { (*s.mutable_labels())["k"] = v; }},
      {"labels", [](v1::JobSpec& s, const std::string& v) { (*s.mutable_labels())[v] = "v"; }},
  };
}

TEST(JobSpecTest, LearningRateSchedulesGetDefaultsAndEveryBadValueIsNamed) {
  v1::JobSpec plain = Valid();
  ASSERT_TRUE(NormalizeAndValidateSpec(plain).ok());
  EXPECT_EQ(plain.lr_schedule().name(), "constant");
  // The paper's recipe: 5 warm-up epochs, then plateau on the test loss.
  v1::JobSpec paper = Valid();
  paper.set_epochs(100);
  paper.set_lr_scaling("linear");
  paper.set_lr_warmup_epochs(5);
  paper.mutable_lr_schedule()->set_name("plateau");
  paper.mutable_lr_schedule()->set_factor(0.5);
  paper.mutable_lr_schedule()->set_patience(5);
  EXPECT_TRUE(NormalizeAndValidateSpec(paper).ok());
  const BadCase cases[] = {
      {"unknown", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_name("exp"); },
       "lr_schedule.name \"exp\" is unknown"},
      {"step without epochs", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_name("step"); },
       "lr_schedule.step_epochs 0 is out of range"},
      {"step past the job",
       [](v1::JobSpec& s) {
         s.mutable_lr_schedule()->set_name("step");
         s.mutable_lr_schedule()->set_step_epochs(4);  // 3 epochs
       },
       "lr_schedule.step_epochs 4"},
      {"gamma > 1", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_gamma(1.5); },
       "lr_schedule.gamma 1.5"},
      {"gamma NaN", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_gamma(NAN); },
       "lr_schedule.gamma nan"},
      {"negative min", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_min_lr(-1); },
       "lr_schedule.min_lr -1"},
      {"min above lr", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_min_lr(0.5); },
       "lr_schedule.min_lr 0.5"},
      {"factor 1", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_factor(1); },
       "lr_schedule.factor 1"},
      {"negative patience", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_patience(-1); },
       "lr_schedule.patience -1"},
      {"threshold 1", [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_threshold(1); },
       "lr_schedule.threshold 1"},
      {"threshold inf",
       [](v1::JobSpec& s) { s.mutable_lr_schedule()->set_threshold(INFINITY); },
       "lr_schedule.threshold inf"},
      {"top-1 as top_k", [](v1::JobSpec& s) { s.set_top_k(1); }, "top_k 1 is out of range"},
      {"negative top_k", [](v1::JobSpec& s) { s.set_top_k(-5); }, "top_k -5"},
      {"huge top_k", [](v1::JobSpec& s) { s.set_top_k(1001); }, "top_k 1001"},
  };
  for (const BadCase& c : cases) {
    v1::JobSpec s = Valid();
    c.mutate(s);
    absl::Status st = NormalizeAndValidateSpec(s);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << c.name << ": " << st.message();
  }
}

TEST(JobSpecTest, EveryStringFieldRefusesInvalidUtf8ControlsAndHugeValues) {
  for (const auto& [field, set] : StringFields()) {
    for (const std::string& bad : {std::string("x\xFFy"), std::string("\xC3"),
                                  std::string("a\nb"), std::string(1 << 20, 'z')}) {
      v1::JobSpec s = Valid();
      set(s, bad);
      absl::Status st = NormalizeAndValidateSpec(s);
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field;
      EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
      EXPECT_LT(st.message().size(), 300u) << field;  // one line, never the whole value
    }
  }
}

TEST(JobSpecTest, TooManyLabelsAreRefused) {
  v1::JobSpec s = Valid();
  for (int i = 0; i < 65; ++i) (*s.mutable_labels())["k" + std::to_string(i)] = "v";
  EXPECT_EQ(NormalizeAndValidateSpec(s).message(), "labels has 65 entries, more than 64");
}

TEST(JobSpecTest, TheLargestAcceptedSpecFitsAWorkersMessage) {
  // Every bounded field at its bound: the spec must pass and stay far below the workers'
  // 4 MiB session message limit.
  SpecLimits limits;
  v1::JobSpec s = Valid();
  s.set_name(std::string(limits.max_name_bytes, 'n'));
  s.set_dataset("idx:" + std::string(limits.max_path_bytes - 4, 'd'));
  s.set_model("mlp");
  for (size_t i = 0; i < limits.max_labels; ++i) {
    std::string key = std::to_string(i);
    key.resize(limits.max_label_key_bytes, 'k');
    (*s.mutable_labels())[key] = std::string(limits.max_label_value_bytes, 'v');
  }
  for (int i = 0; i < limits.max_hidden_layers; ++i) s.add_hidden_sizes(limits.max_hidden_width);
  ASSERT_TRUE(NormalizeAndValidateSpec(s, limits).ok());
  EXPECT_LE(s.ByteSizeLong(), kMaxSpecBytes);
  EXPECT_LT(kMaxSpecBytes, size_t{4} << 20);
}


TEST(JobSpecTest, EstimatesParametersAndMemoryInClosedForm) {
  v1::JobSpec s = Valid();  // mlp 784-512-256-10 on fashion-mnist
  ASSERT_TRUE(NormalizeAndValidateSpec(s).ok());
  auto e = EstimateResources(s);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->parameters, 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ(e->model_bytes, e->parameters * 16);
  EXPECT_EQ(e->dataset_bytes, 70000 * (784 * 4 + 8));
  s.set_model("resnet18");
  s.clear_hidden_sizes();
  // torchvision's 11,176,512 without the fc are for 3 input channels; Fashion-MNIST has
  // one, so the stem holds 64 x 2 x 7 x 7 fewer (models_test builds it and counts).
  EXPECT_EQ(EstimateResources(s)->parameters, 11'176'512 - 64 * 2 * 49 + 5130);
  s.set_model("logreg");
  s.set_dataset("synthetic:3x32x32:100:1000");
  e = EstimateResources(s);
  EXPECT_EQ(e->parameters, 3 * 32 * 32 * 100 + 100);
  EXPECT_EQ(e->dataset_bytes, 1100 * (3 * 32 * 32 * 4 + 8));
  s.set_model("mlp");
  for (int i = 0; i < 16; ++i) s.add_hidden_sizes(65536);
  EXPECT_GT(EstimateResources(s)->model_bytes, int64_t{1} << 39);  // 15 x 65536^2 x 16 B
  // A ga job holds an island of genomes: parameters x population / workers, 4 copies.
  v1::JobSpec ga = Valid();
  ga.set_model("logreg");
  ga.clear_hidden_sizes();
  ga.set_algorithm("ga");
  ga.set_workers(2);
  ga.mutable_ga()->set_population(64);
  ASSERT_TRUE(NormalizeAndValidateSpec(ga).ok());
  e = EstimateResources(ga);
  EXPECT_EQ(e->ga_island_floats, 7850 * 32);
  EXPECT_EQ(e->model_bytes, 7850 * 32 * 16);
}

TEST(JobSpecTest, UserPathsBecomeAbsoluteAndCanonicalUnderTheRoots) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("joule_paths_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "data" / "set");
  fs::create_directory_symlink(root / "data" / "set", root / "link");
  v1::JobSpec s = Valid();
  s.set_dataset("idx:" + (root / "data" / ".." / "link").string());
  s.set_model("torchscript:" + (root / "data" / "." / "m.pt").string());
  ASSERT_TRUE(ResolveUserPaths(s, {root.string()}).ok());
  EXPECT_EQ(s.dataset(), "idx:" + (root / "data" / "set").string());
  EXPECT_EQ(s.model(), "torchscript:" + (root / "data" / "m.pt").string());
  s.set_dataset("csv:/etc/passwd");
  EXPECT_EQ(ResolveUserPaths(s, {root.string()}).code(), absl::StatusCode::kInvalidArgument);
  fs::remove_all(root);
}

}  // namespace
TEST(JobSpecTest, Fp16WithALocalSgdWarmUpIsKeptAndTheTargetRateIsOneFormula) {
  v1::JobSpec s = Valid();
  s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD);
  s.mutable_sync()->set_period(4);
  s.mutable_sync()->set_warmup_steps(10);  // its allreduces compress
  s.mutable_sync()->set_fp16_compression(true);
  EXPECT_TRUE(NormalizeAndValidateSpec(s).ok());
  EXPECT_DOUBLE_EQ(TargetLearningRate(0.05, true, 512), 0.1);   // Goyal et al.: x 512/256
  EXPECT_DOUBLE_EQ(TargetLearningRate(0.05, false, 512), 0.05);
  EXPECT_DOUBLE_EQ(TargetLearningRate(0.1, true, 128), 0.05);
}

}  // namespace joule
