#include "worker/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/in_process_kv.h"
#include "tests/testing/next_field_data.h"
#include "tests/testing/temp_cleanup.h"
#include "worker/comm/connect.h"

namespace joule::worker {
namespace {

const auto* const kCleanup =
    ::testing::AddGlobalTestEnvironment(new joule::testing::TempCleanup("joule_bad_"));

v1::Assignment MakeAssignment(int rank, int world, const std::string& dataset) {
  v1::Assignment a;
  a.set_job_id(1);
  a.set_attempt(1);
  a.set_rank(rank);
  a.set_world_size(world);
  a.set_rendezvous_prefix("job/1/attempt/1");
  v1::JobSpec* s = a.mutable_spec();
  s->set_model("mlp");
  s->set_dataset(dataset);
  s->set_workers(world);
  s->set_global_batch_size(64);
  s->set_local_batch_size(64 / world);
  s->set_epochs(2);
  s->mutable_optimizer()->set_lr(0.05);
  s->mutable_optimizer()->set_momentum(0.9);
  s->add_hidden_sizes(128);
  s->set_max_train_samples(4096);
  s->set_max_test_samples(1000);
  s->set_intra_op_threads(1);
  s->set_seed(3);
  return a;
}

// How TrainRanksWith runs the ranks beyond the spec.
struct RankSetup {
  // Edits rank r's spec (after the dataset is set); may be empty.
  std::function<void(int rank, v1::JobSpec&)> edit;
  Transport transport = Transport::kGloo;
  TrainerOptions options;
  // Whether hooks.allgather is set (fingerprints compared through the store, as the agent does).
  bool allgather = true;
  // hooks.stop_requested of rank r, given the steps it has finished; may be empty.
  std::function<bool(int rank, int64_t steps)> stop_requested;
};

std::vector<v1::RankResult> TrainRanksWith(int world, const std::string& dataset,
                                           const RankSetup& setup,
                                           std::function<bool()> cancelled = nullptr) {
  server::RendezvousKv kv;
  kv.OpenScope("job/1/attempt/1");
  std::vector<v1::RankResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      testing::InProcessKv client(kv, "job/1/attempt/1");
      TrainHooks hooks;
      hooks.connect = [&]() -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
        ConnectOptions o;
        o.transport = setup.transport;
        o.gloo.timeout = std::chrono::seconds(30);
        auto pg = ConnectProcessGroup(r, world, client, o);
        if (!pg.ok()) return pg.status();
        return std::shared_ptr<ProcessGroup>(*std::move(pg));
      };
      if (setup.allgather) {
        hooks.allgather = [&](const std::string& v) {
          return KvAllgather(client, "allgather", r, world, v, std::chrono::seconds(30));
        };
      }
      hooks.cancelled = cancelled;
      auto steps = std::make_shared<int64_t>(0);
      hooks.on_step = [steps](int64_t, double, double) { ++*steps; };
      if (setup.stop_requested) {
        hooks.stop_requested = [&setup, r, steps] { return setup.stop_requested(r, *steps); };
      }
      hooks.energy_joules = [steps] { return 0.5 * static_cast<double>(*steps); };
      v1::Assignment a = MakeAssignment(r, world, dataset);
      if (setup.edit) setup.edit(r, *a.mutable_spec());
      results[r] = RunTraining(a, setup.options, hooks);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::vector<v1::RankResult> TrainRanks(int world, const std::string& dataset,
                                       std::function<bool()> cancelled = nullptr,
                                       std::function<void(v1::JobSpec&)> edit = nullptr,
                                       Transport transport = Transport::kGloo,
                                       TrainerOptions options = TrainerOptions{}) {
  RankSetup setup;
  if (edit) setup.edit = [edit](int, v1::JobSpec& s) { edit(s); };
  setup.transport = transport;
  setup.options = std::move(options);
  return TrainRanksWith(world, dataset, setup, std::move(cancelled));
}

// A fresh directory under the temp directory (removed by the caller).
std::filesystem::path TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("joule-trainer-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

int CountCheckpoints(const std::filesystem::path& root) {
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.path().extension() == ".jck") ++n;
  }
  return n;
}

TEST(TrainerTest, TwoRanksLearnAndEndWithIdenticalParameters) {
  std::vector<v1::RankResult> r = TrainRanks(2, "fashion-mnist");
  for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash());
  EXPECT_FALSE(r[0].parameter_hash().empty());
  EXPECT_GT(r[0].test_accuracy(), 0.65);  // 10 classes: chance is 0.10
  EXPECT_DOUBLE_EQ(r[0].test_accuracy(), r[1].test_accuracy());
  EXPECT_EQ(r[0].steps(), 2 * (4096 / 64));
  EXPECT_EQ(r[0].samples(), 2 * (4096 / 64) * 32);
}

TEST(TrainerTest, SharedMemoryAndGlooGiveTheSameTrajectory) {
  // With two ranks both transports compute a + b (addition commutes exactly) and halve
  // it, so the runs agree to the bit; small buckets exercise several overlapped
  // allreduces per step.
  auto small_buckets = [](v1::JobSpec& s) { s.mutable_sync()->set_bucket_bytes(64 << 10); };
  std::vector<v1::RankResult> shm =
      TrainRanks(2, "fashion-mnist", nullptr, small_buckets, Transport::kShm);
  std::vector<v1::RankResult> gloo =
      TrainRanks(2, "fashion-mnist", nullptr, small_buckets, Transport::kGloo);
  std::vector<v1::RankResult> one_bucket = TrainRanks(2, "fashion-mnist");
  for (const auto* r : {&shm, &gloo, &one_bucket}) {
    ASSERT_TRUE((*r)[0].ok() && (*r)[1].ok()) << (*r)[0].error() << (*r)[1].error();
  }
  EXPECT_EQ(shm[0].parameter_hash(), shm[1].parameter_hash());
  EXPECT_EQ(shm[0].parameter_hash(), gloo[0].parameter_hash());
  // Bucketing changes nothing but when the sums happen.
  EXPECT_EQ(gloo[0].parameter_hash(), one_bucket[0].parameter_hash());
}

TEST(TrainerTest, Fp16CompressionLearnsAndKeepsRanksEqual) {
  auto fp16 = [](v1::JobSpec& s) { s.mutable_sync()->set_fp16_compression(true); };
  for (Transport t : {Transport::kShm, Transport::kGloo}) {
    std::vector<v1::RankResult> r = TrainRanks(2, "fashion-mnist", nullptr, fp16, t);
    for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
    EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash()) << TransportName(t);
    EXPECT_GT(r[0].test_accuracy(), 0.65) << TransportName(t);
  }
}

TEST(TrainerTest, DataParallelMatchesOneRankOnTheSameGlobalBatch) {
  // Averaging gradients of two half-batches equals the gradient of the whole batch, so
  // 2 ranks x 32 and 1 rank x 64 follow the same trajectory up to float rounding.
  std::vector<v1::RankResult> two = TrainRanks(2, "fashion-mnist");
  std::vector<v1::RankResult> one = TrainRanks(1, "fashion-mnist");
  ASSERT_TRUE(two[0].ok() && one[0].ok());
  EXPECT_NEAR(two[0].test_accuracy(), one[0].test_accuracy(), 0.02);
}

