#include "server/worker_registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "server/http_sd.h"
#include "tests/testing/fake_session_sink.h"

namespace joule::server {
namespace {

using std::chrono::milliseconds;
using TimePoint = WorkerRegistry::TimePoint;

const TimePoint kT0 = TimePoint(std::chrono::hours(1));

v1::RegisterWorkerRequest Request(const std::string& host, v1::DeviceKind kind = v1::DEVICE_KIND_CPU) {
  v1::RegisterWorkerRequest r;
  r.set_host(host);
  r.set_device_kind(kind);
  r.set_metrics_address("127.0.0.1:9100");
  return r;
}

TEST(WorkerRegistryTest, RegistersThenOpensOneSession) {
  WorkerRegistry reg("b00t");
  auto id = reg.Register(Request("a"), kT0, 1000);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "w1.b00t");
  EXPECT_EQ(reg.Find(*id)->info.state(), v1::WORKER_STATE_REGISTERED);
  EXPECT_TRUE(reg.Slots().empty());  // no session, nothing to schedule on
  auto sink = std::make_shared<testing::FakeSessionSink>();
  ASSERT_TRUE(reg.OpenSession(*id, sink, kT0).ok());
  EXPECT_EQ(reg.OpenSession(*id, sink, kT0).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.OpenSession("w9.b00t", sink, kT0).code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(reg.Slots().size(), 1u);
  EXPECT_TRUE(reg.Slots()[0].idle);
  EXPECT_EQ(reg.CountOfKind(v1::DEVICE_KIND_CPU), std::make_pair(1, 1));
  EXPECT_EQ(reg.CountOfKind(v1::DEVICE_KIND_GPU), std::make_pair(0, 0));
}

TEST(WorkerRegistryTest, SilenceExpiresExactlyPastTheTimeout) {
  WorkerRegistry reg("b00t");
  std::string a = *reg.Register(Request("a"), kT0, 0);
  std::string b = *reg.Register(Request("b"), kT0, 0);
  const milliseconds timeout(10000), stop(90000);
  WorkerRegistry::Touch(*reg.Find(b), kT0 + milliseconds(5000), 5000);
  EXPECT_TRUE(reg.Expired(kT0 + timeout, timeout, stop).empty());  // not past it yet
  auto lost = reg.Expired(kT0 + timeout + milliseconds(1), timeout, stop);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].first, a);
  EXPECT_EQ(lost[0].second, "no heartbeat for more than 10000 ms");
  ASSERT_TRUE(reg.Remove(a).has_value());
  EXPECT_FALSE(reg.Remove(a).has_value());
  EXPECT_EQ(reg.Expired(kT0 + milliseconds(15001), timeout, stop)[0].first, b);
}

TEST(WorkerRegistryTest, AWorkerBusyPastItsStopDeadlineExpires) {
  WorkerRegistry reg("b00t");
  std::string a = *reg.Register(Request("a"), kT0, 0);
  WorkerRegistry::Worker& w = *reg.Find(a);
  WorkerRegistry::Assign(w, 7, 1, 2);
  EXPECT_TRUE(WorkerRegistry::RunsAttempt(w, 7, 2));
  EXPECT_FALSE(WorkerRegistry::RunsAttempt(w, 7, 1));
  w.stop_deadline = kT0 + milliseconds(100);
  const milliseconds timeout(10000), stop(100);
  WorkerRegistry::Touch(w, kT0 + milliseconds(200), 0);  // alive, but still busy
  auto lost = reg.Expired(kT0 + milliseconds(200), timeout, stop);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].second, "still busy 100 ms after being told to stop job 7");
  WorkerRegistry::Release(w);  // it reported in time after all
  EXPECT_TRUE(reg.Expired(kT0 + milliseconds(200), timeout, stop).empty());
  EXPECT_EQ(w.info.state(), v1::WORKER_STATE_IDLE);
}

