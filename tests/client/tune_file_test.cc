#include "client/tune_file.h"

#include <gtest/gtest.h>

#include <string>

namespace joule::client {
namespace {

constexpr char kBase[] =
    "name: t\n"
    "base: {model: mlp, epochs: 16, global_batch_size: 64}\n"
    "grid: {workers: [1, 2]}\n";

TEST(TuneFileTest, ReadsTheObjectiveTargetAndConstraints) {
  absl::StatusOr<TuneDefinition> t =
      ParseTuneText(std::string(kBase) +
                        "minimize: time_to_accuracy\ntarget_accuracy: 0.85\nmax_wall_time: 10m\n"
                        "max_slowdown: 1.5\nsearch_budget: 200kJ\nmin_epochs: 1\neta: 3\n",
                    "tune.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->sweep.name, "t");
  EXPECT_EQ(t->sweep.axes.size(), 1u);
  EXPECT_EQ(t->options.objective, TuneObjective::kTimeToAccuracy);
  EXPECT_DOUBLE_EQ(t->options.target_accuracy, 0.85);
  EXPECT_DOUBLE_EQ(t->options.max_wall_time_seconds, 600);
  EXPECT_DOUBLE_EQ(t->options.max_slowdown, 1.5);
  EXPECT_DOUBLE_EQ(t->search_budget_joules, 200e3);
  EXPECT_EQ(t->options.min_epochs, 1);
  EXPECT_EQ(t->options.eta, 3);
  EXPECT_EQ(t->options.max_epochs, 16);
  // Defaults.
  t = ParseTuneText(std::string(kBase) + "target_accuracy: 0.9\n", "tune.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->options.objective, TuneObjective::kEnergyToAccuracy);
  EXPECT_EQ(t->options.min_epochs, 2);
  EXPECT_EQ(t->options.eta, 2);
  EXPECT_EQ(t->search_budget_joules, 0);
}

// Each bad value: INVALID_ARGUMENT, one line, naming its key.
TEST(TuneFileTest, BadValuesAreRefusedNamingTheirKey) {
  const std::pair<std::string, std::string> bad[] = {
      {"", "target_accuracy"},
      {"target_accuracy: 1.5\n", "target_accuracy"},
      {"target_accuracy: nan\n", "target_accuracy"},
      {"target_accuracy: [0.8]\n", "target_accuracy"},
      {"target_accuracy: 0.8\nminimize: money\n", "minimize"},
      {"target_accuracy: 0.8\nmax_wall_time: soon\n", "max_wall_time"},
      {"target_accuracy: 0.8\nmax_wall_time: -5\n", "max_wall_time"},
      {"target_accuracy: 0.8\nmax_slowdown: 0.5\n", "max_slowdown"},
      {"target_accuracy: 0.8\nsearch_budget: lots\n", "search_budget"},
      {"target_accuracy: 0.8\nmin_epochs: 17\n", "min_epochs"},
      {"target_accuracy: 0.8\neta: 1\n", "eta"},
      {"target_accuracy: 0.8\nrepeats: 3\n", "repeats"},
      {"target_accuracy: 0.8\nunknown_key: 1\n", "unknown_key"},
  };
  for (const auto& [extra, key] : bad) {
    absl::StatusOr<TuneDefinition> t = ParseTuneText(std::string(kBase) + extra, "tune.yaml");
    ASSERT_FALSE(t.ok()) << extra;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    const std::string message(t.status().message());
    EXPECT_NE(message.find(key), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // The search sets epochs: not an axis; and the base must give them.
  absl::StatusOr<TuneDefinition> t = ParseTuneText(
      "name: t\nbase: {model: mlp, epochs: 4, global_batch_size: 64}\ngrid: {epochs: [1, 2]}\n"
      "target_accuracy: 0.8\n",
      "tune.yaml");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("epochs"), std::string::npos) << t.status();
  t = ParseTuneText(
      "name: t\nbase: {model: mlp, global_batch_size: 64}\ngrid: {workers: [1]}\n"
      "target_accuracy: 0.8\n",
      "tune.yaml");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("epochs"), std::string::npos) << t.status();
  for (const char* text : {"", "[1, 2]", "target_accuracy: [", "\xff\xfe"}) {
    EXPECT_FALSE(ParseTuneText(text, "tune.yaml").ok()) << text;
  }
}

TEST(TuneFileTest, DurationsTakeSecondsMinutesAndHours) {
  EXPECT_DOUBLE_EQ(*ParseDurationSeconds("90"), 90);
  EXPECT_DOUBLE_EQ(*ParseDurationSeconds("90s"), 90);
  EXPECT_DOUBLE_EQ(*ParseDurationSeconds("1.5m"), 90);
  EXPECT_DOUBLE_EQ(*ParseDurationSeconds("2h"), 7200);
  for (const char* bad : {"", "m", "0", "-1", "1d", "inf", "1e30h"}) {
    EXPECT_FALSE(ParseDurationSeconds(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace joule::client