TEST(TrainerTest, LocalSgdEndsWithEqualParametersAndLearns) {
  auto local = [](v1::JobSpec& s) {
    s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD);
    s.mutable_sync()->set_period(4);
    s.mutable_sync()->set_warmup_steps(8);
    s.mutable_sync()->set_average_momentum(true);
  };
  std::vector<v1::RankResult> r = TrainRanks(2, "fashion-mnist", nullptr, local);
  for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash());
  EXPECT_GT(r[0].test_accuracy(), 0.65);
  // Not the allreduce trajectory: the ranks stepped on their own between averagings.
  std::vector<v1::RankResult> sync = TrainRanks(2, "fashion-mnist");
  EXPECT_NE(r[0].parameter_hash(), sync[0].parameter_hash());
}

TEST(TrainerTest, LocalSgdCheckpointsDoNotChangeTheTrajectory) {
  // Before, every step checkpoint averaged the ranks' parameters, so the result depended
  // on the checkpoint interval. Intervals that fall between averagings (period 4, warm-up
  // 6), with and without momentum averaging, on both transports.
  for (bool average_momentum : {false, true}) {
    for (Transport t : {Transport::kGloo, Transport::kShm}) {
      auto local = [&](v1::JobSpec& s) {
        s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_LOCAL_SGD);
        s.mutable_sync()->set_period(4);
        s.mutable_sync()->set_warmup_steps(6);
        s.mutable_sync()->set_average_momentum(average_momentum);
        s.set_epochs(1);
      };
      // The trajectory without checkpoints, once per setting.
      std::vector<v1::RankResult> b = TrainRanks(2, "fashion-mnist", nullptr, local, t);
      ASSERT_TRUE(b[0].ok() && b[1].ok()) << b[0].error() << b[1].error();
      for (int every : {5, 7}) {
        const std::filesystem::path dir = TempDir("local-sgd");
        TrainerOptions with_checkpoints;
        with_checkpoints.checkpoint_root = dir.string();
        auto checkpointed = [&](v1::JobSpec& s) {
          local(s);
          s.set_checkpoint_every_steps(every);
          s.set_keep_checkpoints(100);
        };
        std::vector<v1::RankResult> a =
            TrainRanks(2, "fashion-mnist", nullptr, checkpointed, t, with_checkpoints);
        const std::string what = absl::StrCat("average_momentum ", average_momentum, " every ",
                                              every, " over ", TransportName(t));
        ASSERT_TRUE(a[0].ok() && a[1].ok()) << what << a[0].error() << a[1].error();
        EXPECT_GT(CountCheckpoints(dir), 2) << what;
        std::filesystem::remove_all(dir);
        EXPECT_EQ(a[0].parameter_hash(), a[1].parameter_hash()) << what;
        EXPECT_EQ(a[0].parameter_hash(), b[0].parameter_hash()) << what;
        EXPECT_DOUBLE_EQ(a[0].test_accuracy(), b[0].test_accuracy()) << what;
      }
    }
  }
}

// A two-rank run stopped as setup.stop_requested asks, the run that resumes it from its
// checkpoint, and the same job uninterrupted (setup's edit alone: no stop, no checkpoints).
struct StopResumeRuns {
  std::vector<v1::RankResult> stopped, resumed, uninterrupted;
};
StopResumeRuns StopResumeAndRunThrough(RankSetup setup) {
  StopResumeRuns runs;
  runs.stopped = TrainRanksWith(2, "fashion-mnist", setup);
  setup.stop_requested = nullptr;
  runs.resumed = TrainRanksWith(2, "fashion-mnist", setup);
  RankSetup plain;
  plain.edit = setup.edit;
  runs.uninterrupted = TrainRanksWith(2, "fashion-mnist", plain);
  return runs;
}

TEST(TrainerTest, ResumingFromACheckpointContinuesTheTrajectory) {
  // The second run finds the first's newest checkpoint (mid-epoch, with momentum), takes
  // the resume point broadcast from rank 0, and ends where the uninterrupted run ended.
  for (Transport t : {Transport::kShm, Transport::kGloo}) {
    const std::filesystem::path dir = TempDir("resume");
    TrainerOptions with_checkpoints;
    with_checkpoints.checkpoint_root = dir.string();
    auto checkpointed = [](v1::JobSpec& s) {
      s.set_checkpoint_every_steps(10);
      s.set_keep_checkpoints(3);
    };
    std::vector<v1::RankResult> first =
        TrainRanks(2, "fashion-mnist", nullptr, checkpointed, t, with_checkpoints);
    std::vector<v1::RankResult> resumed =
        TrainRanks(2, "fashion-mnist", nullptr, checkpointed, t, with_checkpoints);
    std::filesystem::remove_all(dir);
    for (const auto* r : {&first, &resumed}) {
      ASSERT_TRUE((*r)[0].ok() && (*r)[1].ok()) << (*r)[0].error() << (*r)[1].error();
    }
    const std::string what(TransportName(t));
    for (const auto& r : resumed) {
      EXPECT_EQ(r.resumed_from_step(), 120) << what;  // 2 epochs of 64 steps: the last multiple of 10
      EXPECT_EQ(r.steps(), 128) << what;
      EXPECT_EQ(r.samples(), 8 * 32) << what;
      EXPECT_EQ(r.parameter_hash(), first[0].parameter_hash()) << what;
      EXPECT_DOUBLE_EQ(r.test_accuracy(), first[0].test_accuracy()) << what;
    }
    EXPECT_EQ(first[0].resumed_from_step(), 0) << what;
  }
}

TEST(TrainerTest, TestSplitsSmallerThanTheWorldEvaluateOnEveryRank) {
  // Before, ranks past the last test example crashed in torch::arange.
  for (int test_samples : {1, 2}) {
    auto tiny_test = [&](v1::JobSpec& s) {
      s.set_global_batch_size(63);
      s.set_local_batch_size(21);
      s.set_max_test_samples(test_samples);
      s.set_max_train_samples(630);
      s.set_epochs(1);
    };
    std::vector<v1::RankResult> r = TrainRanks(3, "fashion-mnist", nullptr, tiny_test);
    for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << test_samples << ": " << rr.error();
    for (const auto& rr : r) {
      EXPECT_EQ(rr.parameter_hash(), r[0].parameter_hash());
      EXPECT_DOUBLE_EQ(rr.test_accuracy(), r[0].test_accuracy());
    }
    // A fraction of 1 or 2 examples.
    const double a = r[0].test_accuracy() * test_samples;
    EXPECT_DOUBLE_EQ(a, std::round(a)) << r[0].test_accuracy();
    EXPECT_GT(r[0].test_loss(), 0.0);
  }
}

