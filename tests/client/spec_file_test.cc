#include "client/spec_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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

TEST(SpecFileTest, EachSyncStrategyHasAShortName) {
  const std::pair<const char*, v1::SyncStrategy> cases[] = {
      {"allreduce", v1::SYNC_STRATEGY_ALLREDUCE},
      {"local-sgd", v1::SYNC_STRATEGY_LOCAL_SGD},
      {"local_sgd", v1::SYNC_STRATEGY_LOCAL_SGD},
      {"powersgd", v1::SYNC_STRATEGY_POWERSGD},
      {"PowerSGD", v1::SYNC_STRATEGY_POWERSGD},
      {"SYNC_STRATEGY_POWERSGD", v1::SYNC_STRATEGY_POWERSGD}};
  for (const auto& [name, want] : cases) {
    auto spec = ParseSpecText(std::string("model: mlp\nsync: {strategy: ") + name +
                                  ", powersgd_rank: 4, warmup_steps: 10}\n",
                              "job.yaml");
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->sync().strategy(), want) << name;
    EXPECT_EQ(spec->sync().powersgd_rank(), 4) << name;
  }
  EXPECT_FALSE(ParseSpecText("model: mlp\nsync: {strategy: powersgd2}\n", "job.yaml").ok());
}

TEST(SpecFileTest, ParsesJsonWithCamelCase) {
  auto spec = ParseSpecText(R"({"model": "cnn", "globalBatchSize": 64, "workers": 1})", "j.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model(), "cnn");
  EXPECT_EQ(spec->global_batch_size(), 64);
}

TEST(SpecFileTest, AZeroGaRateInAFileIsKeptAsZero) {
  // mutation_rate and crossover_rate have presence: 0 written is 0, absent is the default.
  absl::StatusOr<v1::JobSpec> s = ParseSpecText(
      "model: logreg\nalgorithm: ga\nga: {mutation_rate: 0, population: 8}\n", "ga.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->ga().has_mutation_rate());
  EXPECT_EQ(s->ga().mutation_rate(), 0);
  EXPECT_FALSE(s->ga().has_crossover_rate());
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

// Every error is one line that names the file.
void ExpectOneLineError(const absl::StatusOr<v1::JobSpec>& spec, const std::string& file,
                        const std::vector<std::string>& want) {
  ASSERT_FALSE(spec.ok());
  const std::string message(spec.status().message());
  EXPECT_EQ(message.rfind(file + ": ", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& w : want) {
    EXPECT_NE(message.find(w), std::string::npos) << "want \"" << w << "\" in: " << message;
  }
}

TEST(SpecFileTest, TopLevelsThatAreNotMappingsSayWhatTheyAre) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "is a list"},     {"- model: mlp\n", "is a list"},
      {"mlp", "is a single value"}, {"", "is empty"},
      {"~", "is empty"},           {"# only a comment\n", "is empty"},
      {"&a [*a]", "is a list"}};
  for (const auto& [text, want] : cases) {
    SCOPED_TRACE(text);
    ExpectOneLineError(ParseSpecText(text, "job.yaml"), "job.yaml",
                       {want, "want a mapping of JobSpec fields"});
  }
}

// "Billion laughs": nine levels of nine aliases each name 9^9 (387 million) strings in a few
// hundred bytes. The expansion stops at the cap (a slow or exponential one would time out).
TEST(SpecFileTest, AliasExpansionIsBounded) {
  std::string text = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    const char prev = c - 1;
    text += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 9; ++i) text += std::string(i ? "," : "") + "*" + prev;
    text += "]\n";
  }
  ASSERT_LT(text.size(), 400u);
  ExpectOneLineError(ParseSpecText(text, "laughs.yaml"), "laughs.yaml",
                     {"more than 100000 values once YAML aliases are expanded"});

  // Few nodes but long strings, repeated by aliases: bounded by bytes.
  std::string wide = "a: &a \"" + std::string(100000, 'x') + "\"\nb: [";
  for (int i = 0; i < 100; ++i) wide += std::string(i ? "," : "") + "*a";
  wide += "]\n";
  ExpectOneLineError(ParseSpecText(wide, "wide.yaml"), "wide.yaml",
                     {"bytes of values once YAML aliases are expanded"});

  // Below the caps, aliases work as YAML says.
  auto ok = ParseSpecText("labels: {a: &v same, b: *v}\nmodel: mlp\n", "job.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->labels().at("b"), "same");
}

