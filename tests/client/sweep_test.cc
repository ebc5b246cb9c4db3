// Sweep files: parsing, expansion (every preset), the line fit against known answers, and
// the result table's arithmetic.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/spec_file.h"
#include "client/sweep_file.h"
#include "common/sweep_format.h"

namespace joule::client {
namespace {

SweepDefinition MustParse(const std::string& text) {
  absl::StatusOr<SweepDefinition> s = ParseSweepText(text, "sweep.yaml");
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : SweepDefinition{};
}

std::vector<SweepCell> MustExpand(const std::string& text) {
  absl::StatusOr<std::vector<SweepCell>> cells = ExpandSweep(MustParse(text));
  EXPECT_TRUE(cells.ok()) << cells.status();
  return cells.ok() ? *cells : std::vector<SweepCell>{};
}

TEST(SweepTest, GridTimesRepeatsInFileOrderWithLabelsSeedsAndStableRequestIds) {
  const std::string text = R"(
name: mlp-grid
repeats: 2
base: {model: mlp, epochs: 1, optimizer: {lr: 0.05}}
grid:
  workers: [1, 2]
  global_batch_size: [64, 128, 256]
)";
  std::vector<SweepCell> cells = MustExpand(text);
  ASSERT_EQ(cells.size(), 12u);
  EXPECT_EQ(cells[0].key, "workers=1,global_batch_size=64");
  EXPECT_EQ(cells[2].key, "workers=1,global_batch_size=128");  // r0, r1 of cell 0 first
  EXPECT_EQ(cells[11].key, "workers=2,global_batch_size=256");
  std::set<std::string> ids;
  for (const SweepCell& c : cells) {
    EXPECT_EQ(c.spec.model(), "mlp");
    EXPECT_DOUBLE_EQ(c.spec.optimizer().lr(), 0.05);
    EXPECT_EQ(c.spec.seed(), static_cast<uint64_t>(c.repeat));
    EXPECT_EQ(c.spec.labels().at("sweep"), "mlp-grid");
    EXPECT_EQ(c.spec.labels().at("cell"), c.key);
    EXPECT_EQ(c.spec.labels().at("repeat"), std::to_string(c.repeat));
    ids.insert(c.request_id);
  }
  EXPECT_EQ(cells[5].spec.workers(), 1);
  EXPECT_EQ(cells[5].spec.global_batch_size(), 256);
  EXPECT_EQ(ids.size(), cells.size());  // every job its own request id
  // Expanding again gives the same ids (a re-run submits nothing twice); a changed base
  // gives new ones (a different job is not mistaken for a finished one).
  EXPECT_EQ(MustExpand(text)[7].request_id, cells[7].request_id);
  std::string changed = text;
  changed.replace(changed.find("lr: 0.05"), 8, "lr: 0.10");
  EXPECT_NE(MustExpand(changed)[7].request_id, cells[7].request_id);
}

TEST(SweepTest, NestedFieldsAndListValues) {
  std::vector<SweepCell> cells = MustExpand(R"(
name: sizes
base: {model: mlp, workers: 2, global_batch_size: 128}
grid:
  hidden_sizes: [[256], [512, 256]]
  optimizer.lr: [0.01, 0.1]
)");
  ASSERT_EQ(cells.size(), 4u);
  EXPECT_EQ(cells[0].key, "hidden_sizes=[256],optimizer.lr=0.01");
  ASSERT_EQ(cells[3].spec.hidden_sizes_size(), 2);
  EXPECT_EQ(cells[3].spec.hidden_sizes(0), 512);
  EXPECT_DOUBLE_EQ(cells[3].spec.optimizer().lr(), 0.1);
}

TEST(SweepTest, ZippedAxesTakeTheirValuesTogether) {
  // Workers zipped with the job's population (islands of 64, and of 16), crossed with a
  // plain axis; list values inside a zipped axis.
  std::vector<SweepCell> cells = MustExpand(R"(
name: zipped
base: {model: logreg, algorithm: ga, global_batch_size: 64}
grid:
  "workers, ga.population": [[1, 64], [2, 32]]
  intra_op_threads: [1, 2]
)");
  ASSERT_EQ(cells.size(), 4u);
  EXPECT_EQ(cells[0].key, "workers=1,ga.population=64,intra_op_threads=1");
  EXPECT_EQ(cells[3].key, "workers=2,ga.population=32,intra_op_threads=2");
  EXPECT_EQ(cells[3].spec.workers(), 2);
  EXPECT_EQ(cells[3].spec.ga().population(), 32);
  EXPECT_EQ(cells[3].spec.intra_op_threads(), 2);
  EXPECT_EQ(cells[2].values.at("ga.population"), "32");
  // Both axes set the parallelism (the population along with the workers): one series.
  for (const SweepCell& c : cells) {
    EXPECT_EQ(c.series, "") << c.key;
    EXPECT_EQ(c.spec.labels().at("series"), "") << c.key;
  }
  std::vector<SweepCell> lists = MustExpand(R"(
name: zipped-lists
base: {model: mlp, global_batch_size: 64}
grid:
  hidden_sizes,optimizer.lr: [[[64], 0.1], [[256, 128], 0.05]]
)");
  ASSERT_EQ(lists.size(), 2u);
  EXPECT_EQ(lists[1].key, "hidden_sizes=[256, 128],optimizer.lr=0.05");
  EXPECT_EQ(lists[1].spec.hidden_sizes_size(), 2);
  EXPECT_EQ(lists[1].series, lists[1].key);  // no parallelism axis: every cell its own series
}

TEST(SweepTest, Presets) {
  // Strong scaling at constant local batch: GBS = LBS x N.
  std::vector<SweepCell> local = MustExpand(R"(
name: s
preset: strong-local
base: {model: mlp, local_batch_size: 64}
grid: {workers: [1, 2, 4]}
)");
  ASSERT_EQ(local.size(), 3u);
  for (const SweepCell& c : local) {
    EXPECT_EQ(c.spec.local_batch_size(), 64) << c.key;  // so GBS = 64 x N
    EXPECT_EQ(c.spec.global_batch_size(), 0) << c.key;
    EXPECT_EQ(c.spec.workers(), 1 << c.index) << c.key;
  }
  // At constant global batch, each cell keeps it.
  std::vector<SweepCell> global = MustExpand(R"(
name: s
preset: strong-global
base: {model: mlp, global_batch_size: 256}
grid: {workers: [1, 2, 4]}
)");
  ASSERT_EQ(global.size(), 3u);
  for (const SweepCell& c : global) {
    EXPECT_EQ(c.spec.global_batch_size(), 256) << c.key;  // so LBS = 256 / N
    EXPECT_EQ(c.spec.local_batch_size(), 0) << c.key;
  }
  // Weak scaling: N workers train on N / N_max of the data.
  std::vector<SweepCell> weak = MustExpand(R"(
name: s
preset: weak
base: {model: mlp, local_batch_size: 64}
grid: {workers: [1, 2, 4]}
)");
  ASSERT_EQ(weak.size(), 3u);
  EXPECT_EQ(weak[0].spec.dataset_fraction(), 4);
  EXPECT_EQ(weak[1].spec.dataset_fraction(), 2);
  EXPECT_EQ(weak[2].spec.dataset_fraction(), 1);
  EXPECT_EQ(weak[0].spec.labels().at("sweep_preset"), "weak");
}

TEST(SweepTest, SetAndGridShrinkAFileWithoutEditingIt) {
  absl::StatusOr<SweepDefinition> s = ParseSweepText(
      "name: big\n"
      "base: {model: mlp, epochs: 90, global_batch_size: 1024, optimizer: {lr: 0.1}}\n"
      "grid:\n"
      "  workers: [1, 2, 4, 8]\n"
      "  \"global_batch_size, optimizer.lr\": [[256, 0.1], [512, 0.2]]\n",
      "big.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(OverrideSweep(*s, {"epochs=1", "optimizer.momentum=0.9", "max_train_samples=512"},
                            {"workers=[1, 2]", "global_batch_size, optimizer.lr=[[64, 0.05]]"})
                  .ok());
  absl::StatusOr<std::vector<SweepCell>> cells = ExpandSweep(*s);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), 2u);
  EXPECT_EQ((*cells)[1].key, "workers=2,global_batch_size=64,optimizer.lr=0.05");
  EXPECT_EQ((*cells)[1].spec.epochs(), 1);
  EXPECT_EQ((*cells)[1].spec.optimizer().momentum(), 0.9);
  EXPECT_EQ((*cells)[1].spec.optimizer().lr(), 0.05);
  EXPECT_EQ((*cells)[0].spec.max_train_samples(), 512);
  // An overridden sweep is another sweep: its own name (so `sweep status big` never
  // averages a shrunk cell with the file's), the same for the same overrides, in the
  // jobs' labels and request ids.
  ASSERT_EQ(s->name.size(), std::string("big-").size() + 8) << s->name;
  EXPECT_EQ(s->name.substr(0, 4), "big-");
  EXPECT_EQ((*cells)[0].spec.labels().at("sweep"), s->name);
  EXPECT_NE((*cells)[0].request_id.find("sweep/" + s->name + "/"), std::string::npos);
  auto name_after = [](std::vector<std::string> sets, std::vector<std::string> grids) {
    absl::StatusOr<SweepDefinition> d = ParseSweepText(
        "name: " + std::string(64, 'n') + "\nbase: {model: mlp}\ngrid:\n  workers: [1, 2]\n",
        "n.yaml");
    EXPECT_TRUE(d.ok());
    EXPECT_TRUE(OverrideSweep(*d, sets, grids).ok());
    return d->name;
  };
  EXPECT_EQ(name_after({}, {}), std::string(64, 'n'));  // the file's own run
  EXPECT_EQ(name_after({"epochs=1"}, {}), name_after({"epochs=1"}, {}));
  EXPECT_NE(name_after({"epochs=1"}, {}), name_after({"epochs=2"}, {}));
  EXPECT_NE(name_after({}, {"workers=[1]"}), name_after({}, {"workers=[2]"}));
  // The same overrides in another order or spacing (the last value of a field wins).
  EXPECT_EQ(name_after({"epochs=1", "seed=3"}, {}), name_after({"seed=3", "epochs=1"}, {}));
  EXPECT_EQ(name_after({"epochs=2", "epochs=1"}, {}), name_after({"epochs=1"}, {}));
  EXPECT_EQ(name_after({}, {"workers=[1,2]"}), name_after({}, {"workers=[1, 2]"}));
  EXPECT_EQ(name_after({"epochs=1"}, {}).size(), 64u);  // cut to fit the name's limit
  // Every malformed override is refused, naming it; nothing half-applied counts.
  for (const auto& [sets, grids, message] :
       std::vector<std::tuple<std::vector<std::string>, std::vector<std::string>, std::string>>{
           {{"workers=4"}, {}, "the grid varies workers; use --grid workers=[...]"},
           {{"epochs"}, {}, "want FIELD=VALUE"},
           {{"=3"}, {}, "want FIELD=VALUE"},
           {{"optimizer..lr=1"}, {}, "want FIELD=VALUE"},
           {{"epochs=[1"}, {}, "the value is not YAML"},
           {{}, {"threads=[1]"}, "AXIS one of the grid's"},
           {{}, {"workers"}, "AXIS one of the grid's"},
           {{}, {"workers=3"}, "not a non-empty list"},
           {{}, {"workers=[]"}, "not a non-empty list"},
           {{}, {"global_batch_size, optimizer.lr=[64, 128]"}, "a list of 2"},
           {{}, {[] {
              std::string many = "workers=[1";
              for (int i = 0; i < 1000; ++i) many += ", 1";
              return many + "]";
            }()},
            "--grid: more than 1000 jobs"},
       }) {
    absl::StatusOr<SweepDefinition> t = ParseSweepText(
        "name: big\nbase: {model: mlp}\ngrid:\n  workers: [1, 2]\n"
        "  \"global_batch_size, optimizer.lr\": [[256, 0.1]]\n",
        "big.yaml");
    ASSERT_TRUE(t.ok());
    absl::Status st = OverrideSweep(*t, sets, grids);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(std::string(st.message()).find(message), std::string::npos) << st;
  }
}