TEST(TrainerTest, BatchesThatDoNotTileAreAClearErrorOnEveryRank) {
  struct Case {
    const char* name;
    int gbs, lbs, accumulation, train;
    const char* expect;
  };
  for (const Case& c : {
           Case{"fewer examples than a global batch", 63, 21, 1, 40, "fewer than one global batch"},
           Case{"global batch not world x local", 64, 21, 1, 630, "is not workers 3"},
           Case{"global batch not world x local x accumulation", 63, 21, 2, 630,
                "x accumulation_steps 2"},
           Case{"no local batch", 63, 0, 1, 630, "local_batch_size 0"},
       }) {
    auto edit = [&](v1::JobSpec& s) {
      s.set_global_batch_size(c.gbs);
      s.set_local_batch_size(c.lbs);
      s.set_accumulation_steps(c.accumulation);
      s.set_max_train_samples(c.train);
      s.set_epochs(1);
    };
    std::vector<v1::RankResult> r = TrainRanks(3, "fashion-mnist", nullptr, edit);
    for (const auto& rr : r) {
      EXPECT_FALSE(rr.ok()) << c.name;
      EXPECT_EQ(rr.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << c.name;
      EXPECT_NE(rr.error().find(c.expect), std::string::npos) << c.name << ": " << rr.error();
    }
  }
}

// Saves a TorchScript logistic regression over 28x28 images with a float buffer "scale"
// of `buffer_size` elements (it does not change the output).
void SaveScriptWithBuffer(const std::string& path, int64_t buffer_size) {
  torch::jit::Module m("Net");
  m.register_parameter("weight", torch::zeros({10, 784}), false);
  m.register_parameter("bias", torch::zeros({10}), false);
  m.register_buffer("scale", torch::ones({buffer_size}));
  m.define(R"(
def forward(self, x):
    return torch.matmul(x.flatten(1), self.weight.t()) + self.bias + self.scale.sum() * 0.0
)");
  m.save(path);
}

TEST(TrainerTest, ModelsWhoseBuffersDifferBetweenRanksNeverTrain) {
  // Before, the fingerprint held parameters only: over shared memory the job SUCCEEDED
  // with different hashes per rank, over Gloo the worker aborted.
  const std::filesystem::path dir = TempDir("buffers");
  const std::string four = (dir / "four.pt").string(), five = (dir / "five.pt").string();
  SaveScriptWithBuffer(four, 4);
  SaveScriptWithBuffer(five, 5);
  RankSetup setup;
  setup.edit = [&](int rank, v1::JobSpec& s) {
    s.set_model("torchscript:" + (rank == 0 ? four : five));
    s.clear_hidden_sizes();
    s.set_epochs(1);
  };
  // With the agent's fingerprint exchange: refused before training, naming the buffer.
  std::vector<v1::RankResult> r = TrainRanksWith(2, "fashion-mnist", setup);
  for (const auto& rr : r) {
    EXPECT_FALSE(rr.ok());
    EXPECT_EQ(rr.error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  }
  EXPECT_NE(r[1].error().find("rank 1 differs from rank 0: buffer scale:5:Float where rank 0 "
                              "has buffer scale:4:Float"),
            std::string::npos)
      << r[1].error();
  // Without it, the transports refuse the first collective whose lengths differ.
  setup.allgather = false;
  for (Transport t : {Transport::kGloo, Transport::kShm}) {
    setup.transport = t;
    r = TrainRanksWith(2, "fashion-mnist", setup);
    for (const auto& rr : r) {
      EXPECT_FALSE(rr.ok()) << TransportName(t);
      EXPECT_EQ(rr.error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition))
          << TransportName(t) << ": " << rr.error();
      EXPECT_NE(rr.error().find("different collectives"), std::string::npos) << rr.error();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(TrainerTest, GradientAccumulationMatchesTheWholeBatch) {
  // Two micro-batches of 32 with losses halved give the gradient of one batch of 64.
  auto accumulate = [](v1::JobSpec& s) {
    s.set_accumulation_steps(2);
    s.set_local_batch_size(32);
  };
  std::vector<v1::RankResult> micro = TrainRanks(1, "fashion-mnist", nullptr, accumulate);
  std::vector<v1::RankResult> whole = TrainRanks(1, "fashion-mnist");
  ASSERT_TRUE(micro[0].ok() && whole[0].ok()) << micro[0].error();
  EXPECT_EQ(micro[0].steps(), whole[0].steps());
  EXPECT_EQ(micro[0].samples(), whole[0].samples());
  EXPECT_NEAR(micro[0].test_accuracy(), whole[0].test_accuracy(), 0.01);
  EXPECT_NEAR(micro[0].test_loss(), whole[0].test_loss(), 0.01);
}

TEST(TrainerTest, SyntheticDataTrainsOnEveryRank) {
  auto synthetic = [](v1::JobSpec& s) {
    s.set_dataset("synthetic:1x8x8:4:1024");
    s.set_model("cnn");
    s.clear_hidden_sizes();
    s.set_epochs(1);
  };
  std::vector<v1::RankResult> r = TrainRanks(2, "", nullptr, synthetic);
  for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash());
  EXPECT_EQ(r[0].steps(), 1024 / 64);
}

TEST(TrainerTest, ResNetRanksEndWithEqualParametersAndStatistics) {
  // Several buckets (11 M parameters: a 1 MiB first bucket, then 25 MiB ones) and
  // BatchNorm statistics averaged before evaluation: the hash covers both.
  auto resnet = [](v1::JobSpec& s) {
    s.set_dataset("synthetic:3x16x16:4:256");
    s.set_model("resnet18");
    s.clear_hidden_sizes();
    s.set_epochs(1);
  };
  std::vector<v1::RankResult> r = TrainRanks(2, "", nullptr, resnet, Transport::kShm);
  for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash());
  EXPECT_EQ(r[0].steps(), 256 / 64);
}

TEST(TrainerTest, TorchScriptModelsTrainOnEveryRank) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("joule-ts-trainer-" + std::to_string(getpid()) + ".pt");
  const std::string cmd =
      "/usr/bin/python3 -c 'import torch; torch.jit.script(torch.nn.Sequential("
      "torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))"
      ".save(\"" + path.string() + "\")' 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "python3-torch is not installed";
  auto scripted = [&](v1::JobSpec& s) {
    s.set_model("torchscript:" + path.string());
    s.clear_hidden_sizes();
  };
  std::vector<v1::RankResult> r = TrainRanks(2, "fashion-mnist", nullptr, scripted);
  std::filesystem::remove(path);
  for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash());
  EXPECT_GT(r[0].test_accuracy(), 0.65);
}

TEST(TrainerTest, CsvDataTrains) {
  // Two Gaussian blobs per class along a diagonal: linearly separable.
  const auto path = std::filesystem::temp_directory_path() /
                    ("joule-trainer-" + std::to_string(getpid()) + ".csv");
  {
    std::ofstream out(path);
    out << "a,b,c,label\n";
    std::mt19937 rng(1);
    std::normal_distribution<float> noise(0, 0.3f);
    for (int i = 0; i < 2000; ++i) {
      const int label = i % 2;
      const float center = label ? 1.0f : -1.0f;
      out << center + noise(rng) << "," << center + noise(rng) << "," << noise(rng) << ","
          << label << "\n";
    }
  }
  auto csv = [&](v1::JobSpec& s) {
    s.set_dataset("csv:" + path.string());
    s.set_model("logreg");
    s.clear_hidden_sizes();
  };
  std::vector<v1::RankResult> r = TrainRanks(2, "", nullptr, csv);
  std::filesystem::remove(path);
  for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash());
  EXPECT_GT(r[0].test_accuracy(), 0.95);
  EXPECT_EQ(r[0].steps(), 2 * (1800 / 64));  // 1800 training rows, 200 test rows
}

