// Whole-node power from a BMC: the Redfish reader against a Redfish service of the test's
// own (cpp-httplib on loopback, serving the DMTF schema's fields), the trapezoid poller,
// and the meter's node share beside the components.
#include "worker/energy/node_power.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "tests/testing/fake_bmc.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_cpu_times.h"
#include "tests/testing/scratch_dir.h"
#include "worker/energy/energy_meter.h"

namespace joule::worker {
namespace {

using testing::EnvironmentBody;
using testing::FakeBmc;
using testing::FakeClock;
using testing::FakeCpuTimes;
using testing::kChassis;
using testing::PowerBody;
using testing::ScratchDir;

RedfishOptions Options(const FakeBmc& bmc) {
  RedfishOptions o;
  o.url = bmc.url();
  o.timeout = std::chrono::milliseconds(500);
  return o;
}

TEST(RedfishTest, ReadsTheNewerEnvironmentMetricsOfTheFirstChassis) {
  FakeBmc bmc;
  bmc.Serve("/redfish/v1/Chassis", kChassis);
  bmc.Serve("/redfish/v1/Chassis/1U/EnvironmentMetrics", EnvironmentBody("412.5"));
  bmc.Serve("/redfish/v1/Chassis/1U/Power", PowerBody("999"));
  auto r = OpenRedfish(Options(bmc));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->Describe(), "redfish " + bmc.url() + "/redfish/v1/Chassis/1U/EnvironmentMetrics");
  EXPECT_DOUBLE_EQ(*(*r)->ReadWatts(), 412.5);
  bmc.Serve("/redfish/v1/Chassis/1U/EnvironmentMetrics", EnvironmentBody("420"));
  EXPECT_DOUBLE_EQ(*(*r)->ReadWatts(), 420.0);
}

TEST(RedfishTest, FallsBackToTheDeprecatedPowerResourceAndTakesAChassisById) {
  FakeBmc bmc;
  bmc.Serve("/redfish/v1/Chassis", kChassis);
  bmc.Serve("/redfish/v1/Chassis/2/Power", PowerBody("250"));  // no EnvironmentMetrics: 404
  RedfishOptions o = Options(bmc);
  o.chassis = "2";
  auto r = OpenRedfish(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->Describe(), "redfish " + bmc.url() + "/redfish/v1/Chassis/2/Power");
  EXPECT_DOUBLE_EQ(*(*r)->ReadWatts(), 250.0);
  // An EnvironmentMetrics without a reading also falls back.
  bmc.Serve("/redfish/v1/Chassis/2/EnvironmentMetrics", R"({"TemperatureCelsius": {}})");
  auto again = OpenRedfish(o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE((*again)->Describe().find("/Power"), std::string::npos);
}

// Every answer that holds no reading is a one-line error; at Open the BMC is refused, in
// a running reader the reading fails and the next one may succeed.
TEST(RedfishTest, AnswersWithoutAReadingAreOneLineErrors) {
  FakeBmc bmc;
  bmc.Serve("/redfish/v1/Chassis", kChassis);
  bmc.Serve("/redfish/v1/Chassis/1U/Power", PowerBody("300"));
  auto r = OpenRedfish(Options(bmc));
  ASSERT_TRUE(r.ok()) << r.status();
  struct Case {
    std::string body;
    int status;
    absl::StatusCode code;
  };
  for (const Case& c :
       {Case{"not json at all", 200, absl::StatusCode::kDataLoss},
        Case{"{\"PowerControl\": [{\"PowerConsumedWatts\": null}]}", 200,
             absl::StatusCode::kDataLoss},
        Case{PowerBody("\"300 W\""), 200, absl::StatusCode::kDataLoss},
        Case{PowerBody("-5"), 200, absl::StatusCode::kDataLoss},
        Case{PowerBody("1e300"), 200, absl::StatusCode::kDataLoss},
        Case{"{\"PowerControl\": []}", 200, absl::StatusCode::kDataLoss},
        Case{"{\"PowerControl\": {\"0\": 1}}", 200, absl::StatusCode::kDataLoss},
        Case{"[1, 2, 3]", 200, absl::StatusCode::kDataLoss},
        Case{"{\"a\": \"\xff\xfe\"}", 200, absl::StatusCode::kDataLoss},
        Case{std::string(kMaxRedfishBodyBytes + 10, ' '), 200, absl::StatusCode::kDataLoss},
        Case{"", 500, absl::StatusCode::kNotFound},
        Case{"", 403, absl::StatusCode::kPermissionDenied}}) {
    bmc.Serve("/redfish/v1/Chassis/1U/Power", c.body, c.status);
    absl::StatusOr<double> w = (*r)->ReadWatts();
    ASSERT_FALSE(w.ok()) << c.body.substr(0, 80);
    EXPECT_EQ(w.status().code(), c.code) << w.status();
    EXPECT_EQ(std::string(w.status().message()).find('\n'), std::string::npos) << w.status();
  }
  bmc.Serve("/redfish/v1/Chassis/1U/Power", PowerBody("310"));
  EXPECT_DOUBLE_EQ(*(*r)->ReadWatts(), 310.0);

  // At Open: no chassis, a member that is not a path.
  bmc.Serve("/redfish/v1/Chassis", R"({"Members": []})");
  EXPECT_EQ(OpenRedfish(Options(bmc)).status().code(), absl::StatusCode::kDataLoss);
  bmc.Serve("/redfish/v1/Chassis", R"({"Members": [{"@odata.id": "http://elsewhere/x"}]})");
  EXPECT_EQ(OpenRedfish(Options(bmc)).status().code(), absl::StatusCode::kDataLoss);
}

// A BMC that accepts and never answers (or answers too slowly) fails the reading within
// the timeout; so does one that is not there.
TEST(RedfishTest, ABmcThatStallsFailsWithinTheTimeout) {
  FakeBmc bmc;
  bmc.Serve("/redfish/v1/Chassis", kChassis);
  bmc.Serve("/redfish/v1/Chassis/1U/Power", PowerBody("300"));
  auto r = OpenRedfish(Options(bmc));
  ASSERT_TRUE(r.ok()) << r.status();
  std::atomic<bool> release{false};
  bmc.Stall([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<double> w = (*r)->ReadWatts();
  const auto took = std::chrono::steady_clock::now() - start;
  release = true;
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable) << w.status();
  EXPECT_LT(took, std::chrono::seconds(3));
  bmc.Stall(nullptr);

  RedfishOptions gone;
  gone.url = "http://127.0.0.1:1";  // nothing listens on port 1
  gone.timeout = std::chrono::milliseconds(300);
  EXPECT_EQ(OpenRedfish(gone).status().code(), absl::StatusCode::kUnavailable);
}

TEST(RedfishTest, CredentialsComeFromAFileAndNeverShowInAnError) {
  ScratchDir dir("redfish_credentials");
  FakeBmc bmc;
  bmc.Serve("/redfish/v1/Chassis", kChassis);
  bmc.Serve("/redfish/v1/Chassis/1U/Power", PowerBody("300"));
  // "Basic " + base64("joule:s3cret-bmc-77")
  bmc.RequireAuthorization("Basic am91bGU6czNjcmV0LWJtYy03Nw==");
  RedfishOptions o = Options(bmc);
  EXPECT_EQ(OpenRedfish(o).status().code(), absl::StatusCode::kPermissionDenied);
  o.credentials_file = (dir / "bmc").string();
  std::ofstream(o.credentials_file) << "joule:s3cret-bmc-77\n";
  auto r = OpenRedfish(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(*(*r)->ReadWatts(), 300.0);

  std::ofstream(o.credentials_file) << "joule:wrong-s3cret-bmc-77\n";
  auto refused = OpenRedfish(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(std::string(refused.status().message()).find("s3cret"), std::string::npos);
  std::ofstream(o.credentials_file) << "no-colon-s3cret\n";
  auto malformed = OpenRedfish(o);
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(malformed.status().message()).find("s3cret"), std::string::npos);
  o.credentials_file = (dir / "absent").string();
  EXPECT_EQ(OpenRedfish(o).status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string url : {"bmc.example", "ftp://bmc", "https://bmc/redfish/v1", "http://",
                                "https://root:s3cret-url@bmc"}) {
    RedfishOptions bad;
    bad.url = url;
    const absl::Status st = OpenRedfish(bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_EQ(std::string(st.message()).find("s3cret"), std::string::npos) << st;
  }
}

// An ipmitool of the test's own: a script that prints what `ipmitool dcmi power reading`
// prints (ipmitool 1.8.19's layout), the watts from a file the test writes, and records
// its arguments and IPMI_PASSWORD.
class FakeIpmitool {
 public:
  explicit FakeIpmitool(const ScratchDir& dir) : dir_(dir.path()) {
    Watts("180");
    Script("w=$(cat '" + (dir_ / "watts").string() + R"(')
cat <<EOT

    Instantaneous power reading:                   $w Watts
    Minimum during sampling period:                 60 Watts
    Maximum during sampling period:                260 Watts
    Average power reading over sample period:      175 Watts
    IPMI timestamp:                           Thu Dec  4 18:00:00 2026
    Sampling period:                          00000005 Seconds.
    Power reading state is:                   activated

EOT)");
  }
  // The script's body after the argument and environment records.
  void Script(const std::string& body) {
    const std::filesystem::path path = dir_ / "ipmitool";
    std::ofstream(path) << "#!/bin/sh\n"
                        << "echo \"$@\" > " << (dir_ / "args").string() << "\n"
                        << "echo \"${IPMI_PASSWORD:-}${JOULE_JOIN_TOKEN:-}\" > "
                        << (dir_ / "env").string() << "\n"
                        << body << "\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }
  void Watts(const std::string& w) { std::ofstream(dir_ / "watts") << w; }
  std::string path() const { return (dir_ / "ipmitool").string(); }
  std::string Args() const { return Slurp(dir_ / "args"); }
  std::string Env() const { return Slurp(dir_ / "env"); }

 private:
  static std::string Slurp(const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::filesystem::path dir_;
};

TEST(IpmiDcmiTest, ReadsTheInstantaneousPowerOfTheLocalOrANetworkBmc) {
  ScratchDir dir("ipmi");
  FakeIpmitool tool(dir);
  IpmiOptions o;
  o.ipmitool = tool.path();
  auto r = OpenIpmiDcmi(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(*(*r)->ReadWatts(), 180.0);
  EXPECT_EQ((*r)->Describe(), "ipmi dcmi local BMC");
  EXPECT_EQ(tool.Args(), "-N 1 -R 1 dcmi power reading\n");
  tool.Watts("212");
  EXPECT_DOUBLE_EQ(*(*r)->ReadWatts(), 212.0);

  // Over the network: the user on the command line, the password only in the environment.
  o.host = "198.18.0.9";
  o.credentials_file = (dir / "creds").string();
  std::ofstream(o.credentials_file) << "admin:s3cret-ipmi-42\n";
  auto net = OpenIpmiDcmi(o);
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_EQ(tool.Args(), "-I lanplus -H 198.18.0.9 -U admin -E -N 1 -R 1 dcmi power reading\n");
  EXPECT_EQ(tool.Env(), "s3cret-ipmi-42\n");  // the worker's own secrets stay out
  setenv("JOULE_JOIN_TOKEN", "join-s3cret", 1);
  ASSERT_TRUE((*net)->ReadWatts().ok());
  EXPECT_EQ(tool.Env(), "s3cret-ipmi-42\n");
  unsetenv("JOULE_JOIN_TOKEN");
  EXPECT_EQ((*net)->Describe(), "ipmi dcmi 198.18.0.9");
  std::ofstream(o.credentials_file) << "no-colon\n";
  EXPECT_EQ(OpenIpmiDcmi(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// What a BMC without DCMI answers (OpenIPMI's ipmi_sim 2.0.33 from Debian does not
// implement DCMI: ipmitool prints this and exits 1), garbage, a deactivated reading, a
// hung ipmitool and a missing one: each a one-line error, within the timeout.
TEST(IpmiDcmiTest, FailuresAreOneLineErrorsWithinTheTimeout) {
  ScratchDir dir("ipmi_fail");
  FakeIpmitool tool(dir);
  IpmiOptions o;
  o.ipmitool = tool.path();
  o.timeout = std::chrono::milliseconds(500);
  struct Case {
    std::string body;
    absl::StatusCode code;
    std::string expect;
  };
  for (const Case& c :
       {Case{"echo '    DCMI request failed because: Invalid command (c1)'; exit 1",
             absl::StatusCode::kUnavailable, "Invalid command (c1)"},
        Case{"echo 'hello'; echo 'world'", absl::StatusCode::kDataLoss, "no \"Instantaneous"},
        Case{"echo '    Instantaneous power reading:    lots Watts'", absl::StatusCode::kDataLoss,
             "no \"Instantaneous"},
        Case{"printf '    Instantaneous power reading:   0 Watts\\n    Power reading state is:   "
             "deactivated\\n'",
             absl::StatusCode::kDataLoss, "deactivated"},
        Case{"exec sleep 30", absl::StatusCode::kUnavailable, "no answer within 500 ms"},
        // Closes its output and lives on; and a wrapper whose child holds the output.
        Case{"exec >&- 2>&-; sleep 30", absl::StatusCode::kUnavailable, "no answer within"},
        Case{"sleep 30", absl::StatusCode::kUnavailable, "no answer within"}}) {
    tool.Script(c.body);
    const auto start = std::chrono::steady_clock::now();
    auto r = OpenIpmiDcmi(o);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3)) << c.body;
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    const std::string m(r.status().message());
    EXPECT_NE(m.find(c.expect), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  o.ipmitool = (dir / "no-such-ipmitool").string();
  EXPECT_EQ(OpenIpmiDcmi(o).status().code(), absl::StatusCode::kUnavailable);
}

// Readings the test gives, one per Poll.
class ListReader final : public NodePowerReader {
 public:
  absl::StatusOr<double> ReadWatts() override {
    if (next.empty()) return absl::UnavailableError("no reading");
    const double w = next.front();
    next.erase(next.begin());
    if (w < 0) return absl::UnavailableError("BMC timed out");
    return w;
  }
  std::string Describe() const override { return "list"; }
  std::vector<double> next;  // a negative value: a failed reading
};

TEST(NodeEnergyPollerTest, IntegratesWithTheTrapezoidRuleAndSkipsFailures) {
  FakeClock clock;
  auto reader = std::make_unique<ListReader>();
  reader->next = {100, 200, -1, 300, -1, -1, -1, -1, -1, -1, -1, 400};
  NodeEnergyPoller poller(std::move(reader), &clock, std::chrono::milliseconds(0),
                          std::chrono::seconds(5));
  poller.Start();  // 100 W now (no thread: period 0)
  clock.Advance(1.0);
  poller.Poll();  // 200 W: (100 + 200) / 2 x 1 s
  EXPECT_DOUBLE_EQ(poller.totals().joules, 150.0);
  clock.Advance(1.0);
  poller.Poll();  // failed: nothing yet
  EXPECT_EQ(poller.totals().failures, 1);
  EXPECT_FALSE(poller.totals().last_error.empty());
  clock.Advance(1.0);
  poller.Poll();  // 300 W, 2 s after the last good one: (200 + 300) / 2 x 2 s
  EXPECT_DOUBLE_EQ(poller.totals().joules, 650.0);
  EXPECT_TRUE(poller.totals().last_error.empty());
  for (int i = 0; i < 7; ++i) {  // 7 s without a reading: more than the 5 s max gap
    clock.Advance(1.0);
    poller.Poll();
  }
  clock.Advance(1.0);
  poller.Poll();  // 400 W after 8 s: not integrated
  EXPECT_DOUBLE_EQ(poller.totals().joules, 650.0);
  EXPECT_DOUBLE_EQ(poller.totals().lost_seconds, 8.0);
  EXPECT_DOUBLE_EQ(poller.totals().watts, 400.0);
  EXPECT_EQ(poller.totals().readings, 4);
}

// The poller's thread reads the BMC at its period (>= 1 Hz) until stopped.
TEST(NodeEnergyPollerTest, ItsThreadPollsTheBmcAtItsPeriod) {
  FakeBmc bmc;
  bmc.Serve("/redfish/v1/Chassis", kChassis);
  bmc.Serve("/redfish/v1/Chassis/1U/Power", PowerBody("300"));
  auto r = OpenRedfish(Options(bmc));
  ASSERT_TRUE(r.ok()) << r.status();
  SystemClock clock;
  NodeEnergyPoller poller(*std::move(r), &clock, std::chrono::milliseconds(20),
                          std::chrono::seconds(1));
  poller.Start();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (poller.totals().readings < 5 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  poller.Stop();
  const NodeEnergyPoller::Totals t = poller.totals();
  EXPECT_GE(t.readings, 5);
  EXPECT_GT(t.joules, 0.0);
  EXPECT_DOUBLE_EQ(t.watts, 300.0);
}

// Three workers of one host share one BMC: one polls it, the others read its state file
// and see the same total; when the poller's process goes (its lock released), another
// takes over and the total goes on growing from where it was.
TEST(NodeEnergyPollerTest, TheWorkersOfAHostPollTheBmcOnceAndOneTakesOver) {
  ScratchDir dir("node_shared");
  FakeBmc bmc;
  testing::ServeChassisPower(bmc, "300");
  SystemClock clock;
  std::vector<std::unique_ptr<NodeEnergyPoller>> pollers;
  for (int i = 0; i < 3; ++i) {
    auto r = OpenRedfish(Options(bmc));
    ASSERT_TRUE(r.ok()) << r.status();
    pollers.push_back(std::make_unique<NodeEnergyPoller>(
        *std::move(r), &clock, std::chrono::milliseconds(0), std::chrono::seconds(5)));
    ASSERT_TRUE(pollers.back()->SetShared((dir / "shared").string()).ok());
  }
  const int opened = bmc.requests();  // each OpenRedfish read the BMC
  for (int round = 0; round < 5; ++round) {
    for (auto& p : pollers) p->Poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  int polling = 0;
  for (auto& p : pollers) polling += p->polling() ? 1 : 0;
  EXPECT_EQ(polling, 1);
  EXPECT_EQ(bmc.requests() - opened, 5) << "one reading a round, not one a worker";
  const double total = pollers[0]->totals().joules;
  EXPECT_GT(total, 0.0);
  for (auto& p : pollers) EXPECT_DOUBLE_EQ(p->totals().joules, total);

  // The poller's process ends: the next to try takes the lock and goes on from the total.
  size_t leader = 0;
  for (size_t i = 0; i < pollers.size(); ++i) {
    if (pollers[i]->polling()) leader = i;
  }
  pollers.erase(pollers.begin() + static_cast<long>(leader));
  for (int round = 0; round < 4; ++round) {
    for (auto& p : pollers) p->Poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  polling = 0;
  for (auto& p : pollers) polling += p->polling() ? 1 : 0;
  EXPECT_EQ(polling, 1);
  for (auto& p : pollers) {
    EXPECT_GT(p->totals().joules, total) << "the total goes on from where it was";
    EXPECT_DOUBLE_EQ(p->totals().joules, pollers[0]->totals().joules);
  }
  // A state file garbled by hand (or half written by a crash) is skipped by a reader: no
  // jump, and counting goes on once the poller writes it again.
  for (const auto& e : std::filesystem::directory_iterator(dir / "shared")) {
    if (e.path().extension() == ".state") std::ofstream(e.path()) << "garbage -1 x\n";
  }
  const double before = pollers[0]->totals().joules;
  for (auto& p : pollers) {
    if (!p->polling()) p->Poll();
  }
  for (auto& p : pollers) EXPECT_NEAR(p->totals().joules, before, 1e-9);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (auto& p : pollers) {
    if (p->polling()) p->Poll();  // the poller first, so the reader sees this round
  }
  for (auto& p : pollers) {
    if (!p->polling()) p->Poll();
  }
  EXPECT_GT(pollers[0]->totals().joules, before);
  EXPECT_DOUBLE_EQ(pollers[0]->totals().joules, pollers[1]->totals().joules);
}

// One channel the test sets: `next` joules each read. A CPU package is shared by the
// host's processes; a GPU is this worker's own.
class OneChannelSource final : public PowerSource {
 public:
  OneChannelSource(const char* device, const char* source, bool shared) {
    channels_.push_back({device, source, shared, "", ""});
  }
  const std::vector<EnergyChannel>& channels() const override { return channels_; }
  absl::Status Read(Clock::TimePoint, std::vector<double>* joules) override {
    joules->assign(1, next);
    return absl::OkStatus();
  }
  double next = 0;

 private:
  std::vector<EnergyChannel> channels_;
};
std::unique_ptr<OneChannelSource> PackageSource() {
  return std::make_unique<OneChannelSource>("cpu-package-0", "rapl", true);
}
std::unique_ptr<OneChannelSource> GpuSource() {
  return std::make_unique<OneChannelSource>("gpu-0", "nvml", false);
}

// The meter charges a worker its share of the node's energy (here by component energy:
// half the package, its share, over the whole package), beside its component energy over
// the same intervals, and never adds the node to the components' total.
TEST(NodeEnergyPollerTest, TheMeterChargesTheNodesShareBesideTheComponents) {
  FakeClock clock;
  FakeCpuTimes cpu;
  PhaseClock phases(&clock);
  auto reader = std::make_unique<ListReader>();
  reader->next = {500, 500, 500, 500};
  auto node = std::make_shared<NodeEnergyPoller>(
      std::move(reader), &clock, std::chrono::milliseconds(0), std::chrono::seconds(5));
  node->Start();
  auto package = PackageSource();
  OneChannelSource* p = package.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(package));
  EnergyMeter meter(std::move(sources), &phases, &cpu, &clock);
  meter.SetNode(node);
  double listened = 0;
  meter.SetListener([&](const EnergySample& s) { listened += s.node_joules; });
  meter.BeginJob("5", "0");
  // The meter samples every 100 ms, the BMC is read every second (the defaults).
  for (int i = 1; i <= 30; ++i) {
    clock.Advance(0.1);
    cpu.process += 0.05;  // half of the node's busy CPU time is this worker's
    cpu.system_busy += 0.1;
    p->next = 20;                   // the package: 200 W, this worker charged half
    if (i % 10 == 0) node->Poll();  // the node: 500 W
    meter.Sample();
  }
  p->next = 0;  // nothing more before the job's end
  JobEnergy e = meter.EndJob();
  EXPECT_NEAR(e.total_joules, 30 * 10.0, 1e-9);           // components only
  EXPECT_NEAR(e.node_joules, 3 * 250.0, 1e-9);            // half of 3 x 500 J
  EXPECT_NEAR(e.node_component_joules, 30 * 10.0, 1e-9);  // every metered interval's
  EXPECT_NEAR(listened, e.node_joules, 1e-9);
  EXPECT_EQ(e.node_source, "list");
  EXPECT_EQ(e.node_split, kNodeSplitComponents);
}

// Two GPU workers of one host: each is charged the node by its component energy (its GPU
// whole, its share of the package) over the host's (the package whole, both GPUs: the
// other's from the file it publishes), not by CPU time, which would give the GPU worker
// whose CPU idles almost nothing. A neighbour that leaves counts no more; a host that
// measures nothing (estimates only) is split by CPU time.
TEST(NodeEnergyPollerTest, TheNodeIsSplitByTheHostsComponentEnergy) {
  ScratchDir dir("node_split");
  FakeClock clock;
  FakeCpuTimes cpu;
  PhaseClock phases(&clock);
  auto reader = std::make_unique<ListReader>();
  reader->next = std::vector<double>(8, 1000);
  auto node = std::make_shared<NodeEnergyPoller>(
      std::move(reader), &clock, std::chrono::milliseconds(0), std::chrono::seconds(5));
  ASSERT_TRUE(node->SetShared((dir / "shared").string()).ok());
  // The other worker of the host (another process: the file it would publish).
  const std::filesystem::path shared = dir / "shared";
  std::filesystem::path neighbour_file;
  double neighbour_gpu = 0;
  const auto publish = [&] { std::ofstream(neighbour_file) << neighbour_gpu << "\n"; };
  node->Start();

  auto package = PackageSource();
  auto gpu = GpuSource();
  OneChannelSource* p = package.get();
  OneChannelSource* g = gpu.get();
  std::vector<std::unique_ptr<PowerSource>> sources;
  sources.push_back(std::move(package));
  sources.push_back(std::move(gpu));
  EnergyMeter meter(std::move(sources), &phases, &cpu, &clock);
  meter.SetNode(node);  // publishes this worker's file: the neighbour's is named alike
  for (const auto& entry : std::filesystem::directory_iterator(shared)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".devices.") != std::string::npos) {
      neighbour_file = shared / (name.substr(0, name.rfind('.') + 1) + "00000000000000ff");
    }
  }
  ASSERT_FALSE(neighbour_file.empty()) << "this worker published nothing";
  publish();
  node->ExchangeDeviceJoules(0);  // the neighbour's first sight: counted from here
  meter.BeginJob("7", "0");
  const auto run_second = [&](double neighbour_gpu_joules) {
    for (int i = 1; i <= 10; ++i) {
      clock.Advance(0.1);
      cpu.process += 0.01;  // a tenth of the host's busy CPU time is this worker's
      cpu.system_busy += 0.1;
      p->next = 10;  // the package: 100 W, this worker charged a tenth
      g->next = 30;  // its GPU: 300 W
      if (neighbour_gpu_joules > 0) {
        neighbour_gpu += neighbour_gpu_joules;  // the other's GPU
        publish();
      }
      if (i == 10) node->Poll();  // the node: 1000 W
      meter.Sample();
    }
  };
  run_second(30);
  JobEnergy e = meter.JobTotals();
  // Own: 1 + 30 J a sample; the host's: 10 + 30 + 30: 31/70 of the node's 1000 J.
  EXPECT_NEAR(e.node_joules, 1000.0 * 31 / 70, 1e-6);
  EXPECT_EQ(e.node_split, kNodeSplitComponents);

  // The neighbour exits (its file goes with it): this worker's share of the host grows.
  std::filesystem::remove(neighbour_file);
  run_second(0);
  e = meter.JobTotals();
  EXPECT_NEAR(e.node_joules, 1000.0 * 31 / 70 + 1000.0 * 31 / 40, 1e-6);
  EXPECT_EQ(e.node_split, kNodeSplitComponents);

  // Only estimates on the host: its share of the busy CPU time (a tenth), and the report
  // says both splits happened.
  p->next = 0;
  g->next = 0;
  for (int i = 1; i <= 10; ++i) {
    clock.Advance(0.1);
    cpu.process += 0.01;
    cpu.system_busy += 0.1;
    p->next = 0;
    g->next = 0;
    if (i == 10) node->Poll();
    meter.Sample();
  }
  e = meter.EndJob();
  EXPECT_NEAR(e.node_joules, 1000.0 * 31 / 70 + 1000.0 * 31 / 40 + 100.0, 1e-6);
  EXPECT_EQ(e.node_split, kNodeSplitMixed);
}

// What one worker reads of the others' published device energy: only well-formed files of
// this BMC's key published within the last minute, counted from their first sight; files
// an hour old are removed; nothing when the poller is not shared.
TEST(NodeEnergyPollerTest, TheDeviceEnergyExchangeTakesOnlyFreshWellFormedFiles) {
  ScratchDir dir("node_exchange");
  SystemClock clock;
  NodeEnergyPoller alone(std::make_unique<ListReader>(), &clock, std::chrono::milliseconds(0),
                         std::chrono::seconds(5));
  EXPECT_EQ(alone.ExchangeDeviceJoules(5), 0.0);

  const std::string shared = (dir / "shared").string();
  NodeEnergyPoller self(std::make_unique<ListReader>(), &clock, std::chrono::milliseconds(0),
                        std::chrono::seconds(5));
  ASSERT_TRUE(self.SetShared(shared).ok());
  EXPECT_EQ(self.ExchangeDeviceJoules(1), 0.0);
  std::string prefix;  // node-KEY.devices.
  for (const auto& entry : std::filesystem::directory_iterator(shared)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".devices.") != std::string::npos) prefix = name.substr(0, name.rfind('.') + 1);
  }
  ASSERT_FALSE(prefix.empty()) << "no file published";
  const auto put = [&](const std::string& name, const std::string& text) {
    std::ofstream(std::filesystem::path(shared) / name) << text;
  };
  put(prefix + "0000000000000101", "100\n");
  put(prefix + "0000000000000102", "not a number\n");
  put(prefix + "0000000000000103", "-5\n");
  put(prefix + "0000000000000104", std::string(100, '7'));  // too long
  put(prefix + "000000000000x105", "100\n");                // not a token
  put(prefix + "105", "100\n");                             // nor this
  put("node-0000000000000000.devices.106", "100\n");        // another BMC's
  put(prefix + "0000000000000107", "100\n");
  put(prefix + "0000000000000108", "100\n");
  const auto age = [&](const std::string& name, std::chrono::minutes by) {
    const auto path = std::filesystem::path(shared) / name;
    std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) - by);
  };
  age(prefix + "0000000000000107", std::chrono::minutes(2));   // stale: not counted
  age(prefix + "0000000000000108", std::chrono::minutes(90));  // gone for long: removed
  EXPECT_EQ(self.ExchangeDeviceJoules(2), 0.0);                // first sight of 101
  EXPECT_FALSE(
      std::filesystem::exists(std::filesystem::path(shared) / (prefix + "0000000000000108")));
  put(prefix + "0000000000000101", "160\n");
  put(prefix + "0000000000000102", "1e300\n");
  put(prefix + "0000000000000107", "900\n");  // published again: fresh, counted from here
  // Files that are not a worker's of this BMC, moving: never counted.
  const auto move_ignored = [&](const char* joules) {
    for (const std::string& name : {prefix + "000000000000x105", prefix + "105",
                                    std::string("node-0000000000000000.devices.106")}) {
      put(name, joules);
    }
  };
  move_ignored("500\n");
  EXPECT_NEAR(self.ExchangeDeviceJoules(3), 60.0, 1e-9);
  put(prefix + "0000000000000101", "40\n");  // went back (rewritten): counted from here
  put(prefix + "0000000000000107", "950\n");
  move_ignored("900\n");
  EXPECT_NEAR(self.ExchangeDeviceJoules(4), 50.0, 1e-9);
  put(prefix + "0000000000000101", "45\n");
  EXPECT_NEAR(self.ExchangeDeviceJoules(5), 5.0 + 0.0, 1e-9);

  // Another worker with this one's pid (containers that share the directory are each pid
  // 1; here, the same process): its own file, seen by this one and not taken for its own.
  auto twin =
      std::make_unique<NodeEnergyPoller>(std::make_unique<ListReader>(), &clock,
                                         std::chrono::milliseconds(0), std::chrono::seconds(5));
  ASSERT_TRUE(twin->SetShared(shared).ok());
  EXPECT_NEAR(twin->ExchangeDeviceJoules(10), 0.0, 1e-9);  // it sees self's first
  EXPECT_NEAR(self.ExchangeDeviceJoules(6), 0.0, 1e-9);    // self sees twin's first
  EXPECT_NEAR(twin->ExchangeDeviceJoules(40), 1.0, 1e-9);  // self went 5 -> 6
  EXPECT_NEAR(self.ExchangeDeviceJoules(6), 30.0, 1e-9);   // twin went 10 -> 40
  const auto tokens = [&] {
    size_t files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(shared)) {
      const std::string name = entry.path().filename().string();
      files += name.rfind(prefix, 0) == 0 && name.size() == prefix.size() + 16;
    }
    return files;
  };
  const size_t with_twin = tokens();
  twin.reset();
  EXPECT_EQ(tokens(), with_twin - 1) << "the twin's file goes with it, self's stays";
}

}  // namespace
}  // namespace joule::worker
