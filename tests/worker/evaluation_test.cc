#include "worker/train/evaluation.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "tests/testing/run_ranks.h"
#include "tests/testing/fake_model.h"
#include "worker/comm/shm_process_group.h"

namespace joule::worker {
namespace {

EvalOptions TopK(int k) {
  EvalOptions o;
  o.top_k = k;
  return o;
}

// Two classes, 1x1x1 images: the model predicts the pixel's value v (logits [2(1-v), 2v]).
// Example i has v = i % 2 and is labelled correctly when i % 3 == 0.
struct TestSplit {
  torch::Tensor images, labels;
};
TestSplit MakeSplit(int64_t n) {
  torch::Tensor v = torch::arange(n, torch::kLong).remainder(2);
  torch::Tensor right = torch::arange(n, torch::kLong).remainder(3).eq(0);
  return {v.to(torch::kFloat32).reshape({n, 1, 1, 1}), torch::where(right, v, 1 - v)};
}

testing::FakeModel PixelModel() {
  testing::FakeModel m;
  m.forward = [](const torch::Tensor& x) {
    torch::Tensor v = x.reshape({x.size(0)});
    return torch::stack({2 * (1 - v), 2 * v}, 1);
  };
  return m;
}

// Closed form: a right example costs log(1 + e^-2), a wrong one log(1 + e^2).
EvalResult Expected(int64_t n) {
  if (n == 0) return {};
  int64_t right = 0;
  for (int64_t i = 0; i < n; ++i) right += i % 3 == 0;
  const double loss = right * std::log1p(std::exp(-2.0)) + (n - right) * std::log1p(std::exp(2.0));
  return {static_cast<double>(right) / n, loss / n};
}

TEST(EvaluationTest, EveryRankGetsTheWholeSplitsAccuracyAndLoss) {
  // Splits smaller than the world (ranks without examples), uneven shards, and more than
  // one chunk of 1000 per rank.
  for (int world : {1, 3}) {
    for (int64_t n : {0, 1, 2, 5, 7, 3500}) {
      const TestSplit split = MakeSplit(n);
      const EvalResult want = Expected(n);
      std::vector<EvalResult> got(world);
      testing::RunRanks<ShmProcessGroup>(
          world,
          [world](int r, KvClient& kv) {
            return ShmProcessGroup::Create(r, world, kv, ShmOptions{});
          },
          [&](int rank, ShmProcessGroup& pg) {
            testing::FakeModel model = PixelModel();
            absl::StatusOr<EvalResult> r =
                Evaluate(model, split.images, split.labels, pg, torch::Device(torch::kCPU));
            ASSERT_TRUE(r.ok()) << r.status();
            got[rank] = *r;
            EXPECT_FALSE(model.forward_saw_training);
            EXPECT_TRUE(model.training) << "the model is left in training mode";
          });
      const std::string what = absl::StrCat("world ", world, " n ", n);
      for (const EvalResult& r : got) {
        EXPECT_NEAR(r.accuracy, want.accuracy, 1e-6) << what;
        EXPECT_NEAR(r.loss, want.loss, 1e-5) << what;
        EXPECT_EQ(r.accuracy, got[0].accuracy) << what;
        EXPECT_EQ(r.loss, got[0].loss) << what;
      }
    }
  }
}

TEST(EvaluationTest, TopKCountsEveryLabelAmongTheKLargestLogitsAsABruteForceCountDoes) {
  // 10 classes, logits a fixed random permutation of distinct values per example (no ties),
  // labels random: top-k against a count over every example's sorted logits, for each k,
  // on one rank and on three (shards, a rank without examples for n = 2).
  torch::manual_seed(7);
  for (int64_t n : {0, 2, 57, 1200}) {
    torch::Tensor logits = torch::rand({n, 10}, torch::kFloat64).argsort(/*dim=*/int64_t{1}).to(torch::kFloat32);
    torch::Tensor labels = torch::randint(10, {n}, torch::kLong);
    // The "images" are the example's index; the model looks its logits up.
    torch::Tensor images = torch::arange(n, torch::kFloat32).reshape({n, 1, 1, 1});
    for (int k : {2, 5, 10}) {
      int64_t hits = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float label_logit = logits[i][labels[i].item<int64_t>()].item<float>();
        int64_t larger = 0;
        for (int64_t c = 0; c < 10; ++c) larger += logits[i][c].item<float>() > label_logit;
        hits += larger < k;
      }
      const double want = n > 0 ? static_cast<double>(hits) / n : 0;
      for (int world : {1, 3}) {
        std::vector<EvalResult> got(world);
        testing::RunRanks<ShmProcessGroup>(
            world,
            [world](int r, KvClient& kv) {
              return ShmProcessGroup::Create(r, world, kv, ShmOptions{});
            },
            [&](int rank, ShmProcessGroup& pg) {
              testing::FakeModel model;
              model.forward = [&](const torch::Tensor& x) {
                return logits.index_select(0, x.reshape({x.size(0)}).to(torch::kLong));
              };
              absl::StatusOr<EvalResult> r =
                  Evaluate(model, images, labels, pg, torch::Device(torch::kCPU), TopK(k));
              ASSERT_TRUE(r.ok()) << r.status();
              got[rank] = *r;
            });
        for (const EvalResult& r : got) {
          EXPECT_NEAR(r.top_k_accuracy, want, 1e-6) << "n " << n << " k " << k;
          EXPECT_EQ(r.top_k_accuracy, got[0].top_k_accuracy);
        }
        if (k == 10 && n > 0) {
          EXPECT_EQ(got[0].top_k_accuracy, 1.0);  // every label
        }
      }
    }
  }
  // Without top_k: not measured.
  const TestSplit split = MakeSplit(4);
  testing::RunRanks<ShmProcessGroup>(
      1, [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 1, kv, ShmOptions{}); },
      [&](int, ShmProcessGroup& pg) {
        testing::FakeModel model = PixelModel();
        absl::StatusOr<EvalResult> r =
            Evaluate(model, split.images, split.labels, pg, torch::Device(torch::kCPU));
        ASSERT_TRUE(r.ok());
        EXPECT_EQ(r->top_k_accuracy, -1);
      });
}

TEST(EvaluationTest, TheGroupsErrorIsReturned) {
  testing::RunRanks<ShmProcessGroup>(
      2, [](int r, KvClient& kv) { return ShmProcessGroup::Create(r, 2, kv, ShmOptions{}); },
      [&](int, ShmProcessGroup& pg) {
        pg.Abort();
        testing::FakeModel model = PixelModel();
        const TestSplit split = MakeSplit(4);
        absl::StatusOr<EvalResult> r =
            Evaluate(model, split.images, split.labels, pg, torch::Device(torch::kCPU));
        EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
      });
}

}  // namespace
}  // namespace joule::worker