TEST(TrainerTest, AWorkerWithAllowedRootsRefusesFilesOutsideThem) {
  TrainerOptions options;
  options.allowed_roots = {"/usr/share/datasets"};
  auto outside = [](v1::JobSpec& s) { s.set_dataset("csv:/etc/passwd"); };
  std::vector<v1::RankResult> r =
      TrainRanks(1, "", nullptr, outside, Transport::kGloo, options);
  EXPECT_FALSE(r[0].ok());
  EXPECT_EQ(r[0].error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(r[0].error().find("outside the allowed data roots"), std::string::npos) << r[0].error();
}

TEST(TrainerTest, CorruptDataFailsWithTheFileName) {
  auto dir = std::filesystem::temp_directory_path() / ("joule_bad_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::filesystem::copy_file("/usr/share/datasets/fashion-mnist/" + std::string(f) + ".gz",
                               dir / (std::string(f) + ".gz"),
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::filesystem::resize_file(dir / "train-images-idx3-ubyte.gz", 100000);
  std::vector<v1::RankResult> r = TrainRanks(1, "idx:" + dir.string());
  EXPECT_FALSE(r[0].ok());
  EXPECT_NE(r[0].error().find("train-images-idx3-ubyte.gz"), std::string::npos) << r[0].error();
}

TEST(TrainerTest, AGracefulStopIsAgreedCheckpointedAndResumable) {
  // Rank 1 alone is asked to stop (the coordinator's message reaches the ranks at different
  // times); the ranks agree at the next multiple of kStopCheckInterval, rank 0 writes a
  // checkpoint there, and a later attempt resumes from it onto the uninterrupted trajectory.
  const std::filesystem::path dir = TempDir("graceful-stop");
  RankSetup setup;
  setup.options.checkpoint_root = dir.string();
  setup.edit = [](int, v1::JobSpec& s) { s.set_energy_budget_joules(1000); };
  setup.stop_requested = [](int rank, int64_t steps) { return rank == 1 && steps >= 20; };
  std::vector<v1::RankResult> stopped = TrainRanksWith(2, "fashion-mnist", setup);
  const int64_t at = (20 / kStopCheckInterval + 1) * kStopCheckInterval;  // 24
  for (const v1::RankResult& r : stopped) {
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE(r.cancelled()) << r.error();
    EXPECT_EQ(r.error_code(), static_cast<int>(absl::StatusCode::kCancelled));
    EXPECT_NE(r.error().find(absl::StrCat("stopped at step ", at)), std::string::npos)
        << r.error();
    EXPECT_EQ(r.steps(), at);              // the partial figures are kept
    EXPECT_EQ(r.samples(), at * 32);
    EXPECT_EQ(r.history_size(), 0);        // no epoch ended
  }
  EXPECT_EQ(CountCheckpoints(dir), 1);

  setup.stop_requested = nullptr;
  std::vector<v1::RankResult> resumed = TrainRanksWith(2, "fashion-mnist", setup);
  RankSetup plain;
  plain.edit = setup.edit;
  std::vector<v1::RankResult> uninterrupted = TrainRanksWith(2, "fashion-mnist", plain);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(resumed[0].ok() && resumed[1].ok()) << resumed[0].error() << resumed[1].error();
  ASSERT_TRUE(uninterrupted[0].ok()) << uninterrupted[0].error();
  EXPECT_EQ(resumed[0].resumed_from_step(), at);
  EXPECT_EQ(resumed[0].steps(), 128);
  EXPECT_EQ(resumed[0].parameter_hash(), uninterrupted[0].parameter_hash());
  // Each epoch's end is in the history, the last one with the final accuracy.
  const v1::RankResult& u = uninterrupted[0];
  ASSERT_EQ(u.history_size(), 2);
  EXPECT_EQ(u.history(0).epoch(), 1);
  EXPECT_EQ(u.history(0).step(), 64);
  EXPECT_EQ(u.history(0).samples(), 64 * 64);
  EXPECT_DOUBLE_EQ(u.history(0).joules(), 0.5 * 64);  // hooks.energy_joules at its end
  EXPECT_GT(u.history(0).train_loss(), 0);
  EXPECT_GT(u.history(1).elapsed_seconds(), u.history(0).elapsed_seconds());
  EXPECT_DOUBLE_EQ(u.history(1).test_accuracy(), u.test_accuracy());
  EXPECT_LT(u.history(1).train_loss(), u.history(0).train_loss());
}

TEST(TrainerTest, APlateauScheduleRecordsEachEpochsRateAndResumesWithItsState) {
  // A plateau the loss can never beat (it would have to fall below 1% of its best): from
  // the second evaluation on, each halves the rate. Rank 1 asks to stop in epoch 3; the
  // resumed attempt must continue at the halved rate its checkpoint kept, or it ends
  // elsewhere than the uninterrupted run.
  const std::filesystem::path dir = TempDir("plateau");
  RankSetup setup;
  setup.options.checkpoint_root = dir.string();
  setup.edit = [](int, v1::JobSpec& s) {
    s.set_epochs(4);
    s.set_energy_budget_joules(1000);
    v1::LrScheduleSpec* p = s.mutable_lr_schedule();
    p->set_name("plateau");
    p->set_threshold(0.99);
    p->set_patience(0);
    p->set_factor(0.5);
  };
  setup.stop_requested = [](int rank, int64_t steps) { return rank == 1 && steps >= 150; };
  auto [stopped, resumed, uninterrupted] = StopResumeAndRunThrough(setup);
  ASSERT_TRUE(stopped[0].cancelled()) << stopped[0].error();
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(resumed[0].ok() && resumed[1].ok()) << resumed[0].error() << resumed[1].error();
  ASSERT_TRUE(uninterrupted[0].ok()) << uninterrupted[0].error();
  EXPECT_GT(resumed[0].resumed_from_step(), 128);  // in epoch 3, after two evaluations
  EXPECT_EQ(resumed[0].parameter_hash(), uninterrupted[0].parameter_hash());
  const v1::RankResult& u = uninterrupted[0];
  ASSERT_EQ(u.history_size(), 4);
  const double want[] = {0.05, 0.05, 0.025, 0.0125};
  for (int e = 0; e < 4; ++e) EXPECT_DOUBLE_EQ(u.history(e).lr(), want[e]) << "epoch " << e + 1;
  // The resumed attempt's epochs carry the same rates.
  ASSERT_GE(resumed[0].history_size(), 2);
  EXPECT_DOUBLE_EQ(resumed[0].history(resumed[0].history_size() - 1).lr(), 0.0125);
}

TEST(TrainerTest, EachOptimizerLearnsAndResumesMidRunOntoTheUninterruptedRun) {
  // AdamW (both moments and the bias correction's step count) and LARS (momentum) keep
  // their state in the checkpoint a graceful stop writes: the resumed attempt ends with
  // the uninterrupted run's parameters, bit for bit. Each one learns.
  struct Case {
    const char* name;
    std::function<void(v1::OptimizerSpec&)> set;
  };
  for (const Case& c : {Case{"adamw",
                             [](v1::OptimizerSpec& o) {
                               o.set_name("adamw");
                               o.set_lr(1e-3);
                               o.set_momentum(0);
                               o.set_weight_decay(0.01);
                               o.set_beta1(0.9);
                               o.set_beta2(0.999);
                               o.set_eps(1e-8);
                             }},
                        Case{"lars",
                             [](v1::OptimizerSpec& o) {
                               o.set_name("lars");
                               o.set_lr(1.0);  // x eta 0.001: ~1e-3 of |w| per step
                               o.set_weight_decay(1e-4);
                               o.set_eps(1e-8);
                               o.set_trust_coefficient(0.001);
                             }},
                        Case{"sgd nesterov, decoupled decay", [](v1::OptimizerSpec& o) {
                               o.set_nesterov(true);
                               o.set_weight_decay(1e-3);
                               o.set_decoupled_weight_decay(true);
                             }}}) {
    const std::filesystem::path dir = TempDir("optimizer");
    RankSetup setup;
    setup.options.checkpoint_root = dir.string();
    setup.edit = [&c](int, v1::JobSpec& s) {
      s.set_energy_budget_joules(1000);
      c.set(*s.mutable_optimizer());
    };
    setup.stop_requested = [](int rank, int64_t steps) { return rank == 0 && steps >= 70; };
    auto [stopped, resumed, uninterrupted] = StopResumeAndRunThrough(setup);
    ASSERT_TRUE(stopped[0].cancelled()) << c.name << ": " << stopped[0].error();
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(resumed[0].ok() && resumed[1].ok())
        << c.name << ": " << resumed[0].error() << resumed[1].error();
    ASSERT_TRUE(uninterrupted[0].ok()) << c.name << ": " << uninterrupted[0].error();
    EXPECT_EQ(resumed[0].resumed_from_step(), 72) << c.name;  // in epoch 2
    EXPECT_EQ(resumed[0].parameter_hash(), uninterrupted[0].parameter_hash()) << c.name;
    EXPECT_EQ(resumed[1].parameter_hash(), uninterrupted[0].parameter_hash()) << c.name;
    EXPECT_GT(uninterrupted[0].test_accuracy(), 0.6) << c.name;  // chance: 0.1
  }
}

TEST(TrainerTest, PowerSgdLearnsAndResumesMidRunOntoTheUninterruptedRun) {
  // Its checkpoint keeps every rank's error feedback and the warm-started Q: a graceful
  // stop after the warm-up, resumed, ends with the uninterrupted run's parameters, bit for
  // bit, on both transports; a stop inside the warm-up (no state yet) too. It learns, and
  // not along the allreduce trajectory.
  for (Transport t : {Transport::kGloo, Transport::kShm}) {
    for (int warmup : {10, 100}) {
      const std::string what = absl::StrCat(TransportName(t), " warm-up ", warmup);
      const std::filesystem::path dir = TempDir("powersgd");
      RankSetup setup;
      setup.transport = t;
      setup.options.checkpoint_root = dir.string();
      setup.edit = [warmup](int, v1::JobSpec& s) {
        s.set_energy_budget_joules(1000);
        s.mutable_sync()->set_strategy(v1::SYNC_STRATEGY_POWERSGD);
        s.mutable_sync()->set_powersgd_rank(2);
        s.mutable_sync()->set_warmup_steps(warmup);
      };
      setup.stop_requested = [](int rank, int64_t steps) { return rank == 0 && steps >= 70; };
      auto [stopped, resumed, uninterrupted] = StopResumeAndRunThrough(setup);
      ASSERT_TRUE(stopped[0].cancelled()) << what << ": " << stopped[0].error();
      std::filesystem::remove_all(dir);
      ASSERT_TRUE(resumed[0].ok() && resumed[1].ok())
          << what << ": " << resumed[0].error() << resumed[1].error();
      ASSERT_TRUE(uninterrupted[0].ok()) << what << ": " << uninterrupted[0].error();
      EXPECT_EQ(resumed[0].resumed_from_step(), 72) << what;
      EXPECT_EQ(resumed[0].parameter_hash(), uninterrupted[0].parameter_hash()) << what;
      EXPECT_EQ(resumed[1].parameter_hash(), uninterrupted[0].parameter_hash()) << what;
      EXPECT_GT(uninterrupted[0].test_accuracy(), 0.6) << what;  // chance: 0.1
      if (t == Transport::kGloo && warmup == 10) {
        RankSetup exact;
        exact.edit = [](int, v1::JobSpec& s) { s.set_energy_budget_joules(1000); };
        std::vector<v1::RankResult> allreduce = TrainRanksWith(2, "fashion-mnist", exact);
        ASSERT_TRUE(allreduce[0].ok()) << allreduce[0].error();
        EXPECT_NE(allreduce[0].parameter_hash(), uninterrupted[0].parameter_hash());
      }
    }
  }
}

// An ImageFolder made from Fashion-MNIST by scripts/make-imagefolder.py (JPEG and PNG,
// 32 x 32, tinted), once per test binary; empty when python3-pil is missing.
const std::filesystem::path& FashionImageFolder() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = TempDir("imagefolder");
    const std::string cmd = absl::StrCat("/usr/bin/python3 ", JOULE_SOURCE_DIR,
                                         "/scripts/make-imagefolder.py ", d.string(),
                                         " --train-per-class 64 --val-per-class 20 --side 40"
                                         " >/dev/null 2>&1");
    return std::system(cmd.c_str()) == 0 ? d : std::filesystem::path();
  }();
  return dir;
}