TEST(WorkerRegistryTest, RefusesNamesNoListCouldCarry) {
  WorkerRegistry reg("b00t");
  std::string long_non_ascii;
  for (int i = 0; i < 200; ++i) long_non_ascii += "\xC3\xA9";
  for (const std::string& bad : {long_non_ascii, std::string("x\xFF"), std::string("a\tb")}) {
    EXPECT_EQ(reg.Register(Request(bad), kT0, 0).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  v1::RegisterWorkerRequest many = Request("ok");
  for (int i = 0; i < 9; ++i) many.add_energy_sources("rapl");
  EXPECT_EQ(reg.Register(many, kT0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(reg.List().empty());  // nothing refused was kept
}

// A worker's BlasInfo is kept as sent when it is well-formed, and refused with the field
// named when it is not (texts too long or not UTF-8, too many features, a thread count out
// of range); a non-finite or negative GFLOP/s becomes 0.
TEST(WorkerRegistryTest, KeepsAWellFormedBlasInfoAndRefusesEveryBadField) {
  WorkerRegistry reg("b00t");
  v1::RegisterWorkerRequest good = Request("a");
  v1::BlasInfo* b = good.mutable_blas();
  b->set_library("OpenBLAS");
  b->set_core("Prescott");
  b->set_threads(2);
  b->set_fallback(true);
  b->add_cpu_features("avx512f");
  b->set_sgemm_gflops(std::nan(""));
  absl::StatusOr<std::string> id = reg.Register(good, kT0, 1000);
  ASSERT_TRUE(id.ok()) << id.status();
  const v1::BlasInfo& kept = reg.Find(*id)->info.blas();
  EXPECT_EQ(kept.core(), "Prescott");
  EXPECT_TRUE(kept.fallback());
  EXPECT_EQ(kept.sgemm_gflops(), 0);

  using Edit = std::function<void(v1::BlasInfo&)>;
  const std::vector<std::pair<Edit, std::string>> bad = {
      {[](v1::BlasInfo& x) { x.set_config(std::string(300, 'c')); }, "blas.config"},
      {[](v1::BlasInfo& x) { x.set_core("\xff\xfe"); }, "blas.core"},
      {[](v1::BlasInfo& x) { x.set_library(std::string(33, 'l')); }, "blas.library"},
      {[](v1::BlasInfo& x) { x.set_choice(std::string(600, 'w')); }, "blas.choice"},
      {[](v1::BlasInfo& x) { x.set_cpu_model("a\nb"); }, "blas.cpu_model"},
      {[](v1::BlasInfo& x) {
         for (int i = 0; i < 33; ++i) x.add_cpu_features("f");
       },
       "blas.cpu_features has 33 entries"},
      {[](v1::BlasInfo& x) { x.set_threads(-1); }, "blas.threads -1"},
      {[](v1::BlasInfo& x) { x.set_threads(1 << 20); }, "blas.threads"},
  };
  for (const auto& [edit, want] : bad) {
    v1::RegisterWorkerRequest r = Request("b");
    edit(*r.mutable_blas());
    absl::StatusOr<std::string> refused = reg.Register(r, kT0, 1000);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_NE(std::string(refused.status().message()).find(want), std::string::npos)
        << refused.status();
  }
}

TEST(WorkerRegistryTest, ReportsTheLargestMemoryOfAKind) {
  WorkerRegistry reg("b00t");
  for (int64_t gib : {4, 16, 8}) {
    v1::RegisterWorkerRequest r = Request("h");
    r.set_memory_bytes(gib << 30);
    ASSERT_TRUE(reg.Register(r, kT0, 0).ok());
  }
  v1::RegisterWorkerRequest gpu = Request("g", v1::DEVICE_KIND_GPU);
  gpu.set_memory_bytes(int64_t{64} << 30);
  gpu.set_device_memory_bytes(int64_t{141} << 30);
  ASSERT_TRUE(reg.Register(gpu, kT0, 0).ok());
  EXPECT_EQ(reg.LargestMemory(v1::DEVICE_KIND_CPU), std::make_pair(int64_t{16} << 30, int64_t{0}));
  EXPECT_EQ(reg.LargestMemory(v1::DEVICE_KIND_GPU).second, int64_t{141} << 30);
}

TEST(HttpSdTest, OneTargetGroupPerWorkerWithItsJobInMetaLabels) {
  WorkerRegistry reg("b00t");
  std::string a = *reg.Register(Request("host-a"), kT0, 0);
  std::string b = *reg.Register(Request("host-b"), kT0, 0);
  ASSERT_TRUE(reg.OpenSession(a, std::make_shared<testing::FakeSessionSink>(), kT0).ok());
  EXPECT_TRUE(reg.ScrapeTargets().size() == 1);  // b has no session yet
  ASSERT_TRUE(reg.OpenSession(b, std::make_shared<testing::FakeSessionSink>(), kT0).ok());
  WorkerRegistry::Assign(*reg.Find(b), 42, 3, 1);
  const std::string json = HttpSdJson(reg.ScrapeTargets());
  EXPECT_NE(json.find("\"joule_host\":\"host-a\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"__meta_joule_job\":\"42\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"__meta_joule_rank\":\"3\""), std::string::npos) << json;
  // A name that is not UTF-8 never makes it throw (registration refuses them anyway).
  v1::WorkerInfo odd;
  odd.set_host("bad\xFF");
  EXPECT_NO_THROW(HttpSdJson({odd}));
}

}  // namespace
}  // namespace joule::server
