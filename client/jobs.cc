#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "common/names.h"

namespace joule::client {
namespace {

int List(const GlobalOptions& g, const std::string& state, int limit, int64_t before) {
  v1::ListJobsRequest req;
  if (!state.empty()) {
    absl::StatusOr<v1::JobState> s = ParseJobState(state);
    if (!s.ok()) {
      std::cerr << "error: " << s.status().message() << "\n";
      return kExitUsage;
    }
    req.set_state(*s);
  }
  req.set_page_size(limit);
  req.set_before_id(before);
  const std::string address = ResolveCoordinator(g);
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx);
  ctx.set_deadline(RpcDeadline());
  grpc::Status s = JobStub(address)->ListJobs(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("list", address, s);
  std::cout << absl::StrFormat("%-6s %-10s %-16s %-12s %-22s %7s %6s %8s\n", "ID", "STATE", "NAME",
                               "MODEL", "DATASET", "WORKERS", "GBS", "ACCURACY");
  for (const v1::Job& job : resp.jobs()) std::cout << JobLine(job) << "\n";
  if (resp.next_before_id() > 0) {
    std::cout << "(more: joule list --before " << resp.next_before_id() << ")\n";
  }
  return kExitOk;
}

int Status(const GlobalOptions& g, int64_t id) {
  const std::string address = ResolveCoordinator(g);
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  grpc::ClientContext ctx;
  PrepareContext(&ctx);
  ctx.set_deadline(RpcDeadline());
  grpc::Status s = JobStub(address)->GetJob(&ctx, req, &job);
  if (!s.ok()) return ReportRpcError("status", address, s);
  std::cout << JobDetails(job);
  return kExitOk;
}

int Cancel(const GlobalOptions& g, int64_t id) {
  const std::string address = ResolveCoordinator(g);
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::CancelJobResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx);
  ctx.set_deadline(RpcDeadline());
  grpc::Status s = JobStub(address)->CancelJob(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("cancel", address, s);
  std::cout << "job " << id << ": " << JobStateName(resp.job().state()) << "\n";
  return kExitOk;
}

}  // namespace

void AddJobCommands(CLI::App& app, GlobalOptions& g, int* rc) {
  auto state = std::make_shared<std::string>();
  auto limit = std::make_shared<int>(50);
  auto before = std::make_shared<int64_t>(0);
  CLI::App* list = app.add_subcommand("list", "list jobs, newest first");
  list->add_option("--state", *state, "pending, running, succeeded, failed, cancelled or budget_exceeded");
  list->add_option("--limit", *limit, "jobs per page")->capture_default_str();
  list->add_option("--before", *before, "page: jobs with id below this");
  list->callback([&g, state, limit, before, rc] { *rc = List(g, *state, *limit, *before); });

  auto id = std::make_shared<int64_t>(0);
  CLI::App* status = app.add_subcommand("status", "show a job: state, why it waits, progress");
  status->add_option("id", *id, "job id")->required();
  status->callback([&g, id, rc] { *rc = Status(g, *id); });

  auto cid = std::make_shared<int64_t>(0);
  CLI::App* cancel = app.add_subcommand("cancel", "cancel a pending or running job");
  cancel->add_option("id", *cid, "job id")->required();
  cancel->callback([&g, cid, rc] { *rc = Cancel(g, *cid); });
}

}  // namespace joule::client
