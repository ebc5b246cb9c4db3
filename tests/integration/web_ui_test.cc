// Integration: the coordinator's web UI (joule-coordinator --web-ui) in a real browser,
// headless chromium driven by tests/testing/browse.py, against a cluster with client
// tokens: the pages load without console errors, a running job's power chart updates, a
// cancelled job shows as cancelled, the workers page names the energy source, and a
// request without a token is refused. Skips (the browser checks) without chromium.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "nlohmann/json.hpp"
#include "tests/testing/local_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/specs.h"

namespace joule {
namespace {

using testing::LocalCluster;
using testing::RunCommand;
using testing::ScratchDir;
using namespace std::chrono_literals;

constexpr char kToken[] = "s3cret-ui";

class WebUiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_ / "clients") << "alice " << kToken << "\n";
    ASSERT_NO_FATAL_FAILURE(cluster_.StartCoordinator());
    ASSERT_FALSE(cluster_.metrics_address().empty());
  }

  static testing::LocalClusterOptions Options(const ScratchDir& dir) {
    testing::LocalClusterOptions o;
    o.metrics_listen = "127.0.0.1:0";
    o.client_token = kToken;
    o.coordinator_flags = {"--client-tokens-file", (dir / "clients").string(), "--web-ui"};
    return o;
  }

  // Runs browse.py on PATH of the UI; returns its exit code, its output in *out.
  int Browse(const std::string& path, std::vector<std::string> args, std::string* out) {
    std::vector<std::string> argv = {"/usr/bin/python3",
                                     std::string(JOULE_SOURCE_DIR) + "/tests/testing/browse.py",
                                     "http://" + cluster_.metrics_address() + path};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out);
  }

  std::vector<std::string> WithToken(std::vector<std::string> args) {
    args.insert(args.begin(), {"--header", std::string("Authorization: Bearer ") + kToken});
    return args;
  }

  ScratchDir dir_{"webui"};
  LocalCluster cluster_{dir_.path(), Options(dir_)};
};

