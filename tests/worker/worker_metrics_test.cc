// WorkerMetrics' per-job series: created for the bound job, removed two jobs later.
#include "worker/metrics/worker_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <memory>
#include <string>

namespace joule::worker {
namespace {

std::string Text(prometheus::Registry& r) {
  return prometheus::TextSerializer().Serialize(r.Collect());
}

TEST(WorkerMetricsTest, ProgressSeriesFollowTheBoundJobAndAreRemovedWithIt) {
  auto registry = std::make_shared<prometheus::Registry>();
  WorkerMetrics m(registry);
  m.OnProgress(1, 0.5);  // before any job: nothing to charge it to
  EXPECT_EQ(Text(*registry).find("joule_epoch{"), std::string::npos);

  m.BindJob("1", "0");
  m.OnProgress(1, -1);  // the first epoch, not evaluated yet: no accuracy series
  std::string text = Text(*registry);
  EXPECT_NE(text.find("joule_epoch{joule_job=\"1\",joule_rank=\"0\"} 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("joule_test_accuracy_ratio{"), std::string::npos) << text;
  m.OnProgress(2, 0.8125);
  text = Text(*registry);
  EXPECT_NE(text.find("joule_epoch{joule_job=\"1\",joule_rank=\"0\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("joule_test_accuracy_ratio{joule_job=\"1\",joule_rank=\"0\"} 0.8125"),
            std::string::npos)
      << text;

  m.BindJob("2", "1");  // the finished job's series stay for a last scrape
  EXPECT_NE(Text(*registry).find("joule_test_accuracy_ratio{joule_job=\"1\""), std::string::npos);
  m.BindJob("3", "1");  // then go, every family's
  text = Text(*registry);
  EXPECT_EQ(text.find("joule_job=\"1\""), std::string::npos) << text;
}

}  // namespace
}  // namespace joule::worker