TEST(TrainerTest, AnImageFolderJobLearnsOnTwoRanksAndResumesOntoTheSameCrops) {
  // The paper's pipeline shrunk: RandomResizedCrop(32, scale [0.5, 1]), flips, ImageNet
  // normalisation, decoded on two threads per rank. A graceful stop mid-epoch and a
  // resume must end on the uninterrupted run's parameters: every crop and flip replays.
  if (FashionImageFolder().empty()) GTEST_SKIP() << "python3-pil is not installed";
  const std::filesystem::path ckpt = TempDir("imagefolder-ckpt");
  RankSetup setup;
  setup.options.checkpoint_root = ckpt.string();
  setup.edit = [](int, v1::JobSpec& s) {
    s.set_dataset("imagefolder:" + FashionImageFolder().string());
    s.set_max_train_samples(0);
    s.set_max_test_samples(0);
    s.set_epochs(3);
    s.set_global_batch_size(32);
    s.set_local_batch_size(16);
    s.set_energy_budget_joules(1000);
    s.set_top_k(3);
    s.set_data_threads(2);
    s.mutable_optimizer()->set_lr(0.01);
    v1::AugmentSpec* a = s.mutable_augment();
    a->mutable_random_resized_crop()->set_size(32);
    a->mutable_random_resized_crop()->add_scale(0.5);
    a->mutable_random_resized_crop()->add_scale(1.0);
    a->set_hflip(true);
    a->set_normalize("imagenet");
    a->set_size(32);
    a->set_eval_resize(36);
  };
  setup.stop_requested = [](int rank, int64_t steps) { return rank == 1 && steps >= 25; };
  auto [stopped, resumed, uninterrupted] = StopResumeAndRunThrough(setup);
  ASSERT_TRUE(stopped[0].cancelled()) << stopped[0].error();
  std::filesystem::remove_all(ckpt);
  ASSERT_TRUE(resumed[0].ok() && resumed[1].ok()) << resumed[0].error() << resumed[1].error();
  ASSERT_TRUE(uninterrupted[0].ok()) << uninterrupted[0].error();
  EXPECT_EQ(uninterrupted[0].train_examples(), 640);
  EXPECT_EQ(uninterrupted[0].steps(), 60);  // 3 epochs of 640 / 32
  EXPECT_EQ(resumed[0].resumed_from_step(), (25 / kStopCheckInterval + 1) * kStopCheckInterval);
  EXPECT_EQ(resumed[0].parameter_hash(), uninterrupted[0].parameter_hash());
  EXPECT_EQ(resumed[1].parameter_hash(), uninterrupted[0].parameter_hash());
  // 200 validation images, 10 classes: well above chance (0.1).
  EXPECT_GT(uninterrupted[0].test_accuracy(), 0.4);
  EXPECT_GT(uninterrupted[0].test_top_k_accuracy(), uninterrupted[0].test_accuracy());

  // stage: local: the same run from a copy in the workers' scratch, which is gone after.
  const std::filesystem::path scratch = TempDir("scratch");
  RankSetup staged;
  staged.options.scratch_dir = scratch.string();
  staged.edit = [&](int r, v1::JobSpec& s) {
    setup.edit(r, s);
    s.set_stage("local");
  };
  std::vector<v1::RankResult> from_copy = TrainRanksWith(2, "fashion-mnist", staged);
  ASSERT_TRUE(from_copy[0].ok() && from_copy[1].ok()) << from_copy[0].error();
  EXPECT_EQ(from_copy[0].parameter_hash(), uninterrupted[0].parameter_hash());
  EXPECT_FALSE(std::filesystem::exists(scratch / "joule-stage" / "job-1"));
  std::filesystem::remove_all(scratch);
}

