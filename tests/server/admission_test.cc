#include "server/admission.h"

#include <gtest/gtest.h>

#include "tests/testing/specs.h"

namespace joule::server {
namespace {

v1::JobSpec Mlp(int workers) { return joule::testing::SmallMlpSpec(workers); }

TEST(AdmissionTest, AValidSpecIsNormalizedAndItsNeedEstimated) {
  v1::JobSpec spec = Mlp(2);
  absl::StatusOr<ResourceEstimate> need = AdmitSpec(spec, SpecLimits{}, {"/usr/share/datasets"}, "");
  ASSERT_TRUE(need.ok()) << need.status();
  EXPECT_GT(need->parameters, 0);
  EXPECT_EQ(spec.local_batch_size(), 64);  // normalized: derived from global / workers
}

// Each class of bad submission is refused before anything is stored, naming what is wrong.
TEST(AdmissionTest, EachClassOfBadSubmissionIsRefusedWithItsReason) {
  struct Case {
    std::string what;
    std::function<void(v1::JobSpec&)> edit;
    std::string request_id;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"no workers", [](v1::JobSpec& s) { s.set_workers(0); }, "", "workers"},
      {"a dataset outside the roots", [](v1::JobSpec& s) { s.set_dataset("idx:/etc"); }, "",
       "/etc"},
      {"a request id that is not UTF-8", [](v1::JobSpec&) {}, std::string("r\xff", 2),
       "request_id"},
      {"a request id too long", [](v1::JobSpec&) {}, std::string(300, 'r'), "request_id"},
      {"data no machine holds (10 million 3x1024x1024 images: 126 TB)",
       [](v1::JobSpec& s) { s.set_dataset("synthetic:3x1024x1024:10:10000000"); }, "",
       "more than any worker can hold"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::JobSpec spec = Mlp(1);
    c.edit(spec);
    absl::StatusOr<ResourceEstimate> need =
        AdmitSpec(spec, SpecLimits{}, {"/usr/share/datasets"}, c.request_id);
    ASSERT_EQ(need.status().code(), absl::StatusCode::kInvalidArgument) << need.status();
    EXPECT_NE(need.status().message().find(c.says), std::string::npos) << need.status();
  }
}

TEST(AdmissionTest, AJobFitsTheLargestWorkerOrIsRefusedWithTheFigures) {
  v1::JobSpec cpu = Mlp(1);
  ResourceEstimate need;
  need.parameters = 1000;
  need.model_bytes = 3LL << 30;
  need.dataset_bytes = 1LL << 30;
  EXPECT_TRUE(CheckFits(cpu, need, 0, 0).ok());           // nothing reported: not refused
  EXPECT_TRUE(CheckFits(cpu, need, 4LL << 30, 0).ok());   // exactly fits
  absl::Status s = CheckFits(cpu, need, (4LL << 30) - 1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("4.0 GiB of memory per worker"), std::string::npos) << s;
  // A GPU job: the model on the device, the data on the host.
  v1::JobSpec gpu = cpu;
  gpu.set_device_kind(v1::DEVICE_KIND_GPU);
  EXPECT_TRUE(CheckFits(gpu, need, 1LL << 30, 3LL << 30).ok());
  s = CheckFits(gpu, need, 1LL << 30, 2LL << 30);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("GPU memory"), std::string::npos) << s;
  s = CheckFits(gpu, need, (1LL << 30) - 1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(AdmissionTest, CapacityWarningSaysHowManyAreMissing) {
  EXPECT_EQ(CapacityWarning(Mlp(2), 2), "");
  EXPECT_EQ(CapacityWarning(Mlp(2), 5), "");
  EXPECT_EQ(CapacityWarning(Mlp(3), 0),
            "the job needs 3 cpu workers and none is registered: it waits until enough join");
  EXPECT_EQ(CapacityWarning(Mlp(3), 1),
            "the job needs 3 cpu workers and only 1 is registered: it waits until enough join");
  EXPECT_EQ(CapacityWarning(Mlp(3), 2),
            "the job needs 3 cpu workers and only 2 are registered: it waits until enough join");
}

}  // namespace
}  // namespace joule::server