TEST(SweepTest, SetSpecFieldRefusesAFileThatIsNoMapping) {
  YAML::Node list = YAML::Load("[1, 2]");
  absl::Status s = SetSpecField(list, "epochs=1");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("the job file is not a mapping"), std::string::npos);
  YAML::Node empty;  // an empty file: the fields become its mapping
  ASSERT_TRUE(SetSpecField(empty, "optimizer.lr=0.5").ok());
  EXPECT_EQ(empty["optimizer"]["lr"].as<double>(), 0.5);
}

TEST(SweepTest, ConcurrencyIsReadAndDefaultsToAllAtOnce) {
  EXPECT_EQ(MustParse("name: x\nbase: {model: mlp}\ngrid: {workers: [1]}\n").concurrency, 0);
  EXPECT_EQ(
      MustParse("name: x\nconcurrency: 1\nbase: {model: mlp}\ngrid: {workers: [1]}\n").concurrency,
      1);
}

TEST(SweepTest, QuotedStringsStayStrings) {
  std::vector<SweepCell> cells = MustExpand(R"(
name: q
base: {model: mlp, workers: 1, global_batch_size: 64, labels: {run: "1"}}
grid:
  name: ["1", "true"]
)");
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_EQ(cells[0].spec.name(), "1");
  EXPECT_EQ(cells[1].spec.name(), "true");
  EXPECT_EQ(cells[0].spec.labels().at("run"), "1");
}

