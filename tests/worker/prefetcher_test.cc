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
    absl::StatusOr<BatchPrefetcher::Batch> batch = p.Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    auto [x, y] = *batch;
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
  EXPECT_EQ(p.Next()->second[0].item<int64_t>(), 3);
}

TEST(BatchPrefetcherTest, AFailedGatherIsAnErrorOnNext) {
  torch::Tensor images = torch::arange(10, torch::kFloat32);
  torch::Tensor labels = torch::arange(10, torch::kLong);
  BatchPrefetcher p(images, labels);
  p.Submit({42});  // out of range
  absl::StatusOr<BatchPrefetcher::Batch> failed = p.Next();
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(failed.status().message().find("gathering a batch: "), std::string::npos);
  p.Submit({4});
  EXPECT_EQ(p.Next()->second[0].item<int64_t>(), 4);  // and it goes on
}

TEST(BatchPrefetcherTest, AGatherGetsItsTagAndItsErrorsReachNext) {
  BatchPrefetcher p([](const std::vector<int64_t>& indices,
                       int64_t tag) -> absl::StatusOr<BatchPrefetcher::Batch> {
    if (tag < 0) return absl::DataLossError("corrupt");
    return BatchPrefetcher::Batch{torch::full({1}, static_cast<float>(tag)),
                                  torch::tensor(indices)};
  });
  p.Submit({5}, 7);
  p.Submit({6}, -1);
  p.Submit({8}, 9);
  absl::StatusOr<BatchPrefetcher::Batch> a = p.Next();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first.item<float>(), 7.0f);
  EXPECT_EQ(a->second[0].item<int64_t>(), 5);
  EXPECT_EQ(p.Next().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(p.Next()->first.item<float>(), 9.0f);
}

}  // namespace
}  // namespace joule::worker