TEST(SpecFileTest, NestingIsBounded) {
  for (int depth : {40, 1000, 100000}) {
    SCOPED_TRACE(depth);
    const std::string text =
        "model: " + std::string(depth, '[') + std::string(depth, ']') + "\n";
    auto spec = ParseSpecText(text, "deep.yaml");
    ASSERT_FALSE(spec.ok());
    ExpectOneLineError(spec, "deep.yaml", {"nested"});
  }
  // Past yaml-cpp's own depth guard, by every kind of nesting: flow sequences, flow maps,
  // block indentation, unclosed brackets (issue 23: "not YAML: line 2: bad file").
  // (yaml-cpp counts several levels per indented mapping: 1,400 of them, in under 1 MiB,
  // pass its guard.)
  std::string block = "a:\n";
  for (int i = 1; i < 1400; ++i) block += std::string(i, ' ') + "b:\n";
  ExpectOneLineError(ParseSpecText(block, "deep.yaml"), "deep.yaml", {"nested too deeply"});
  for (const std::string& text :
       {"model: " + std::string(3000, '[') + "1" + std::string(3000, ']') + "\n",
        "model: " + [] { std::string s; for (int i = 0; i < 2500; ++i) s += "{b: "; return s; }() +
            "1" + std::string(2500, '}') + "\n",
        "x:\n" + std::string(3000, '[') + "\n"}) {
    ExpectOneLineError(ParseSpecText(text, "deep.yaml"), "deep.yaml",
                       {"nested too deeply (more than 2000 levels"});
  }
  ExpectOneLineError(ParseSpecText("x: &a [*a]\n", "self.yaml"), "self.yaml",
                     {"nested more than 32 levels deep"});
  ExpectOneLineError(ParseSpecText("x: &a {y: *a}\n", "self.yaml"), "self.yaml",
                     {"nested more than 32 levels deep"});
}

// Invalid UTF-8 in any string field: the field, its line and the byte are named.
TEST(SpecFileTest, InvalidUtf8IsNamedByFieldLineAndByte) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"name: \"a\xff" "b\"\n", {"line 1, field name", "byte 1 is 0xFF"}},
      {"model: mlp\nmodel_x: \xc0\xaf\n", {"line 2, field model_x", "byte 0 is 0xC0"}},
      {"dataset: \"csv:/d/\xed\xa0\x80.csv\"\n", {"field dataset", "byte 7 is 0xED"}},
      {"labels:\n  team: \"en\xe2\x82\"\n", {"line 2, field labels.team", "byte 2 is 0xE2"}},
      {"labels: {\"t\xfe\": x}\n", {"line 1, a key in labels", "byte 1 is 0xFE"}},
      {"\"na\xffme\": x\n", {"line 1, a key", "byte 2 is 0xFF"}},
      {"hidden_sizes: [1, \"\xff\"]\n", {"field hidden_sizes[1]", "byte 0 is 0xFF"}},
      {"lr_scaling: \"\xf5\"\n", {"field lr_scaling", "0xF5"}},
  };
  for (const auto& [text, want] : cases) {
    SCOPED_TRACE(::testing::PrintToString(text));
    std::vector<std::string> all = want;
    all.push_back("not valid UTF-8");
    ExpectOneLineError(ParseSpecText(text, "job.yaml"), "job.yaml", all);
  }
}

TEST(SpecFileTest, OtherMalformedValuesAreOneLine) {
  ExpectOneLineError(ParseSpecText("? [a, b]\n: 1\n", "job.yaml"), "job.yaml",
                     {"a key must be a field name"});
  ExpectOneLineError(ParseSpecText("workers: 1e999\n", "job.yaml"), "job.yaml",
                     {"field workers: 1e999 is out of range"});
  ExpectOneLineError(ParseSpecText("model: {a: 1\n", "job.yaml"), "job.yaml",
                     {"not valid YAML or JSON"});
  ExpectOneLineError(ParseSpecText(std::string(kMaxSpecFileBytes + 1, ' '), "big.yaml"),
                     "big.yaml", {"at most 1048576 bytes"});
}

class SpecFileOnDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("joule_spec_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

// Files that are not job files: each refused with one line, without reading more than the
// limit, and without waiting (a FIFO has no writer; /dev/zero never ends).
TEST_F(SpecFileOnDiskTest, RefusesWhatIsNotARegularFileOfBoundedSize) {
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  {
    std::ofstream f(Path("sparse"));
  }
  std::filesystem::resize_file(Path("sparse"), uint64_t{4} << 30);  // 4 GiB of holes
  std::ofstream(Path("over")) << "model: mlp\n" << std::string(kMaxSpecFileBytes, '#');
  std::filesystem::create_directories(Path("dir.yaml"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/dev/zero", "is a character device"},
      {"/dev/null", "is a character device"},
      {Path("fifo"), "is a FIFO"},
      {Path("dir.yaml"), "is a directory"},
      {Path("sparse"), "is 4294967296 bytes; a job file may hold at most 1048576 bytes"},
      {Path("over"), "bytes; a job file may hold at most 1048576 bytes"},
  };
  for (const auto& [path, want] : cases) {
    SCOPED_TRACE(path);
    auto spec = LoadSpecFile(path);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
    ExpectOneLineError(spec, path, {want});
  }
  auto missing = LoadSpecFile(Path("absent.yaml"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  ExpectOneLineError(missing, Path("absent.yaml"), {"no such file"});
}

TEST_F(SpecFileOnDiskTest, ReadsAFileUpToTheLimit) {
  std::string text = "model: mlp\nworkers: 2\n";
  text += std::string(kMaxSpecFileBytes - text.size() - 1, '#') + "\n";  // a long comment
  ASSERT_EQ(text.size(), kMaxSpecFileBytes);
  std::ofstream(Path("job.yaml")) << text;
  auto spec = LoadSpecFile(Path("job.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->workers(), 2);
}

}  // namespace
}  // namespace joule::client