TEST(SweepTest, BadFilesGetOneLineErrorsNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "a mapping"},
      {"name: x\nbase: {model: mlp}\n", "grid: missing"},
      {"name: x\ngrid: {workers: [1]}\n", "base: missing"},
      {"base: {model: mlp}\ngrid: {workers: [1]}\n", "name:"},
      {"name: 'a b'\nbase: {model: mlp}\ngrid: {workers: [1]}\n", "name:"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: []}\n", "grid.workers"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: 2}\n", "grid.workers"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: [1]}\nrepeats: 0\n", "repeats"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: [1]}\ncolour: red\n", "unknown key 'colour'"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: [1]}\npreset: fast\n", "preset"},
      {"name: x\nbase: {model: mlp}\ngrid: {'workers,epochs': [[1, 2], 3]}\n",
       "grid.workers,epochs: 3 is not a list of 2 values, one per field"},
      {"name: x\nbase: {model: mlp}\ngrid: {'workers,epochs': [[1, 2, 3]]}\n",
       "is not a list of 2 values"},
      {"name: x\nbase: {model: mlp}\ngrid: {'workers,': [[1, 2]]}\n", "an empty field name"},
      {"name: x\nbase: {model: mlp}\ngrid: {'workers,epochs': [[1, 2]], epochs: [3]}\n",
       "epochs is in more than one axis"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: [1]}\nconcurrency: 0\n",
       "concurrency: 0 is not in 1..1000"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: [1]}\nconcurrency: -2\n", "concurrency"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: [1]}\nconcurrency: lots\n", "line 4"},
      {"name: x\nbase: {model: mlp}\ngrid: {a: [1,2,3,4,5,6,7,8,9,10], b: [1,2,3,4,5,6,7,8,9,10],"
       " c: [1,2,3,4,5,6,7,8,9,10], d: [1,2,3,4,5,6,7,8,9,10], e: [1,2]}\n",
       "more than 1000 jobs"},
      {"name: x\nbase: {model: mlp}\ngrid: {workers: [1]\n", "not YAML"},
      // Past yaml-cpp's depth guard: said as such (issue 23), not "bad file".
      {"name: x\nbase: {model: mlp}\ngrid: {workers: " + std::string(3000, '[') + "\n",
       "nested too deeply"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<SweepDefinition> s = ParseSweepText(text, "sweep.yaml");
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.status().message().find(want), std::string::npos) << s.status();
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos) << s.status();
    EXPECT_EQ(s.status().message().rfind("sweep.yaml: ", 0), 0u) << s.status();
  }
  // A "billion laughs" grid is refused before it is expanded.
  std::string bomb = "name: x\nbase: {model: mlp}\na: &a [1,1,1,1,1,1,1,1,1,1]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    bomb += absl::StrCat(std::string(1, c), ": &", std::string(1, c), " [*",
                         std::string(1, c - 1), ",*", std::string(1, c - 1), ",*",
                         std::string(1, c - 1), ",*", std::string(1, c - 1), ",*",
                         std::string(1, c - 1), ",*", std::string(1, c - 1), ",*",
                         std::string(1, c - 1), ",*", std::string(1, c - 1), ",*",
                         std::string(1, c - 1), ",*", std::string(1, c - 1), "]\n");
  }
  absl::StatusOr<SweepDefinition> b = ParseSweepText(bomb + "grid: {workers: *i}\n", "bomb");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("aliases"), std::string::npos) << b.status();
}