// The ERA5-like fields (tests/testing/next_field_data.h) and a 3x3 convolution in a
// temporary directory, for the regression tests; skipped without python3-torch.
class NextFieldFiles {
 public:
  explicit NextFieldFiles(const std::string& name)
      : dir_(TempDir(name)),
        ready_(testing::WriteNextFieldModel(dir_ / "next.pt") &&
               testing::WriteNextFieldData(dir_ / "era5.h5")) {}
  ~NextFieldFiles() { std::filesystem::remove_all(dir_); }
  bool ready() const { return ready_; }
  // Three epochs of the whole file, global batch 32 on two ranks, with `loss`.
  std::function<void(v1::JobSpec&)> Spec(const std::string& loss) const {
    return [this, loss](v1::JobSpec& s) {
      s.set_dataset("hdf5:" + (dir_ / "era5.h5").string() + ":/field:/next");
      s.set_model("torchscript:" + (dir_ / "next.pt").string());
      s.clear_hidden_sizes();
      s.set_max_train_samples(0);
      s.set_max_test_samples(0);
      s.set_epochs(3);
      s.set_global_batch_size(32);
      s.set_local_batch_size(16);
      s.set_loss(loss);
      if (loss == "lat_weighted_mse") {
        s.add_latitude_range(90);
        s.add_latitude_range(-90);
      }
    };
  }

 private:
  std::filesystem::path dir_;
  bool ready_;
};

TEST(TrainerTest, ATorchScriptRegressionOnHdf5FieldsLearnsOnTwoRanks) {
  // The FourCastNet case shrunk: a TorchScript model from field to next field, MSE, each
  // rank reading only its shard of the file. The test MSE falls epoch after epoch and the
  // ranks end equal.
  NextFieldFiles files("hdf5");
  if (!files.ready()) GTEST_SKIP() << "python3-torch is not installed";
  std::vector<v1::RankResult> r = TrainRanks(2, "unused", nullptr, files.Spec("mse"));
  for (const auto& rr : r) ASSERT_TRUE(rr.ok()) << rr.error();
  EXPECT_EQ(r[0].parameter_hash(), r[1].parameter_hash());
  EXPECT_EQ(r[0].train_examples(), 540);  // 600 rows, the last 60 held out
  EXPECT_EQ(r[0].steps(), 3 * (270 / 16));  // each rank's 270-row shard, 16 a step
  ASSERT_EQ(r[0].history_size(), 3);
  // The target's variance is 0.25 + 0.0625 x 7/8: a model that learned nothing scores
  // about that; this one falls well below it.
  EXPECT_LT(r[0].history(2).test_loss(), r[0].history(0).test_loss());
  EXPECT_LT(r[0].history(2).test_loss(), 0.05);
  EXPECT_LT(r[0].history(1).train_loss(), r[0].history(0).train_loss());
  for (const v1::EpochRecord& h : r[0].history()) {
    EXPECT_NEAR(h.test_rmse(), std::sqrt(h.test_loss()), 1e-9);  // the report's RMSE column
  }
}

TEST(TrainerTest, ALatitudeWeightedRegressionLearnsAndDiffersFromThePlainOne) {
  // The same fields as a [2, 8, 8] grid from 90 to -90 degrees: the weighted MSE both
  // trains and evaluates; the pole rows count for nothing, so the two losses' figures
  // differ from the first epoch on.
  NextFieldFiles files("hdf5-lat");
  if (!files.ready()) GTEST_SKIP() << "python3-torch is not installed";
  std::vector<v1::RankResult> weighted =
      TrainRanks(2, "unused", nullptr, files.Spec("lat_weighted_mse"));
  std::vector<v1::RankResult> plain = TrainRanks(2, "unused", nullptr, files.Spec("mse"));
  for (const auto& rr : weighted) ASSERT_TRUE(rr.ok()) << rr.error();
  ASSERT_TRUE(plain[0].ok()) << plain[0].error();
  EXPECT_EQ(weighted[0].parameter_hash(), weighted[1].parameter_hash());
  ASSERT_EQ(weighted[0].history_size(), 3);
  EXPECT_LT(weighted[0].history(2).test_loss(), weighted[0].history(0).test_loss());
  EXPECT_LT(weighted[0].history(2).test_loss(), 0.05);
  EXPECT_NEAR(weighted[0].history(2).test_rmse(), std::sqrt(weighted[0].history(2).test_loss()),
              1e-9);
  EXPECT_NE(weighted[0].history(0).test_loss(), plain[0].history(0).test_loss());
  // The weights reach training too, not only evaluation: other losses, other parameters.
  EXPECT_NE(weighted[0].history(0).train_loss(), plain[0].history(0).train_loss());
  EXPECT_NE(weighted[0].parameter_hash(), plain[0].parameter_hash());
}

