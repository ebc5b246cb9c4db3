// `joule logs ID [-f] [--rank R] [--tail N]`: a job's log lines from every rank.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/job_client.h"
#include "common/json_output.h"
#include "common/names.h"

namespace joule::client {
namespace {

struct LogsFlags {
  int64_t id = 0;
  bool follow = false;
  int rank = -1;
  int tail = 0;
  std::string output = "table";
};

std::string LogTime(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return absl::StrFormat("%s.%03d", buf, static_cast<int>(unix_ms % 1000));
}

// Prints `lines` merged by time (the coordinator keeps them in the order they arrived:
// each rank's lines come in batches), a line's rank and sequence kept.
void PrintLines(std::vector<v1::LogLine>& lines, const LogsFlags& f) {
  std::stable_sort(lines.begin(), lines.end(), [](const v1::LogLine& a, const v1::LogLine& b) {
    return a.unix_ms() != b.unix_ms() ? a.unix_ms() < b.unix_ms() : a.seq() < b.seq();
  });
  for (const v1::LogLine& l : lines) {
    if (f.output == "json") {
      std::cout << ProtoToJson(l).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
    } else {
      std::cout << absl::StrFormat("[rank %d] %s %s\n", l.rank(), LogTime(l.unix_ms()), l.text());
    }
  }
  std::cout << std::flush;
  lines.clear();
}

int Logs(const GlobalOptions& g, const LogsFlags& f) {
  JobClient client = JobClient::ForCoordinator(g);
  int64_t after = f.tail > 0 ? -static_cast<int64_t>(f.tail) : 0;
  bool ended_seen = false;
  // Without -f every page is read before any line is printed, so that all of them merge by
  // time; with -f each poll's lines merge (a line a later poll brings may be earlier).
  std::vector<v1::LogLine> pending;
  for (;;) {
    v1::GetJobLogRequest req;
    req.set_job_id(f.id);
    req.set_rank(f.rank);
    req.set_after_seq(after);
    req.set_limit(f.tail > 0 && after < 0 ? f.tail : 1000);
    absl::StatusOr<v1::GetJobLogResponse> got = client.GetJobLog(req);
    if (!got.ok()) return client.Report("logs", got.status());
    const v1::GetJobLogResponse& resp = *got;
    pending.insert(pending.end(), resp.lines().begin(), resp.lines().end());
    const bool more = resp.lines_size() == req.limit() && after >= 0;
    after = resp.last_seq();
    if (more && pending.size() < 100000) continue;  // a full page: the next one at once
    PrintLines(pending, f);
    if (more) continue;
    if (!f.follow) return kExitOk;
    if (IsTerminal(resp.state())) {
      // The coordinator stores the last lines just after the job ends: one more look.
      if (ended_seen) return kExitOk;
      ended_seen = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace

void AddLogsCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  auto f = std::make_shared<LogsFlags>();
  KeepAlive(f);
  CLI::App* cmd = app.add_subcommand(
      "logs", "a job's log lines from every rank (the workers' own log while they ran it)");
  cmd->add_option("id", f->id, "job id")->required();
  cmd->add_flag("-f,--follow", f->follow, "keep printing new lines until the job ends");
  cmd->add_option("--rank", f->rank, "only this rank's lines")->check(CLI::NonNegativeNumber);
  cmd->add_option("--tail", f->tail, "only the newest N lines (then follow, with -f)")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("-o,--output", f->output, "table (default) or json (a line of JSON each)")
      ->check(CLI::IsMember({"table", "json"}));
  cmd->callback([&g, f, rc] { *rc = Logs(g, *f); });
}

}  // namespace joule::client
