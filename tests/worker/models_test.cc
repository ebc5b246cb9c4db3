#include "worker/models/models.h"

#include <gtest/gtest.h>

#include "common/job_spec.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace joule::worker {
namespace {

int64_t Count(Model& m) {
  int64_t n = 0;
  for (const auto& [name, p] : m.Parameters()) n += p.numel();
  return n;
}

bool HasName(const NamedTensors& ts, const std::string& name) {
  for (const auto& [n, t] : ts) {
    if (n == name) return true;
  }
  return false;
}

// The catalogue has two owners that cannot share code: the models (LibTorch, on workers)
// and the closed-form counts the coordinator checks a job's memory with before it runs
// (common/job_spec.cc, EstimateResources). This ties them: every model of the catalogue,
// over the shapes and widths a job can give, built and counted.
TEST(ModelsTest, TheSubmitEstimateCountsEveryModelsParametersExactly) {
  struct Case {
    std::string model;
    std::vector<int> hidden;
    std::string dataset;
    InputShape shape;
  };
  const std::vector<Case> cases = {
      {"logreg", {}, "fashion-mnist", {1, 28, 28, 10}},
      {"logreg", {}, "synthetic:3x32x32:100:10", {3, 32, 32, 100}},
      {"mlp", {}, "fashion-mnist", {1, 28, 28, 10}},
      {"mlp", {64}, "fashion-mnist", {1, 28, 28, 10}},
      {"mlp", {512, 256, 7}, "synthetic:3x16x16:5:10", {3, 16, 16, 5}},
      {"cnn", {}, "fashion-mnist", {1, 28, 28, 10}},
      {"cnn", {}, "synthetic:3x32x32:100:10", {3, 32, 32, 100}},
      {"cnn", {}, "synthetic:2x7x9:3:10", {2, 7, 9, 3}},
      {"resnet18", {}, "fashion-mnist", {1, 28, 28, 10}},
      {"resnet18", {}, "synthetic:3x64x64:1000:10", {3, 64, 64, 1000}},
      {"resnet50", {}, "synthetic:3x64x64:1000:10", {3, 64, 64, 1000}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model + " on " + c.dataset);
    v1::JobSpec spec;
    spec.set_model(c.model);
    spec.set_dataset(c.dataset);
    for (int h : c.hidden) spec.add_hidden_sizes(h);
    absl::StatusOr<ResourceEstimate> estimate = EstimateResources(spec);
    ASSERT_TRUE(estimate.ok()) << estimate.status();
    auto model = BuildModel(c.model, c.hidden, c.shape);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(estimate->parameters, Count(**model));
  }
}

TEST(ModelsTest, ResNetsMatchTorchvisionsParameterCounts) {
  // torchvision's documented sizes for ImageNet (3 channels, 1000 classes).
  InputShape imagenet{3, 224, 224, 1000};
  auto r18 = BuildModel("resnet18", {}, imagenet);
  auto r50 = BuildModel("resnet50", {}, imagenet);
  ASSERT_TRUE(r18.ok() && r50.ok());
  EXPECT_EQ(Count(**r18), 11'689'512);
  EXPECT_EQ(Count(**r50), 25'557'032);
  // torchvision's state_dict names, so weights map one to one.
  NamedTensors p = (*r50)->Parameters();
  for (const char* name : {"conv1.weight", "bn1.weight", "layer1.0.conv3.weight",
                           "layer1.0.downsample.0.weight", "layer4.2.bn3.bias", "fc.weight"}) {
    EXPECT_TRUE(HasName(p, name)) << name;
  }
  NamedTensors b = (*r18)->Buffers();
  EXPECT_TRUE(HasName(b, "bn1.running_mean"));
  EXPECT_TRUE(HasName(b, "layer2.0.downsample.1.running_var"));
  EXPECT_FALSE(HasName(b, "bn1.num_batches_tracked"));  // integer: not averaged
}

TEST(ModelsTest, ResNetsTakeTheDatasetsChannelsSizeAndClasses) {
  for (const char* name : {"resnet18", "resnet50"}) {
    for (InputShape shape : {InputShape{1, 28, 28, 10}, InputShape{3, 8, 8, 7}}) {
      auto m = BuildModel(name, {}, shape);
      ASSERT_TRUE(m.ok()) << m.status();
      torch::Tensor out = (*m)->Forward(torch::rand({2, shape.channels, shape.height, shape.width}));
      EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, shape.classes})) << name;
    }
  }
  // Channels change only the stem: 1 channel has 64*7*7*2 fewer weights than 3.
  auto one = BuildModel("resnet18", {}, InputShape{1, 28, 28, 1000});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(Count(**one), 11'689'512 - 64 * 7 * 7 * 2);
}

