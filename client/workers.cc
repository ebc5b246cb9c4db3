#include <grpcpp/grpcpp.h>

#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/job_client.h"
#include "client/job_format.h"
#include "common/json_output.h"
#include "common/names.h"

namespace joule::client {

void AddWorkersCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  CLI::App* cmd = app.add_subcommand("workers", "list the registered workers");
  auto output = std::make_shared<std::string>("table");
  AddOutputOption(cmd, output.get());
  cmd->callback([&g, rc, output] {
    JobClient client = JobClient::ForCoordinator(g);
    absl::StatusOr<v1::ListWorkersResponse> listed = client.ListWorkers();
    if (!listed.ok()) {
      *rc = client.Report("workers", listed.status());
      return;
    }
    const v1::ListWorkersResponse& resp = *listed;
    if (*output == "json") {
      nlohmann::json out = {{"workers", nlohmann::json::array()}};
      for (const v1::WorkerInfo& w : resp.workers()) out["workers"].push_back(ProtoToJson(w));
      std::cout << JsonText(out);
      *rc = kExitOk;
      return;
    }
    // A REGION column where the workers span several grid regions (joule-worker --region).
    std::set<std::string> regions;
    for (const v1::WorkerInfo& w : resp.workers()) regions.insert(w.region());
    const bool by_region = regions.size() > 1;
    const auto region_of = [by_region](const std::string& region) {
      return by_region ? absl::StrFormat("%-12s ", region.substr(0, 12)) : std::string();
    };
    std::cout << absl::StrFormat("%-14s %-10s %-4s %s%-14s %7s %5s %-12s %-21s %-10s %s\n",
                                 "WORKER", "STATE", "KIND", region_of("REGION"), "HOST", "PID",
                                 "CORES", "JOB", "METRICS", "ENERGY", "BLAS");
    for (const v1::WorkerInfo& w : resp.workers()) {
      std::string job = w.state() == v1::WORKER_STATE_BUSY
                            ? absl::StrFormat("%d (rank %d)", w.job_id(), w.rank())
                            : "-";
      std::string energy;
      for (const std::string& src : w.energy_sources()) energy += (energy.empty() ? "" : ",") + src;
      // A busy worker whose session ended mid-attempt: its attempt waits for it to return.
      const std::string state = w.state() == v1::WORKER_STATE_BUSY && w.session_lost_unix_ms() > 0
                                    ? "away"
                                    : WorkerStateName(w.state());
      const std::string blas = BlasLabel(w.blas());
      std::cout << absl::StrFormat(
          "%-14s %-10s %-4s %s%-14s %7d %5d %-12s %-21s %-10s %s\n", w.worker_id(), state,
          DeviceKindName(w.device_kind()), region_of(w.region()), w.host().substr(0, 14), w.pid(),
          w.cores(), job, w.metrics_address().empty() ? "-" : w.metrics_address(),
          energy.empty() ? "-" : energy, blas);
    }
    *rc = kExitOk;
  });
}

}  // namespace joule::client
