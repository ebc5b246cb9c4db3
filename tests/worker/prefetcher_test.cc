#include "worker/data/prefetcher.h"

#include <gtest/gtest.h>

namespace joule::worker {
namespace {

TEST(BatchPrefetcherTest, ServesBatchesInSubmissionOrder) {
  torch::Tensor images = torch::arange(100, torch::kFloat32).reshape({50, 2});
  torch::Tensor labels = torch::arange(50, torch::kLong);
  BatchPrefetcher p(images, labels);
  for (int b = 0; b < 10; ++b) p.Submit({b, 49 - b, 7});
  for (int b = 0; b < 10; ++b) {
    auto [x, y] = p.Next();
    ASSERT_EQ(x.sizes(), (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(y[0].item<int64_t>(), b);
    EXPECT_EQ(y[1].item<int64_t>(), 49 - b);
    EXPECT_EQ(x[1][1].item<float>(), 2.0f * (49 - b) + 1);
    EXPECT_EQ(y[2].item<int64_t>(), 7);
  }
}

TEST(BatchPrefetcherTest, ClearDropsWhatIsQueued) {
  torch::Tensor images = torch::arange(10, torch::kFloat32);
  torch::Tensor labels = torch::arange(10, torch::kLong);
  BatchPrefetcher p(images, labels);
  p.Submit({1});
  p.Submit({2});
  p.Clear();
  p.Submit({3});
  EXPECT_EQ(p.Next().second[0].item<int64_t>(), 3);
}

TEST(BatchPrefetcherTest, AFailedGatherIsAnErrorOnNext) {
  torch::Tensor images = torch::arange(10, torch::kFloat32);
  torch::Tensor labels = torch::arange(10, torch::kLong);
  BatchPrefetcher p(images, labels);
  p.Submit({42});  // out of range
  EXPECT_THROW(p.Next(), std::runtime_error);
  p.Submit({4});
  EXPECT_EQ(p.Next().second[0].item<int64_t>(), 4);  // and it goes on
}

}  // namespace
}  // namespace joule::worker