TEST(TrainerTest, TopKAccuracyIsMeasuredEachEpochAndAKPastTheClassesFailsEveryRank) {
  std::vector<v1::RankResult> top5 =
      TrainRanks(2, "fashion-mnist", nullptr, [](v1::JobSpec& s) { s.set_top_k(5); });
  for (const v1::RankResult& r : top5) {
    ASSERT_TRUE(r.ok()) << r.error();
    ASSERT_EQ(r.history_size(), 2);
    for (const v1::EpochRecord& h : r.history()) {
      EXPECT_GE(h.test_top_k_accuracy(), h.test_accuracy());  // the top-1 hits are top-5 hits
      EXPECT_LE(h.test_top_k_accuracy(), 1.0);
    }
    EXPECT_EQ(r.test_top_k_accuracy(), top5[0].test_top_k_accuracy());
  }
  std::vector<v1::RankResult> plain = TrainRanks(1, "fashion-mnist");
  ASSERT_TRUE(plain[0].ok()) << plain[0].error();
  EXPECT_EQ(plain[0].test_top_k_accuracy(), -1);  // not asked for
  EXPECT_EQ(plain[0].history(0).train_accuracy(), -1);
  EXPECT_EQ(plain[0].history(0).test_rmse(), -1);  // a classification has none
  // Fashion-MNIST has 10 classes: both ranks refuse k = 11 before training.
  for (const v1::RankResult& r :
       TrainRanks(2, "fashion-mnist", nullptr, [](v1::JobSpec& s) { s.set_top_k(11); })) {
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.error().find("top_k 11 is more than the 10 classes"), std::string::npos)
        << r.error();
  }
}

TEST(TrainerTest, TheTrainingSplitIsEvaluatedEachEpochWhenAskedAndAllRanksAgree) {
  std::vector<v1::RankResult> both = TrainRanks(2, "fashion-mnist", nullptr, [](v1::JobSpec& s) {
    s.set_evaluate_train(true);
    s.set_top_k(3);
  });
  std::vector<v1::RankResult> one = TrainRanks(1, "fashion-mnist", nullptr, [](v1::JobSpec& s) {
    s.set_evaluate_train(true);
    s.set_top_k(3);
  });
  for (const auto* results : {&both, &one}) {
    for (const v1::RankResult& r : *results) {
      ASSERT_TRUE(r.ok()) << r.error();
      ASSERT_EQ(r.history_size(), 2);
      for (const v1::EpochRecord& h : r.history()) {
        EXPECT_GT(h.train_accuracy(), 0.5);  // it learned: well above chance (0.1)
        EXPECT_LE(h.train_accuracy(), 1.0);
        EXPECT_GT(h.train_eval_loss(), 0);
        EXPECT_GE(h.train_top_k_accuracy(), h.train_accuracy());
        EXPECT_EQ(h.train_accuracy(), (*results)[0].history(h.epoch() - 1).train_accuracy());
      }
    }
  }
}

TEST(TrainerTest, EpochsShorterThanTheStopIntervalAreCheckedAtTheirLastStep) {
  // 5 steps per epoch (320 examples, global batch 64): the stop asked at the first step
  // is agreed at the epoch's last, and the checkpoint there resumes into the evaluation.
  const std::filesystem::path dir = TempDir("graceful-short");
  RankSetup setup;
  setup.options.checkpoint_root = dir.string();
  setup.edit = [](int, v1::JobSpec& s) {
    s.set_energy_budget_joules(1000);
    s.set_max_train_samples(320);
  };
  setup.stop_requested = [](int rank, int64_t steps) { return rank == 0 && steps >= 1; };
  std::vector<v1::RankResult> stopped = TrainRanksWith(2, "fashion-mnist", setup);
  for (const v1::RankResult& r : stopped) {
    EXPECT_TRUE(r.cancelled()) << r.error();
    EXPECT_EQ(r.steps(), 5) << r.error();
  }
  setup.stop_requested = nullptr;
  std::vector<v1::RankResult> resumed = TrainRanksWith(2, "fashion-mnist", setup);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(resumed[0].ok()) << resumed[0].error();
  EXPECT_EQ(resumed[0].resumed_from_step(), 5);
  EXPECT_EQ(resumed[0].steps(), 10);
  ASSERT_EQ(resumed[0].history_size(), 2);
  EXPECT_EQ(resumed[0].history(0).train_loss(), -1);  // no step of epoch 1 ran here
  EXPECT_GT(resumed[0].history(1).train_loss(), 0);
}

TEST(TrainerTest, AJobWithoutABudgetNeverChecksForAStop) {
  // No agreement collective: a stop request alone does nothing (the coordinator then
  // cancels outright).
  RankSetup setup;
  setup.stop_requested = [](int, int64_t) { return true; };
  std::vector<v1::RankResult> r = TrainRanksWith(2, "fashion-mnist", setup);
  EXPECT_TRUE(r[0].ok()) << r[0].error();
  EXPECT_EQ(r[0].steps(), 128);
}

// A ga job of `model`: logreg, or an mlp with one hidden layer of 16.
void GaJob(v1::JobSpec& s, const std::string& model = "logreg") {
  s.set_model(model);
  s.clear_hidden_sizes();
  if (model == "mlp") s.add_hidden_sizes(16);
  s.set_algorithm("ga");
  v1::GaSpec* ga = s.mutable_ga();
  ga->set_population(32);
  ga->set_generations(30);
  ga->set_mutation_rate(0.05);
  ga->set_mutation_scale(0.05);
  ga->set_crossover_rate(0.5);
  ga->set_elite(2);
  ga->set_migration_interval(5);
  ga->set_migration_size(2);
  ga->set_fitness_batch(256);
}

// Durations come from the clock the trainer is given (TrainerOptions::clock), for SGD and
// the GA alike: with a clock that never moves, every time the result reports is zero,
// while the run itself is the same.
TEST(TrainerTest, TimesComeFromTheClockTheTrainerIsGiven) {
  joule::testing::FakeClock stopped;
  for (const std::string algorithm : {"sgd", "ga"}) {
    SCOPED_TRACE(algorithm);
    TrainerOptions options;
    options.clock = &stopped;
    std::vector<v1::RankResult> r = TrainRanks(
        2, "fashion-mnist", nullptr,
        [&](v1::JobSpec& s) {
          s.set_epochs(1);
          if (algorithm == "ga") GaJob(s);
        },
        Transport::kGloo, options);
    for (const v1::RankResult& rr : r) {
      ASSERT_TRUE(rr.ok()) << rr.error();
      EXPECT_GT(rr.steps(), 0);
      EXPECT_EQ(rr.wall_seconds(), 0);
      EXPECT_EQ(rr.train_seconds(), 0);
      ASSERT_GT(rr.history_size(), 0);
      EXPECT_EQ(rr.history(0).elapsed_seconds(), 0);
    }
  }
}

