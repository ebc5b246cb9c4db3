#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "client/job_format.h"
#include "client/job_client.h"
#include "common/json_output.h"
#include "client/utf8.h"
#include "common/text.h"
#include "common/names.h"

namespace joule::client {
namespace {

struct ListFlags {
  std::string states;               // "running,pending"
  std::vector<std::string> labels;  // "k=v"
  int limit = 50;
  int64_t before = 0;
  std::string output = "table";
};

int List(const GlobalOptions& g, const ListFlags& f) {
  v1::ListJobsRequest req;
  for (absl::string_view name : absl::StrSplit(f.states, ',', absl::SkipWhitespace())) {
    absl::StatusOr<v1::JobState> s =
        ParseJobState(std::string(absl::StripAsciiWhitespace(name)));
    if (!s.ok()) {
      std::cerr << "error: --state: " << s.status().message() << "\n";
      return kExitUsage;
    }
    req.add_states(*s);
  }
  for (const std::string& l : f.labels) {
    const size_t eq = l.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "error: --label \"" << SanitizeUtf8(l, 64) << "\" is not KEY=VALUE\n";
      return kExitUsage;
    }
    if (absl::Status s = CheckUtf8(l, "--label"); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitUsage;
    }
    (*req.mutable_labels())[l.substr(0, eq)] = l.substr(eq + 1);
  }
  if (req.states_size() == 1) req.set_state(req.states(0));  // what older coordinators read
  req.set_page_size(f.limit);
  req.set_before_id(f.before);
  JobClient client = JobClient::ForCoordinator(g);
  // A label filter applies after the coordinator's paging, so a page may hold fewer jobs
  // than asked: gather pages until the limit is met or none is left.
  v1::ListJobsResponse resp;
  bool left_over = false;  // a matching job beyond the limit
  for (;;) {
    absl::StatusOr<v1::ListJobsResponse> got = client.ListJobs(req);
    if (!got.ok()) return client.Report("list", got.status());
    v1::ListJobsResponse& page = *got;
    for (v1::Job& j : *page.mutable_jobs()) {
      if (resp.jobs_size() < f.limit) {
        *resp.add_jobs() = std::move(j);
      } else {
        left_over = true;
      }
    }
    resp.set_next_before_id(page.next_before_id());
    if (resp.jobs_size() >= f.limit || page.next_before_id() <= 0 || req.labels().empty()) break;
    req.set_before_id(page.next_before_id());
  }
  if (left_over) resp.set_next_before_id(resp.jobs(resp.jobs_size() - 1).id());
  if (f.output == "json") {
    nlohmann::json out = {{"jobs", nlohmann::json::array()},
                          {"next_before_id", resp.next_before_id()}};
    for (const v1::Job& job : resp.jobs()) out["jobs"].push_back(ProtoToJson(job));
    std::cout << JsonText(out);
    return kExitOk;
  }
  if (f.output == "csv") {
    std::cout << JobCsvHeader() << "\n";
    for (const v1::Job& job : resp.jobs()) std::cout << JobCsvLine(job) << "\n";
    return kExitOk;
  }
  std::cout << JobListHeader() << "\n";
  for (const v1::Job& job : resp.jobs()) std::cout << JobLine(job) << "\n";
  if (resp.next_before_id() > 0) {
    std::cout << "(more: joule list --before " << resp.next_before_id() << ")\n";
  }
  return kExitOk;
}

int Status(const GlobalOptions& g, int64_t id, const std::string& output) {
  JobClient client = JobClient::ForCoordinator(g);
  absl::StatusOr<v1::Job> got = client.GetJob(id);
  if (!got.ok()) return client.Report("status", got.status());
  const v1::Job& job = *got;
  if (output == "json") {
    std::cout << JsonText(ProtoToJson(job));
    return kExitOk;
  }
  std::cout << JobDetails(job);
  return kExitOk;
}

int Cancel(const GlobalOptions& g, int64_t id) {
  JobClient client = JobClient::ForCoordinator(g);
  absl::StatusOr<v1::CancelJobResponse> resp = client.Cancel(id);
  if (!resp.ok()) return client.Report("cancel", resp.status());
  std::cout << "job " << id << ": " << JobStateName(resp->job().state()) << "\n";
  return kExitOk;
}

}  // namespace

void AddJobCommands(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<ListFlags>();
  KeepAlive(f);
  CLI::App* list = app.add_subcommand("list", "list jobs, newest first");
  list->add_option("--state", f->states,
                   "only these states, comma-separated: pending, running, succeeded, failed, "
                   "cancelled, budget_exceeded");
  list->add_option("--label", f->labels, "only jobs with this KEY=VALUE label; repeatable");
  list->add_option("--limit", f->limit, "jobs per page")->capture_default_str();
  list->add_option("--before", f->before, "page: jobs with id below this");
  list->add_option("-o,--output", f->output,
                   "table (default), csv (a row a job; the next page is --before the last id) "
                   "or json (every field)")
      ->check(CLI::IsMember({"table", "csv", "json"}));
  list->callback([&g, f, rc] { *rc = List(g, *f); });

  auto id = std::make_shared<int64_t>(0);
  auto output = std::make_shared<std::string>("table");
  CLI::App* status = app.add_subcommand("status", "show a job: state, why it waits, progress");
  status->add_option("id", *id, "job id")->required();
  AddOutputOption(status, output.get());
  status->callback([&g, id, output, rc] { *rc = Status(g, *id, *output); });

  auto cid = std::make_shared<int64_t>(0);
  CLI::App* cancel = app.add_subcommand("cancel", "cancel a pending or running job");
  cancel->add_option("id", *cid, "job id")->required();
  cancel->callback([&g, cid, rc] { *rc = Cancel(g, *cid); });
}

}  // namespace joule::client