TEST_F(WebUiTest, PagesShowJobsLivePowerAndStatesAndRefuseRequestsWithoutAToken) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  v1::JobSpec spec;
  spec.set_name("ui-long");
  spec.set_model("mlp");
  spec.set_dataset("fashion-mnist");
  spec.set_workers(2);
  spec.set_global_batch_size(64);
  spec.set_epochs(50);
  spec.mutable_optimizer()->set_lr(0.05);
  const int64_t id = cluster_.Submit(spec);
  v1::Job job = cluster_.WaitFor(
      id, [](const v1::Job& j) { return j.progress().step() > 0; }, 60s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();

  std::string out;
  // The jobs page lists it running, with its energy.
  int rc =
      Browse("/ui/",
             WithToken({"--wait-js", "jouleStats.jobs >= 1", "--wait-js",
                        "document.querySelector('#jobs tbody').textContent.includes('running')",
                        "--eval-js", "document.querySelector('#jobs tbody').textContent"}),
             &out);
  if (rc == 77) GTEST_SKIP() << "no chromium: " << out;
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ui-long"), std::string::npos) << out;
  EXPECT_TRUE(out.find(" J") != std::string::npos || out.find(" kJ") != std::string::npos)
      << out;  // joules on the list
  // The job page: its power chart grows while it runs, and its log arrives.
  rc = Browse(
      "/ui/job?id=" + std::to_string(id),
      WithToken({"--timeout", "40", "--wait-js", "(window.__p = jouleStats.powerPoints) >= 2",
                 "--wait-js", "jouleStats.powerPoints > window.__p", "--wait-js",
                 "document.querySelectorAll('#power-by-rank svg path').length > 0", "--wait-js",
                 "jouleStats.logLines > 0", "--eval-js",
                 "document.getElementById('facts').textContent"}),
      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("energy so far"), std::string::npos) << out;
  // Its spec as a table of the fields that say something: no zero GA knobs on an SGD job.
  rc = Browse("/ui/job?id=" + std::to_string(id),
              WithToken({"--wait-js", "document.querySelectorAll('#spec tr').length > 3",
                         "--eval-js", "document.getElementById('spec').textContent", "--eval-js",
                         "document.getElementById('facts').textContent"}),
              &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("optimizer.lr0.05"), std::string::npos) << out;
  EXPECT_EQ(out.find("ga."), std::string::npos) << out;
  EXPECT_NE(out.find("sgd lr 0.05"), std::string::npos) << out;
  // A job that does not exist is a page that says so.
  for (const char* missing : {"999999", "x"}) {
    rc = Browse(std::string("/ui/job?id=") + missing,
                WithToken({"--expect-status", "404", "--eval-js",
                           "document.getElementById('title').textContent"}),
                &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find(missing[0] == 'x' ? "No such job" : "No job 999999"), std::string::npos)
        << out;
  }
  // Filters (issue 29): by state, text and user, on the API the jobs page reads.
  const auto api_jobs = [&](const std::string& query) {
    std::string body;
    RunCommand({"/usr/bin/curl", "-s", "--max-time", "5", "-H",
                std::string("Authorization: Bearer ") + kToken,
                "http://" + cluster_.metrics_address() + "/api/jobs?" + query},
               &body);
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    return j.is_discarded() || !j.contains("jobs") ? -1 : static_cast<int>(j["jobs"].size());
  };
  EXPECT_EQ(api_jobs("state=running"), 1);
  EXPECT_EQ(api_jobs("state=pending,succeeded"), 0);
  EXPECT_EQ(api_jobs("q=UI-LONG"), 1);
  EXPECT_EQ(api_jobs("q=nothing-like-it"), 0);
  EXPECT_EQ(api_jobs("user=someone-else"), 0);
  EXPECT_EQ(api_jobs("state=bogus"), -1);  // 400, an error
  // A cancel the page did not send: refused, the job runs on.
  const std::string cancel_url =
      "http://" + cluster_.metrics_address() + "/api/jobs/" + std::to_string(id) + "/cancel";
  const auto cancel_status = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {"/usr/bin/curl",
                                     "-s",
                                     "--max-time",
                                     "5",
                                     "-o",
                                     "/dev/null",
                                     "-w",
                                     "%{http_code}",
                                     "-H",
                                     std::string("Authorization: Bearer ") + kToken};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(cancel_url);
    std::string code;
    RunCommand(argv, &code);
    return code;
  };
  const std::string forged(32, 'c');
  EXPECT_EQ(cancel_status({}), "405");              // a GET
  EXPECT_EQ(cancel_status({"--data", ""}), "403");  // no CSRF value
  EXPECT_EQ(cancel_status({"--data", "", "-H", "X-Joule-CSRF: " + forged}), "403");  // no cookie
  EXPECT_EQ(cancel_status({"--data", "", "-H", "X-Joule-CSRF: " + forged, "-b",
                           "joule_csrf=" + forged, "-H", "Origin: http://evil.example"}),
            "403");  // cross-origin
  EXPECT_EQ(cluster_.Get(id).state(), v1::JOB_STATE_RUNNING);
  // Cancelled from the jobs page's button (its POST carries the page's CSRF value).
  rc = Browse("/ui/",
              WithToken({"--wait-js",
                         "(b => b && (b.click(), true))("
                         "document.querySelector('#jobs button.cancel'))",
                         "--wait-js", "jouleStats.cancelled === 1"}),
              &out);
  ASSERT_EQ(rc, 0) << out;
  rc = Browse("/ui/job?id=" + std::to_string(id),
              WithToken({"--wait-js", "jouleStats.state === 'cancelled'", "--wait-js",
                         "document.getElementById('title').textContent.includes('cancelled')",
                         // The stored charts, the HTML report's (common/job_charts.h), once
                         // the ranks told to stop have reported.
                         "--wait-js",
                         "document.querySelectorAll('#power-by-rank svg path').length > 0 && "
                         "document.querySelectorAll('#energy-by-phase svg').length > 0",
                         "--eval-js", "document.getElementById('facts').textContent"}),
              &out);
  EXPECT_EQ(rc, 0) << out;
  // The targets' ladder, each with its metric and direction (JobResult.to_accuracy).
  EXPECT_NE(out.find("to test_accuracy >= 0.9"), std::string::npos) << out;
  // The workers page names each worker's energy source.
  rc = Browse("/ui/workers",
              WithToken({"--wait-js", "jouleStats.workers === 2", "--eval-js",
                         "document.querySelector('#workers tbody').textContent"}),
              &out);
  EXPECT_EQ(rc, 0) << out;
  // Whichever this machine gives (powercap, the perf PMU, or the estimate).
  EXPECT_TRUE(out.find("estimated") != std::string::npos ||
              out.find("perf_rapl") != std::string::npos || out.find("rapl") != std::string::npos)
      << out;

  // No token, or a wrong one: refused, pages and API alike; the login page is public and
  // its cookie is accepted.
  EXPECT_EQ(Browse("/ui/", {"--expect-status", "401"}, &out), 0) << out;
  EXPECT_EQ(Browse("/ui/job?id=1",
                   {"--header", "Authorization: Bearer wrong", "--expect-status", "401"}, &out),
            0)
      << out;
  const auto status_of = [&](std::vector<std::string> headers) {
    std::vector<std::string> argv = {"/usr/bin/curl", "-s", "--max-time",  "5", "-o",
                                     "/dev/null",     "-w", "%{http_code}"};
    for (const std::string& h : headers) argv.insert(argv.end(), {"-H", h});
    argv.push_back("http://" + cluster_.metrics_address() + "/api/jobs");
    std::string code;
    RunCommand(argv, &code);
    return code;
  };
  EXPECT_EQ(status_of({}), "401");
  EXPECT_EQ(status_of({"Authorization: Bearer wrong"}), "401");
  EXPECT_EQ(status_of({std::string("Authorization: Bearer ") + kToken}), "200");
  for (const char* path : {"/api/jobs/1", "/api/jobs/1/power", "/api/jobs/1/charts",
                           "/api/jobs/1/log", "/api/workers", "/api/jobs/0", "/ui/workers"}) {
    std::string code;
    RunCommand({"/usr/bin/curl", "-s", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}",
                "http://" + cluster_.metrics_address() + path},
               &code);
    EXPECT_EQ(code, "401") << path;
  }
  // Signing in: a wrong token is refused; the right one opens a session whose cookie holds
  // a random id, not the token. The form is the server's own (issue 23): its csrf field
  // must match its cookie, and a browser's Origin must be this server.
  const std::string login = "http://" + cluster_.metrics_address() + "/ui/login";
  const std::string jar = (dir_ / "cookies.txt").string();
  const auto fresh_form = [&] {  // loads the form: its cookie into the jar, its csrf value
    std::string page;
    RunCommand({"/usr/bin/curl", "-s", "--max-time", "5", "-c", jar, login}, &page);
    const std::string field = "name=\"csrf\" value=\"";
    const size_t v = page.find(field);
    return v == std::string::npos ? std::string() : page.substr(v + field.size(), 32);
  };
  const auto post = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {"/usr/bin/curl", "-s", "--max-time", "5", "-D", "-", "-o",
                                     "/dev/null",     "-b", jar};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(login);
    std::string headers;
    RunCommand(argv, &headers);
    return headers;
  };
  std::string csrf = fresh_form();
  ASSERT_EQ(csrf.size(), 32u);
  EXPECT_NE(post({"--data-urlencode", std::string("token=") + kToken}).find(" 403"),
            std::string::npos)
      << "no csrf field";
  EXPECT_NE(post({"--data-urlencode", std::string("token=") + kToken, "--data-urlencode",
                  "csrf=" + std::string(32, 'a')})
                .find(" 403"),
            std::string::npos)
      << "a csrf field that is not the cookie's";
  EXPECT_NE(post({"--data-urlencode", std::string("token=") + kToken, "--data-urlencode",
                  "csrf=" + csrf, "-H", "Origin: http://evil.example"})
                .find(" 403"),
            std::string::npos)
      << "a cross-site post";
  std::string headers =
      post({"--data-urlencode", "token=wrong", "--data-urlencode", "csrf=" + csrf});
  EXPECT_NE(headers.find(" 401"), std::string::npos) << headers;
  csrf = fresh_form();
  headers = post({"--data-urlencode", std::string("token=") + kToken, "--data-urlencode",
                  "csrf=" + csrf, "-H", "Origin: http://" + cluster_.metrics_address()});
  ASSERT_NE(headers.find(" 303"), std::string::npos) << headers;
  const size_t at = headers.find("joule_token=");
  ASSERT_NE(at, std::string::npos) << headers;
  const std::string session = headers.substr(at + 12, 32);
  EXPECT_EQ(headers.find(kToken), std::string::npos) << "the cookie carries the token";
  EXPECT_NE(headers.find("HttpOnly"), std::string::npos) << headers;
  EXPECT_EQ(
      Browse("/ui/workers",
             {"--cookie", "joule_token=" + session, "--wait-js", "jouleStats.workers === 2"}, &out),
      0)
      << out;
  EXPECT_EQ(
      Browse("/ui/workers",
             {"--cookie", "joule_token=" + std::string(32, '0'), "--expect-status", "401"}, &out),
      0)
      << out;
  EXPECT_EQ(Browse("/ui/login", {}, &out), 0) << out;
  // Every response says nosniff; pages allow no inline script and no framing.
  RunCommand({"/usr/bin/curl", "-s", "--max-time", "5", "-D", "-", "-o", "/dev/null", login},
             &headers);
  EXPECT_NE(headers.find("X-Content-Type-Options: nosniff"), std::string::npos) << headers;
  const size_t csp = headers.find("Content-Security-Policy: ");
  ASSERT_NE(csp, std::string::npos) << headers;
  const std::string policy = headers.substr(csp, headers.find('\n', csp) - csp);
  EXPECT_EQ(policy.substr(0, policy.find("style-src")).find("unsafe-inline"), std::string::npos)
      << policy;
  EXPECT_NE(policy.find("frame-ancestors 'none'"), std::string::npos) << policy;
  std::string page;
  RunCommand({"/usr/bin/curl", "-s", "--max-time", "5", "-H",
              std::string("Authorization: Bearer ") + kToken,
              "http://" + cluster_.metrics_address() + "/ui/workers"},
             &page);
  EXPECT_EQ(page.find("<script>"), std::string::npos) << page;
  EXPECT_NE(page.find("/ui/assets/page-workers.js"), std::string::npos) << page;
}