TEST(TrainerTest, AGeneticAlgorithmResumesMidRunOntoTheUninterruptedRun) {
  // Checkpoints every 10 generations hold both islands (rank 0 writes what it gathered;
  // an mlp genome: two layers' tensors each); a second attempt resumes at the newest
  // islands (20, not the kept model written after them) and ends where the first ended.
  const std::filesystem::path dir = TempDir("ga-resume");
  RankSetup setup;
  setup.options.checkpoint_root = dir.string();
  setup.edit = [](int, v1::JobSpec& s) {
    GaJob(s, "mlp");
    s.set_checkpoint_every_steps(10);
    s.set_keep_checkpoints(3);
    s.set_keep_model(true);
  };
  std::vector<v1::RankResult> first = TrainRanksWith(2, "fashion-mnist", setup);
  EXPECT_EQ(CountCheckpoints(dir), 3);  // before generations 10 and 20, and the kept model
  std::vector<v1::RankResult> resumed = TrainRanksWith(2, "fashion-mnist", setup);
  // Another population is another job shape: its run does not take these islands.
  RankSetup other = setup;
  other.edit = [](int, v1::JobSpec& s) {
    GaJob(s, "mlp");
    s.mutable_ga()->set_population(16);
    s.set_checkpoint_every_steps(10);
  };
  std::vector<v1::RankResult> unrelated = TrainRanksWith(2, "fashion-mnist", other);
  std::filesystem::remove_all(dir);
  for (const auto* r : {&first, &resumed, &unrelated}) {
    ASSERT_TRUE((*r)[0].ok() && (*r)[1].ok()) << (*r)[0].error() << (*r)[1].error();
  }
  EXPECT_EQ(first[0].resumed_from_step(), 0);
  for (const v1::RankResult& r : resumed) {
    EXPECT_EQ(r.resumed_from_step(), 20);
    EXPECT_EQ(r.steps(), 30);
    EXPECT_EQ(r.samples(), 10 * 256);  // drawn in this attempt
    EXPECT_EQ(r.parameter_hash(), first[0].parameter_hash());
    EXPECT_DOUBLE_EQ(r.test_accuracy(), first[0].test_accuracy());
  }
  EXPECT_EQ(unrelated[0].resumed_from_step(), 0);
}

TEST(TrainerTest, AGeneticAlgorithmJobLearnsOnEveryRankAndIsReproducible) {
  for (const std::string model : {"logreg", "mlp"}) {
    RankSetup setup;
    setup.edit = [model](int, v1::JobSpec& s) { GaJob(s, model); };
    std::vector<v1::RankResult> first = TrainRanksWith(2, "fashion-mnist", setup);
    std::vector<v1::RankResult> again = TrainRanksWith(2, "fashion-mnist", setup);
    for (const auto* r : {&first, &again}) {
      ASSERT_TRUE((*r)[0].ok() && (*r)[1].ok()) << model << (*r)[0].error() << (*r)[1].error();
      EXPECT_EQ((*r)[0].parameter_hash(), (*r)[1].parameter_hash()) << model;  // the best island's
    }
    EXPECT_GT(first[0].test_accuracy(), 0.3) << model << ": chance is 0.1";
    EXPECT_EQ(first[0].parameter_hash(), again[0].parameter_hash()) << model << ": same seed, same run";
    EXPECT_EQ(first[0].steps(), 30);
    EXPECT_EQ(first[0].samples(), 30 * 256);  // training examples drawn
    EXPECT_GT(first[0].test_loss(), 0);
    ASSERT_EQ(first[0].history_size(), 1);
  }
}

TEST(TrainerTest, ABudgetedGaStopsAtAnAgreedGenerationAndResumesOntoTheSameRun) {
  // Rank 1 alone is asked to stop after 20 generations; the ranks agree at the next
  // multiple of kStopCheckInterval, rank 0 writes the islands there, and a later attempt
  // resumes from it onto the uninterrupted run.
  const std::filesystem::path dir = TempDir("ga-budget");
  RankSetup setup;
  setup.options.checkpoint_root = dir.string();
  setup.edit = [](int, v1::JobSpec& s) {
    GaJob(s);
    s.set_energy_budget_joules(1000);
  };
  setup.stop_requested = [](int rank, int64_t steps) { return rank == 1 && steps >= 20; };
  std::vector<v1::RankResult> stopped = TrainRanksWith(2, "fashion-mnist", setup);
  const int64_t at = (20 / kStopCheckInterval + 1) * kStopCheckInterval;  // 24
  for (const v1::RankResult& r : stopped) {
    EXPECT_TRUE(r.cancelled()) << r.error();
    EXPECT_EQ(r.error_code(), static_cast<int>(absl::StatusCode::kCancelled));
    EXPECT_NE(r.error().find(absl::StrCat("stopped at generation ", at)), std::string::npos)
        << r.error();
    EXPECT_EQ(r.steps(), at);
    EXPECT_EQ(r.samples(), at * 256);
  }
  EXPECT_EQ(CountCheckpoints(dir), 1);
  setup.stop_requested = nullptr;
  std::vector<v1::RankResult> resumed = TrainRanksWith(2, "fashion-mnist", setup);
  RankSetup plain;
  plain.edit = setup.edit;
  std::vector<v1::RankResult> uninterrupted = TrainRanksWith(2, "fashion-mnist", plain);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(resumed[0].ok() && resumed[1].ok()) << resumed[0].error() << resumed[1].error();
  ASSERT_TRUE(uninterrupted[0].ok()) << uninterrupted[0].error();
  EXPECT_EQ(resumed[0].resumed_from_step(), at);
  EXPECT_EQ(resumed[0].steps(), 30);
  EXPECT_EQ(resumed[0].parameter_hash(), uninterrupted[0].parameter_hash());
}

TEST(TrainerTest, AGaIslandTooLargeForAWorkerIsAClearErrorOnEveryRank) {
  // 128 genomes of an mlp with 4096 hidden units (3.26M weights each) per island: over
  // 2^28 floats. Both ranks say so before any collective (no hang), and it is not retried.
  RankSetup setup;
  setup.edit = [](int, v1::JobSpec& s) {
    GaJob(s, "mlp");
    s.set_hidden_sizes(0, 4096);
    s.mutable_ga()->set_population(256);
    s.mutable_ga()->set_fitness_batch(1);
  };
  std::vector<v1::RankResult> r = TrainRanksWith(2, "fashion-mnist", setup);
  for (const v1::RankResult& rank : r) {
    EXPECT_FALSE(rank.ok());
    EXPECT_EQ(rank.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(rank.error().find("an island of 128 genomes of 3256330 weights"), std::string::npos)
        << rank.error();
  }
}

TEST(TrainerTest, CancellationStopsTheAttempt) {
  std::vector<v1::RankResult> r = TrainRanks(1, "fashion-mnist", [] { return true; });
  EXPECT_FALSE(r[0].ok());
  EXPECT_TRUE(r[0].cancelled());
}

}  // namespace
}  // namespace joule::worker
