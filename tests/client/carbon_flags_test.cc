// The carbon-aware flags shared by joule submit, sweep run and tune run (issue 31).
#include "client/carbon_flags.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/time/time.h"
#include "common/carbon_intensity.h"
#include "common/job_spec.h"

namespace joule::client {
namespace {

constexpr int64_t kNowMs = 1'800'000'000'000;

// Parses `args` (after the program name) into the flags of a command that has them.
absl::Status Parse(std::vector<std::string> args, v1::JobSpec* spec) {
  CLI::App app;
  CarbonFlags f;
  AddCarbonFlags(&app, &f, "the job");
  args.insert(args.begin(), "joule");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return ApplyCarbonFlags(f, app, spec, absl::FromUnixMillis(kNowMs));
}

TEST(CarbonFlagsTest, DeadlinesAreRfc3339OrFromNowAndBadOnesNameTheirFlag) {
  v1::JobSpec spec;
  ASSERT_TRUE(
      Parse({"--carbon-aware", "--start-before", "+6h", "--expected-duration", "1h30m"}, &spec)
          .ok());
  EXPECT_TRUE(spec.carbon_aware());
  EXPECT_EQ(spec.start_before_unix_ms(), kNowMs + 6 * 3'600'000);
  EXPECT_DOUBLE_EQ(spec.expected_run_seconds(), 5400);
  v1::JobSpec by;
  ASSERT_TRUE(Parse({"--carbon-aware", "--finish-by", "2027-01-02T03:04Z"}, &by).ok());
  EXPECT_EQ(by.finish_by_unix_ms(), *ParseRfc3339Ms("2027-01-02T03:04:00Z"));
  // Flags not given leave the file's fields.
  v1::JobSpec file;
  file.set_carbon_aware(true);
  file.set_start_before_unix_ms(42);
  ASSERT_TRUE(Parse({}, &file).ok());
  EXPECT_EQ(file.start_before_unix_ms(), 42);
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--start-before", "soon"},
                                              {"--finish-by", "+0h"},
                                              {"--finish-by", "+400d"},
                                              {"--start-before", "9999-01-01T00:00:00Z"},
                                              {"--expected-duration", "forever"},
                                              {"--expected-duration", "-1h"}}) {
    v1::JobSpec s;
    absl::Status st = Parse(bad, &s);
    ASSERT_FALSE(st.ok()) << bad[0] << " " << bad[1];
    EXPECT_EQ(st.message().find(bad[0] + ":"), 0u) << st.message();
  }
}

TEST(CarbonFlagsTest, AJobSubmittedAfterTheSharedDeadlineStartsAsAnyJob) {
  v1::JobSpec spec;
  spec.set_carbon_aware(true);
  spec.set_start_before_unix_ms(kNowMs);
  spec.set_expected_run_seconds(60);
  EXPECT_FALSE(DropPassedCarbonDeadline(kNowMs - 1, &spec));
  EXPECT_TRUE(spec.carbon_aware());
  EXPECT_TRUE(DropPassedCarbonDeadline(kNowMs, &spec));
  EXPECT_FALSE(spec.carbon_aware());
  EXPECT_EQ(spec.start_before_unix_ms(), 0);
  EXPECT_EQ(spec.expected_run_seconds(), 0);
  v1::JobSpec plain;
  EXPECT_FALSE(DropPassedCarbonDeadline(kNowMs, &plain));
}

TEST(CarbonFlagsTest, FinishByWithoutALengthOrAnEstimateIsRefusedWithTheWayOut) {
  v1::JobSpec spec;
  spec.set_model("mlp");
  spec.set_dataset("fashion-mnist");
  spec.set_workers(1);
  spec.set_global_batch_size(64);
  spec.set_epochs(1);
  spec.mutable_optimizer()->set_lr(0.05);
  spec.set_carbon_aware(true);
  spec.set_finish_by_unix_ms(kNowMs);
  v1::JobSpec check = spec;
  check.set_expected_run_seconds(1);
  ASSERT_TRUE(NormalizeAndValidateSpec(check).ok()) << NormalizeAndValidateSpec(check);
  const absl::Status st = FillCarbonRun(std::vector<v1::Job>{}, &spec);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("give --expected-duration"), std::string::npos) << st.message();
  // With a start_before deadline the coordinator plans for an hour: nothing to refuse.
  spec.clear_finish_by_unix_ms();
  spec.set_start_before_unix_ms(kNowMs);
  EXPECT_TRUE(FillCarbonRun(std::vector<v1::Job>{}, &spec).ok());
  EXPECT_EQ(spec.expected_run_seconds(), 0);
}

}  // namespace
}  // namespace joule::client