TEST(SweepTest, CellsThatBreakTheSpecOrThePresetNameTheCell) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // A value the job file refuses names the cell and the field.
      {"name: x\nbase: {model: mlp}\ngrid: {workers: [1, two]}\n", "cell workers=two"},
      {"name: x\nbase: {model: mlp}\ngrid: {colour: [1]}\n", "colour"},
      // Presets: a batch axis, a missing base batch, a worker count that does not divide.
      {"name: x\npreset: strong-local\nbase: {model: mlp, local_batch_size: 8}\n"
       "grid: {workers: [1], global_batch_size: [8]}\n", "the preset fixes the batch"},
      {"name: x\npreset: strong-local\nbase: {model: mlp, local_batch_size: 8}\n"
       "grid: {workers: [1], globalBatchSize: [8]}\n", "the preset fixes the batch"},
      {"name: x\npreset: strong-local\nbase: {model: mlp}\ngrid: {workers: [1, 2]}\n",
       "strong-local keeps local_batch_size fixed"},
      {"name: x\npreset: strong-global\nbase: {model: mlp}\ngrid: {workers: [1, 2]}\n",
       "strong-global keeps global_batch_size fixed"},
      // What the coordinator would refuse, refused before anything is submitted.
      {"name: x\nbase: {model: mlp, global_batch_size: 3}\ngrid: {workers: [1, 2]}\n",
       "cell workers=2"},
      // Two cells that are one job.
      {"name: x\nbase: {model: mlp, global_batch_size: 8}\ngrid: {workers: [2, 2]}\n",
       "are the same job"},
      {"name: x\nbase: {model: mlp, global_batch_size: 8}\ngrid: {optimizer.lr: [0.1, 1e-1]}\n",
       "are the same job"},
      {"name: x\npreset: weak\nbase: {model: mlp, local_batch_size: 8}\ngrid: {workers: [2, 3]}\n",
       "multiple"},
      {"name: x\npreset: weak\nbase: {model: mlp, local_batch_size: 8}\ngrid: {epochs: [1]}\n",
       "grid.workers"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<SweepDefinition> s = ParseSweepText(text, "sweep.yaml");
    ASSERT_TRUE(s.ok()) << s.status();
    absl::StatusOr<std::vector<SweepCell>> cells = ExpandSweep(*s);
    ASSERT_FALSE(cells.ok()) << text;
    EXPECT_NE(cells.status().message().find(want), std::string::npos) << cells.status();
    EXPECT_EQ(cells.status().message().find('\n'), std::string::npos) << cells.status();
  }
}

