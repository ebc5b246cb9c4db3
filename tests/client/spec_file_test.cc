#include "client/spec_file.h"

#include <gtest/gtest.h>

namespace joule::client {
namespace {

TEST(SpecFileTest, ParsesYamlWithShortEnums) {
  auto spec = ParseSpecText(R"(
name: fashion
model: mlp
dataset: fashion-mnist
workers: 2
device_kind: cpu
global_batch_size: 128
epochs: 3
hidden_sizes: [256, 128]
optimizer: {lr: 0.05, momentum: 0.9}
sync: {strategy: allreduce}
labels: {team: energy}
)",
                            "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "fashion");
  EXPECT_EQ(spec->workers(), 2);
  EXPECT_EQ(spec->device_kind(), v1::DEVICE_KIND_CPU);
  EXPECT_EQ(spec->global_batch_size(), 128);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
  EXPECT_EQ(spec->hidden_sizes_size(), 2);
  EXPECT_EQ(spec->sync().strategy(), v1::SYNC_STRATEGY_ALLREDUCE);
  EXPECT_EQ(spec->labels().at("team"), "energy");
}

TEST(SpecFileTest, ParsesJsonWithCamelCase) {
  auto spec = ParseSpecText(R"({"model": "cnn", "globalBatchSize": 64, "workers": 1})", "j.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model(), "cnn");
  EXPECT_EQ(spec->global_batch_size(), 64);
}

TEST(SpecFileTest, UnknownFieldsAndBadValuesAreErrorsNamingTheFile) {
  auto typo = ParseSpecText("model: mlp\nworkerz: 2\n", "job.yaml");
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(typo.status().message()).find("job.yaml"), std::string::npos);
  EXPECT_NE(std::string(typo.status().message()).find("workerz"), std::string::npos)
      << typo.status();
  EXPECT_FALSE(ParseSpecText("workers: two\n", "job.yaml").ok());
  EXPECT_FALSE(ParseSpecText("[1, 2]", "job.yaml").ok());
  EXPECT_FALSE(ParseSpecText("model: [unclosed", "job.yaml").ok());
  EXPECT_EQ(LoadSpecFile("/nonexistent/job.yaml").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace joule::client