// The pages over many jobs (issue 29): usage by user per day, the sweeps list, a sweep's
// cells and charts, two jobs compared; a job page's target rule and a pending job's "no
// data yet" charts; and the API's answers to malformed requests.
TEST_F(WebUiTest, UsageSweepAndComparePagesDrawTheirChartsAndEmptyChartsSaySo) {
  cluster_.StartWorkers(2);
  ASSERT_TRUE(cluster_.WaitIdleWorkers(2, 30s));
  std::vector<int64_t> ids;
  for (int workers : {1, 2}) {
    v1::JobSpec spec = testing::SmallMlpSpec(workers);
    spec.set_name("ui-cell-" + std::to_string(workers));
    spec.set_max_train_samples(3000);
    spec.set_max_test_samples(500);
    spec.set_epochs(2);
    spec.set_target_accuracy(0.5);
    (*spec.mutable_labels())["sweep"] = "ui-sweep";
    (*spec.mutable_labels())["cell"] = "workers=" + std::to_string(workers);
    ids.push_back(cluster_.Submit(spec));
  }
  // The first rung of a tune of two cells, as `joule tune run` submits it.
  std::vector<int64_t> tune_ids;
  for (int batch : {64, 128}) {
    v1::JobSpec spec = testing::SmallMlpSpec(1);
    spec.set_global_batch_size(batch);
    spec.set_max_train_samples(3000);
    spec.set_max_test_samples(500);
    spec.set_epochs(2);
    spec.set_keep_model(true);
    spec.set_target_accuracy(0.5);
    auto& labels = *spec.mutable_labels();
    labels["tune"] = "ui-tune";
    labels["cell"] = "global_batch_size=" + std::to_string(batch);
    labels["rung"] = "0";
    labels["tune_minimize"] = "energy_to_accuracy";
    labels["tune_epochs"] = "2";
    tune_ids.push_back(cluster_.Submit(spec));
  }
  for (int64_t id : ids) {
    const v1::Job j = cluster_.WaitFor(
        id, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_SUCCEEDED; }, 120s);
    ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.reason();
  }
  for (int64_t id : tune_ids) {
    const v1::Job j = cluster_.WaitDone(id);
    ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.reason();
  }
  // A job that can never be placed (3 workers of 2): pending, its charts not drawn yet.
  v1::JobSpec big = testing::SmallMlpSpec(3);
  big.set_name("ui-pending");
  (*big.mutable_labels())["sweep"] = "ui-waiting";
  const int64_t pending = cluster_.Submit(big);

  const auto status_of_path = [&](const std::string& path) {
    std::string code;
    RunCommand({"/usr/bin/curl", "-s", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}",
                "-H", std::string("Authorization: Bearer ") + kToken,
                "http://" + cluster_.metrics_address() + path},
               &code);
    return code;
  };
  std::string out;
  int rc = Browse(
      "/ui/usage?by=user&per=day&days=30",
      WithToken({"--wait-js", "jouleStats.usageRows === 1 && jouleStats.charts === 2", "--eval-js",
                 "document.querySelector('#usage tbody').textContent", "--eval-js",
                 "document.querySelectorAll('#energy-by-group .mark-rect path').length",
                 "--eval-js",
                 "document.querySelectorAll('#energy-over-time .mark-rect path').length"}),
      &out);
  if (rc == 77) GTEST_SKIP() << "no chromium: " << out;
  ASSERT_EQ(rc, 0) << out;
  nlohmann::json got = nlohmann::json::parse(out.substr(0, out.find('\n')), nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << out;
  const std::string table = got["document.querySelector('#usage tbody').textContent"];
  EXPECT_NE(table.find("alice"), std::string::npos) << table;
  EXPECT_NE(table.find("total"), std::string::npos) << table;
  EXPECT_EQ(got["document.querySelectorAll('#energy-by-group .mark-rect path').length"], 1) << out;
  // alice's jobs were all made today: one bar of one day.
  EXPECT_EQ(got["document.querySelectorAll('#energy-over-time .mark-rect path').length"], 1) << out;

  rc = Browse("/ui/sweeps",
              WithToken({"--wait-js", "jouleStats.sweeps === 2", "--eval-js",
                         "document.querySelector('#groups tbody').textContent"}),
              &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ui-sweep"), std::string::npos) << out;
  {
    std::string body;
    RunCommand({"/usr/bin/curl", "-s", "--max-time", "5", "-H",
                std::string("Authorization: Bearer ") + kToken,
                "http://" + cluster_.metrics_address() + "/api/sweeps"},
               &body);
    const nlohmann::json sweeps = nlohmann::json::parse(body, nullptr, false);
    ASSERT_TRUE(sweeps.contains("sweeps")) << body;
    std::map<std::string, int> unfinished;
    for (const auto& s : sweeps["sweeps"]) unfinished[s["name"]] = s["unfinished"];
    EXPECT_EQ(unfinished["ui-sweep"], 0) << body;
    EXPECT_EQ(unfinished["ui-waiting"], 1) << body;  // its job pends
  }

  rc = Browse(
      "/ui/sweep?name=ui-sweep",
      WithToken({"--wait-js", "jouleStats.cells === 2 && jouleStats.charts >= 3", "--eval-js",
                 "document.querySelector('#cells tbody').textContent", "--eval-js",
                 "[...document.querySelectorAll('#charts > div')].map(d => d.id).join()",
                 "--eval-js", "document.querySelectorAll('#jobs tbody tr').length"}),
      &out);
  ASSERT_EQ(rc, 0) << out;
  got = nlohmann::json::parse(out.substr(0, out.find('\n')), nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << out;
  const std::string cells = got["document.querySelector('#cells tbody').textContent"];
  EXPECT_NE(cells.find("workers=1"), std::string::npos) << cells;
  EXPECT_NE(cells.find("workers=2"), std::string::npos) << cells;
  const std::string chart_ids =
      got["[...document.querySelectorAll('#charts > div')].map(d => d.id).join()"];
  EXPECT_NE(chart_ids.find("speedup"), std::string::npos) << chart_ids;
  EXPECT_NE(chart_ids.find("efficiency"), std::string::npos) << chart_ids;
  EXPECT_EQ(got["document.querySelectorAll('#jobs tbody tr').length"], 2) << out;

  // The tunes list and the tune's page: its cells, its choice, each cell's path.
  rc = Browse("/ui/tunes",
              WithToken({"--wait-js", "jouleStats.tunes === 1", "--eval-js",
                         "document.querySelector('#groups tbody').textContent"}),
              &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ui-tune"), std::string::npos) << out;
  rc = Browse(
      "/ui/tune?name=ui-tune",
      WithToken({"--wait-js", "jouleStats.cells === 2 && jouleStats.charts === 2", "--eval-js",
                 "document.querySelector('#cells tbody').textContent", "--eval-js",
                 "document.querySelectorAll('#tune-paths .mark-line.role-mark path').length"}),
      &out);
  ASSERT_EQ(rc, 0) << out;
  got = nlohmann::json::parse(out.substr(0, out.find('\n')), nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << out;
  EXPECT_NE(
      got["document.querySelector('#cells tbody').textContent"].get<std::string>().find("(chosen)"),
      std::string::npos)
      << out;
  EXPECT_EQ(got["document.querySelectorAll('#tune-paths .mark-line.role-mark path').length"], 2)
      << out;  // a line a cell
  EXPECT_EQ(status_of_path("/api/tune?name=no-such-tune"), "404");

  const std::string pair = std::to_string(ids[0]) + "," + std::to_string(ids[1]);
  rc = Browse(
      "/ui/compare?ids=" + pair,
      WithToken({"--wait-js", "jouleStats.compared === 2 && jouleStats.charts === 4", "--eval-js",
                 "document.querySelectorAll('#compare-accuracy-by-energy .mark-line "
                 "path').length",
                 "--eval-js", "document.getElementById('heads').textContent"}),
      &out);
  ASSERT_EQ(rc, 0) << out;
  got = nlohmann::json::parse(out.substr(0, out.find('\n')), nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << out;
  EXPECT_EQ(got["document.querySelectorAll('#compare-accuracy-by-energy .mark-line path').length"],
            2)
      << out;  // a line a job
  EXPECT_NE(
      got["document.getElementById('heads').textContent"].get<std::string>().find("ui-cell-2"),
      std::string::npos)
      << out;

  // The job page: loss and accuracy charts of their own, the target a dashed rule.
  rc = Browse(
      "/ui/job?id=" + std::to_string(ids[0]),
      WithToken({"--wait-js", "jouleStats.charts === 4", "--eval-js",
                 "document.querySelectorAll('#accuracy-by-epoch .mark-rule.role-mark line').length",
                 "--eval-js", "document.getElementById('facts').textContent"}),
      &out);
  ASSERT_EQ(rc, 0) << out;
  got = nlohmann::json::parse(out.substr(0, out.find('\n')), nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << out;
  EXPECT_EQ(got["document.querySelectorAll('#accuracy-by-epoch .mark-rule.role-mark line').length"],
            1)
      << out;
  EXPECT_NE(
      got["document.getElementById('facts').textContent"].get<std::string>().find("energy by rank"),
      std::string::npos)
      << out;
  // The pending job: every chart there, each saying it has no data yet.
  rc = Browse("/ui/job?id=" + std::to_string(pending),
              WithToken({"--wait-js", "jouleStats.emptyCharts === 4", "--eval-js",
                         "document.querySelectorAll('#charts .nodata').length", "--eval-js",
                         "document.getElementById('charts').textContent"}),
              &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("no data yet"), std::string::npos) << out;

  // Malformed requests: one-line errors with the right status, never a crash.
  const auto& status_of = status_of_path;
  EXPECT_EQ(status_of("/api/compare?ids=x"), "400");
  EXPECT_EQ(status_of("/api/compare?ids="), "400");
  EXPECT_EQ(status_of("/api/compare?ids=1,2,3,4,5,6,7,8,9"), "400");
  EXPECT_EQ(status_of("/api/compare?ids=999999"), "404");
  EXPECT_EQ(status_of("/api/compare?ids=1234567890123456789012"), "400");
  EXPECT_EQ(status_of("/api/sweep?name=no-such-sweep"), "404");
  EXPECT_EQ(status_of("/api/sweep"), "404");
  EXPECT_EQ(status_of("/api/usage?per=month"), "400");
  EXPECT_EQ(status_of("/api/usage?by=colour"), "400");
  EXPECT_EQ(status_of("/api/usage?since_ms=soon"), "400");
  EXPECT_EQ(status_of("/api/usage?state=lost"), "400");
  EXPECT_EQ(status_of("/api/usage?by=label:%FF%FE"), "200");  // a key of any bytes: a group
  EXPECT_EQ(status_of("/api/sweeps"), "200");
}

}  // namespace
}  // namespace joule