TEST(FitLineTest, ExactLineAndKnownRegression) {
  // y = 3x + 2 exactly: the fit is exact, R^2 1, intervals 0.
  absl::StatusOr<LineFit> exact = FitLine({1, 2, 3, 4}, {5, 8, 11, 14});
  ASSERT_TRUE(exact.ok());
  EXPECT_NEAR(exact->slope, 3, 1e-12);
  EXPECT_NEAR(exact->intercept, 2, 1e-12);
  EXPECT_NEAR(exact->r2, 1, 1e-12);
  EXPECT_NEAR(exact->slope_ci95, 0, 1e-9);
  // x = 1..5, y = 2, 4, 5, 4, 5 (a textbook example): slope 0.6, intercept 2.2,
  // R^2 = 0.6, s^2 = 2.4 / 3 = 0.8, SE(slope) = sqrt(0.8 / 10), t(0.975, 3) = 3.182.
  absl::StatusOr<LineFit> f = FitLine({1, 2, 3, 4, 5}, {2, 4, 5, 4, 5});
  ASSERT_TRUE(f.ok());
  EXPECT_NEAR(f->slope, 0.6, 1e-12);
  EXPECT_NEAR(f->intercept, 2.2, 1e-12);
  EXPECT_NEAR(f->r2, 0.6, 1e-12);
  EXPECT_NEAR(f->slope_ci95, 3.182 * std::sqrt(0.08), 1e-9);
  EXPECT_NEAR(f->intercept_ci95, 3.182 * std::sqrt(0.8 * (0.2 + 9.0 / 10)), 1e-9);
  EXPECT_EQ(FitLine({1}, {1}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FitLine({2, 2, 2}, {1, 2, 3}).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Issue 23: two points (or k + 1 for k regressors) fit exactly; the text says there are too
// few for an interval instead of "+- 0.0 ... R^2 1.0000 (95% intervals)".
TEST(FitTextTest, TooFewPointsForAnIntervalSaySoInWords) {
  absl::StatusOr<LineFit> two = FitLine({1, 2}, {10, 30});
  ASSERT_TRUE(two.ok());
  const std::string t2 = LineFitText(*two);
  EXPECT_NE(t2.find("20.0 J per device-hour"), std::string::npos) << t2;
  EXPECT_NE(t2.find("too few points for an interval"), std::string::npos) << t2;
  EXPECT_EQ(t2.find("+-"), std::string::npos) << t2;
  EXPECT_EQ(t2.find("R^2 1"), std::string::npos) << t2;
  absl::StatusOr<LineFit> five = FitLine({1, 2, 3, 4, 5}, {2, 4, 5, 4, 5});
  ASSERT_TRUE(five.ok());
  const std::string t5 = LineFitText(*five);
  EXPECT_NE(t5.find("+-"), std::string::npos) << t5;
  EXPECT_NE(t5.find("R^2 0.6000 (n=5, 95% intervals)"), std::string::npos) << t5;
  // Three coefficients through three points: exact, no degree of freedom.
  absl::StatusOr<LinearFit> exact = FitLinear({{1, 2, 4}, {3, 1, 2}}, {1, 2, 3});
  ASSERT_TRUE(exact.ok()) << exact.status();
  const std::string te = LinearFitText(*exact, {"x a", "x b"});
  EXPECT_NE(te.find("too few points for an interval"), std::string::npos) << te;
  EXPECT_EQ(te.find("+-"), std::string::npos) << te;
  absl::StatusOr<LinearFit> more = FitLinear({{1, 2, 4, 5, 7}, {3, 1, 2, 6, 4}}, {1, 2, 3, 5, 4});
  ASSERT_TRUE(more.ok()) << more.status();
  const std::string tm = LinearFitText(*more, {"x a", "x b"});
  EXPECT_NE(tm.find(" x a + "), std::string::npos) << tm;
  EXPECT_NE(tm.find("(n=5, 95% intervals)"), std::string::npos) << tm;
}

TEST(FitLinearTest, RecoversAKnownPlaneAndAgreesWithFitLine) {
  // y = 1 + 2 a - 3 b exactly, a and b not collinear.
  const std::vector<double> a = {1, 2, 3, 4, 5, 6}, b = {2, 1, 4, 3, 6, 5};
  std::vector<double> y;
  for (size_t i = 0; i < a.size(); ++i) y.push_back(1 + 2 * a[i] - 3 * b[i]);
  absl::StatusOr<LinearFit> f = FitLinear({a, b}, y);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->coefficients.size(), 3u);
  EXPECT_NEAR(f->coefficients[0], 1, 1e-9);
  EXPECT_NEAR(f->coefficients[1], 2, 1e-9);
  EXPECT_NEAR(f->coefficients[2], -3, 1e-9);
  EXPECT_NEAR(f->r2, 1, 1e-12);
  // One regressor: the same line, intercept and intervals as FitLine.
  absl::StatusOr<LinearFit> one = FitLinear({{1, 2, 3, 4, 5}}, {2, 4, 5, 4, 5});
  absl::StatusOr<LineFit> line = FitLine({1, 2, 3, 4, 5}, {2, 4, 5, 4, 5});
  ASSERT_TRUE(one.ok() && line.ok());
  EXPECT_NEAR(one->coefficients[0], line->intercept, 1e-12);
  EXPECT_NEAR(one->coefficients[1], line->slope, 1e-12);
  EXPECT_NEAR(one->ci95[1], line->slope_ci95, 1e-9);
  EXPECT_NEAR(one->ci95[0], line->intercept_ci95, 1e-9);
  // Regressors of very different magnitudes (GPU-scale samples per device-hour, updates
  // per device-hour at two batch sizes) are not mistaken for collinear ones.
  std::vector<double> samples, updates, joules;
  for (int i = 0; i < 6; ++i) {
    const double u = 2e5 + 3e4 * i, batch = i % 2 ? 512 : 256;
    samples.push_back(u * batch);  // ~1e8
    updates.push_back(u);
    joules.push_back(4e5 + 1e-3 * u * batch + 0.5 * u);
  }
  absl::StatusOr<LinearFit> big = FitLinear({samples, updates}, joules);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_NEAR(big->coefficients[0], 4e5, 1e-3);
  EXPECT_NEAR(big->coefficients[1], 1e-3, 1e-12);
  EXPECT_NEAR(big->coefficients[2], 0.5, 1e-8);
  // Collinear regressors (b = 2a) and too few points are refused.
  EXPECT_EQ(FitLinear({a, {2, 4, 6, 8, 10, 12}}, y).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FitLinear({{1, 2}, {3, 1}}, {1, 2}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(FitLineTest, StudentTQuantilesMatchTheTable) {
  EXPECT_DOUBLE_EQ(StudentT975(1), 12.706);
  EXPECT_DOUBLE_EQ(StudentT975(10), 2.228);
  EXPECT_DOUBLE_EQ(StudentT975(30), 2.042);
  EXPECT_NEAR(StudentT975(50), 2.009, 0.002);  // tabulated 2.009
  EXPECT_NEAR(StudentT975(100000), 1.960, 0.001);
  for (int df = 1; df < 500; ++df) EXPECT_GE(StudentT975(df), StudentT975(df + 1)) << df;
}

v1::Job FinishedJob(const std::string& cell, int workers, double wall, double joules,
                    v1::JobState state = v1::JOB_STATE_SUCCEEDED) {
  v1::Job j;
  j.set_state(state);
  j.mutable_spec()->set_workers(workers);
  (*j.mutable_spec()->mutable_labels())["cell"] = cell;
  j.mutable_result()->set_wall_seconds(wall);
  j.mutable_result()->set_test_accuracy(0.8);
  j.mutable_result()->set_samples(36000);
  j.mutable_result()->mutable_energy()->set_total_joules(joules);
  j.mutable_result()->mutable_energy()->set_device_hours(wall * workers / 3600);
  j.mutable_result()->mutable_energy()->set_estimated(true);
  return j;
}

// Issue 23: a cell whose runs all failed (or never ran) shows no figure as a zero.
TEST(SummariseSweepTest, ACellWithNoSuccessShowsDashesNotZeros) {
  std::vector<v1::Job> jobs = {
      FinishedJob("workers=1,global_batch_size=64", 1, 10, 100),
      FinishedJob("workers=8,global_batch_size=64", 8, 0, 0, v1::JOB_STATE_CANCELLED),
  };
  const std::string table = SweepTable(SummariseSweep(jobs));
  const size_t at = table.find("workers=8,global_batch_size=64");
  ASSERT_NE(at, std::string::npos) << table;
  const std::string line = table.substr(at, table.find('\n', at) - at);
  EXPECT_NE(line.find("none succeeded"), std::string::npos) << line;
  EXPECT_EQ(line.find("0.0000"), std::string::npos) << line;
  EXPECT_EQ(line.find("measured"), std::string::npos) << line;
}

TEST(SweepTest, CellsTheRegisteredWorkersCannotRunSayWhy) {
  v1::JobSpec spec;
  spec.set_workers(8);
  spec.set_device_kind(v1::DEVICE_KIND_CPU);
  const std::map<v1::DeviceKind, int> two = {{v1::DEVICE_KIND_CPU, 2}, {v1::DEVICE_KIND_GPU, 8}};
  EXPECT_EQ(UnrunnableReason(spec, two), "needs 8 cpu workers and only 2 are registered");
  spec.set_workers(2);
  EXPECT_EQ(UnrunnableReason(spec, two), "");
  spec.set_workers(1);
  spec.set_device_kind(v1::DEVICE_KIND_GPU);
  EXPECT_EQ(UnrunnableReason(spec, {{v1::DEVICE_KIND_CPU, 4}}),
            "needs 1 gpu worker and only 0 are registered");
  EXPECT_EQ(UnrunnableReason(spec, two), "");
  spec.set_workers(9);
  EXPECT_EQ(UnrunnableReason(spec, two), "needs 9 gpu workers and only 8 are registered");
}

TEST(SummariseSweepTest, MeansSpreadSpeedupAndEfficiencyPerSeries) {
  std::vector<v1::Job> jobs = {
      FinishedJob("workers=1,global_batch_size=64", 1, 10, 100),
      FinishedJob("workers=1,global_batch_size=64", 1, 12, 120),
      FinishedJob("workers=2,global_batch_size=64", 2, 6, 130),
      FinishedJob("workers=2,global_batch_size=64", 2, 0, 0, v1::JOB_STATE_FAILED),
      FinishedJob("workers=2,global_batch_size=128", 2, 5, 110),
  };
  std::vector<SweepRow> rows = SummariseSweep(jobs);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].jobs, 2);
  EXPECT_DOUBLE_EQ(rows[0].wall_mean, 11);
  EXPECT_NEAR(rows[0].wall_sd, std::sqrt(2.0), 1e-12);
  EXPECT_DOUBLE_EQ(rows[0].energy_mean, 110);
  EXPECT_DOUBLE_EQ(rows[0].speedup, 1);
  EXPECT_EQ(rows[1].jobs, 2);
  EXPECT_EQ(rows[1].succeeded, 1);  // the failed repeat counts, but not in the means
  EXPECT_DOUBLE_EQ(rows[1].wall_mean, 6);
  EXPECT_NEAR(rows[1].speedup, 11.0 / 6, 1e-12);
  EXPECT_NEAR(rows[1].efficiency, 11.0 / 12, 1e-12);
  EXPECT_NEAR(rows[1].joules_per_device_hour, 130 / (12.0 / 3600), 1e-6);
  EXPECT_TRUE(rows[1].estimated);
  // global_batch_size=128 has no 1-worker cell: its own series, its own reference.
  EXPECT_DOUBLE_EQ(rows[2].speedup, 1);
  EXPECT_NE(SweepTable(rows).find("workers=2,global_batch_size=128"), std::string::npos);
  EXPECT_EQ(SweepCsv(rows).find("\"workers=1,global_batch_size=64\",1,2,2,11,"),
            SweepCsv(rows).find('\n') + 1);
  const std::string json = SweepJson(rows, nullptr);
  EXPECT_NE(json.find("\"speedup\": 1.8333"), std::string::npos) << json;
}

// A cell's target is its spec's metric and value: an RMSE reached (<=) counts; the same
// value reached in another metric (test_accuracy's ladder) does not.
TEST(SummariseSweepTest, ALossTargetIsMatchedByItsMetricNotOnlyItsValue) {
  auto job = [](double joules, bool rmse_reached) {
    v1::Job j = FinishedJob("workers=1", 1, 10, joules);
    j.mutable_spec()->set_target_metric("test_rmse");
    j.mutable_spec()->set_target_loss(0.5);
    v1::AccuracyTarget* other = j.mutable_result()->add_to_accuracy();
    other->set_metric("test_accuracy");
    other->set_target(0.5);
    other->set_reached(true);
    other->set_seconds(1);
    other->set_joules(1);
    v1::AccuracyTarget* t = j.mutable_result()->add_to_accuracy();
    t->set_metric("test_rmse");
    t->set_lower_is_better(true);
    t->set_target(0.5);
    t->set_reached(rmse_reached);
    t->set_seconds(4);
    t->set_joules(joules / 2);
    return j;
  };
  std::vector<SweepRow> rows = SummariseSweep({job(100, true), job(300, true), job(200, false)});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].target_metric, "test_rmse");
  EXPECT_DOUBLE_EQ(rows[0].target(), 0.5);
  EXPECT_EQ(rows[0].reached_target, 2);
  EXPECT_DOUBLE_EQ(rows[0].eta_mean, 100);  // (50 + 150) / 2
  EXPECT_DOUBLE_EQ(rows[0].tta_mean, 4);
  const std::string table = SweepTable(rows);
  EXPECT_NE(table.find("test_rmse <= 0.5"), std::string::npos) << table;
  EXPECT_NE(table.find("2/3"), std::string::npos) << table;
  EXPECT_NE(SweepCsv(rows).find(",test_rmse,0.5,"), std::string::npos) << SweepCsv(rows);
}

// The sweep CSV has a column per grid axis, values with commas kept whole and quoted.
TEST(SweepCsvTest, EveryGridAxisHasItsColumn) {
  using Axes = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(GridAxes("workers=2,hidden=[512, 256],lr=0.1"),
            (Axes{{"workers", "2"}, {"hidden", "[512, 256]"}, {"lr", "0.1"}}));
  EXPECT_EQ(GridAxes(""), Axes{});
  std::vector<SweepRow> rows(2);
  rows[0].key = "workers=1,hidden=[512, 256]";
  rows[1].key = "workers=2,hidden=[64],threads=2";
  const std::string csv = SweepCsv(rows);
  const std::string header = csv.substr(0, csv.find('\n'));
  EXPECT_NE(header.find(",target_loss,grid.workers,grid.hidden,grid.threads"), std::string::npos)
      << header;
  EXPECT_NE(csv.find(",1,\"[512, 256]\",\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",2,[64],2\n"), std::string::npos) << csv;
}

TEST(SummariseSweepTest, ThreadsAndWorkersAreOneSeriesOfParallelism) {
  // The first paper's modes: 1 worker x 1 thread (serial), 1 x 2 (shared memory), 2 x 1
  // (distributed memory), 2 x 2, for two dataset sizes: each size its own series, the
  // serial cell its reference, efficiency over workers x threads.
  std::vector<v1::Job> jobs;
  for (const char* fraction : {"4", "1"}) {
    for (auto [w, t, wall] : {std::tuple{1, 1, 8.0}, {1, 2, 5.0}, {2, 1, 4.0}, {2, 2, 4.0}}) {
      v1::Job j = FinishedJob(absl::StrCat("workers=", w, ",intra_op_threads=", t,
                                           ",dataset_fraction=", fraction),
                              w, wall * (fraction[0] == '4' ? 1 : 4), 10 * wall);
      j.mutable_spec()->set_intra_op_threads(t);
      jobs.push_back(j);
    }
  }
  std::vector<SweepRow> rows = SummariseSweep(jobs);
  ASSERT_EQ(rows.size(), 8u);
  for (int series : {0, 4}) {
    EXPECT_DOUBLE_EQ(rows[series].speedup, 1);
    EXPECT_DOUBLE_EQ(rows[series + 1].speedup, 8.0 / 5);
    EXPECT_DOUBLE_EQ(rows[series + 1].efficiency, 8.0 / 5 / 2);
    EXPECT_DOUBLE_EQ(rows[series + 2].speedup, 2);
    EXPECT_DOUBLE_EQ(rows[series + 2].efficiency, 1);
    EXPECT_DOUBLE_EQ(rows[series + 3].efficiency, 0.5);  // 4-way parallel, 2x faster
  }
  EXPECT_EQ(rows[1].threads, 2);
  EXPECT_DOUBLE_EQ(rows[0].average_watts, 10);  // 80 J in 8 s
  EXPECT_DOUBLE_EQ(rows[4].average_watts, 2.5);  // 80 J in 32 s
  EXPECT_NE(SweepCsv(rows).find(",1,2.5,test_accuracy,0,"), std::string::npos) << SweepCsv(rows);
  EXPECT_NE(SweepJson(rows, nullptr).find("\"average_watts\": 10"), std::string::npos);
  EXPECT_NE(SweepTable(rows).find("avg W"), std::string::npos);
}

TEST(SummariseSweepTest, TheSeriesLabelJoinsCellsThatAZippedAxisSetApart) {
  // "workers, global_batch_size": [[1, 64], [2, 128]]: the batch grows with the workers,
  // and the series label (set by the sweep) makes the two cells one series; without the
  // label (jobs of an older sweep) the key alone splits them.
  std::vector<v1::Job> jobs = {FinishedJob("workers=1,global_batch_size=64", 1, 10, 100),
                               FinishedJob("workers=2,global_batch_size=128", 2, 8, 100)};
  EXPECT_DOUBLE_EQ(SummariseSweep(jobs)[1].speedup, 1);
  for (v1::Job& j : jobs) (*j.mutable_spec()->mutable_labels())["series"] = "";
  std::vector<SweepRow> rows = SummariseSweep(jobs);
  EXPECT_DOUBLE_EQ(rows[1].speedup, 10.0 / 8);
  EXPECT_DOUBLE_EQ(rows[1].efficiency, 10.0 / 8 / 2);
}

TEST(SummariseSweepTest, WeakScalingEfficiencyIsTheTimeRatio) {
  std::vector<v1::Job> jobs = {FinishedJob("workers=1", 1, 10, 100),
                               FinishedJob("workers=4", 4, 12.5, 500)};
  for (v1::Job& j : jobs) (*j.mutable_spec()->mutable_labels())["sweep_preset"] = "weak";
  std::vector<SweepRow> rows = SummariseSweep(jobs);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[1].speedup, 0.8);
  EXPECT_DOUBLE_EQ(rows[1].efficiency, 0.8);  // 4x the work in 1.25x the time
  jobs[1].mutable_spec()->mutable_labels()->erase("sweep_preset");
  jobs[0].mutable_spec()->mutable_labels()->erase("sweep_preset");
  EXPECT_DOUBLE_EQ(SummariseSweep(jobs)[1].efficiency, 0.2);  // strong: 0.8 x 1 / 4
}

}  // namespace
}  // namespace joule::client