TEST(ModelsTest, UnknownNamesAreInvalid) {
  auto m = BuildModel("resnet34", {}, InputShape{});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(m.status().message()).find("resnet34"), std::string::npos);
}

class TorchScriptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("joule-ts-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Scripts `module` (Python source of an nn.Module expression) with Debian's python3-torch.
  std::string Script(const std::string& module) {
    const std::string path = (dir_ / "m.pt").string();
    const std::string cmd = "/usr/bin/python3 -c 'import torch; torch.manual_seed(0); "
                            "torch.jit.script(" + module + ").save(\"" + path + "\")' 2>&1";
    if (std::system(cmd.c_str()) != 0) return "";
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(TorchScriptTest, LoadsAScriptedModuleAndTrainsItsParameters) {
  const std::string path = Script(
      "torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), "
      "torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 10))");
  if (path.empty()) GTEST_SKIP() << "python3 with torch is not installed (Debian: python3-torch)";
  auto m = BuildModel("torchscript:" + path, {}, InputShape{1, 28, 28, 10});
  ASSERT_TRUE(m.ok()) << m.status();
  NamedTensors params = (*m)->Parameters();
  ASSERT_EQ(params.size(), 6u);  // two Linear and one BatchNorm, weight and bias each
  EXPECT_EQ(Count(**m), 784 * 32 + 32 + 32 + 32 + 32 * 10 + 10);
  EXPECT_EQ((*m)->Buffers().size(), 2u);  // running mean and var
  torch::Tensor x = torch::rand({4, 1, 28, 28});
  torch::Tensor loss = torch::nn::functional::cross_entropy((*m)->Forward(x),
                                                            torch::tensor({1, 2, 3, 4}));
  loss.backward();
  for (const auto& [name, p] : params) {
    ASSERT_TRUE(p.grad().defined()) << name;
  }
}

TEST_F(TorchScriptTest, WrongShapesAndBrokenFilesAreClearErrors) {
  const std::string path = Script("torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 5))");
  if (path.empty()) GTEST_SKIP() << "python3 with torch is not installed (Debian: python3-torch)";
  auto wrong_classes = BuildModel("torchscript:" + path, {}, InputShape{1, 28, 28, 10});
  EXPECT_EQ(wrong_classes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(wrong_classes.status().message()).find("[2, 5]"), std::string::npos)
      << wrong_classes.status();
  auto wrong_input = BuildModel("torchscript:" + path, {}, InputShape{3, 8, 8, 5});
  EXPECT_EQ(wrong_input.status().code(), absl::StatusCode::kInvalidArgument);
  // The cause, not just "the operation failed in the TorchScript interpreter".
  EXPECT_NE(std::string(wrong_input.status().message()).find("Error: "), std::string::npos)
      << wrong_input.status();

  const std::string garbage = (dir_ / "garbage.pt").string();
  std::ofstream(garbage) << "not a zip archive";
  EXPECT_EQ(BuildModel("torchscript:" + garbage, {}, InputShape{}).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(BuildModel("torchscript:" + (dir_ / "missing.pt").string(), {}, InputShape{})
                .status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TorchScriptTest, FilesThatDoNotLoadAreOneLineWithoutABacktrace) {
  // Not a zip, a zip that is not TorchScript, empty, truncated, a directory: each a
  // one-line reason naming the file, never a C++ stack frame.
  std::vector<std::pair<std::string, std::string>> files = {
      {"text.pt", "not a zip archive"},
      {"empty.pt", ""},
      {"zip.pt", std::string("PK\x03\x04", 4) + std::string(64, '\0')},
      {"binary.pt", std::string("\x80\x02\xFF\xFE garbage")}};
  for (const auto& [name, bytes] : files) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    auto m = BuildModel("torchscript:" + path, {}, InputShape{1, 28, 28, 10});
    ASSERT_FALSE(m.ok()) << name;
    const std::string message(m.status().message());
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.find("frame #"), std::string::npos) << message;
    EXPECT_EQ(message.find("c10::Error"), std::string::npos) << message;
    EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_LE(message.size(), 800u) << message;
  }
  auto dir = BuildModel("torchscript:" + dir_.string(), {}, InputShape{1, 28, 28, 10});
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kNotFound) << dir.status();
}

TEST(ModelsTest, ErrorLineDropsLibTorchsBacktrace) {
  try {
    TORCH_CHECK(false, "the cause");
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find('\n'), std::string::npos);  // LibTorch's has frames
    EXPECT_EQ(ErrorLine(e), "the cause");
  }
  std::runtime_error traceback(
      "Traceback of TorchScript\n  File \"<string>\", line 3\nRuntimeError: mat1 and mat2");
  EXPECT_EQ(ErrorLine(traceback), "RuntimeError: mat1 and mat2");
}

}  // namespace
}  // namespace joule::worker
