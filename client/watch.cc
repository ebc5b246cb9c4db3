#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli.h"
#include "client/job_client.h"
#include "client/job_format.h"
#include "common/names.h"

namespace joule::client {

std::string ProgressLine(const v1::Job& job, int64_t id) {
  std::string line;
  if (job.state() == v1::JOB_STATE_PENDING) {
    line =
        absl::StrFormat("job %d pending: %s", id, job.reason().empty() ? "queued" : job.reason());
  } else if (job.state() == v1::JOB_STATE_RUNNING && job.progress().epoch() == 0) {
    line = absl::StrFormat("job %d starting: loading data and connecting the ranks", id);
  } else if (job.state() == v1::JOB_STATE_RUNNING) {
    const v1::JobProgress& p = job.progress();
    line = absl::StrFormat("job %d running: epoch %d/%d  step %d/%d  %.0f samples/s  loss %.4f", id,
                           p.epoch(), job.spec().epochs(), p.step(),
                           p.steps_per_epoch() * job.spec().epochs(), p.samples_per_second(),
                           p.loss());
    if (p.energy_joules() > 0 || p.job_energy_joules() > 0) {
      line += absl::StrFormat("  %.0f J", std::max(p.job_energy_joules(), p.energy_joules()));
      // The job's power now, and each rank's (an older coordinator: rank 0's only).
      if (p.rank_power_watts_size() > 0) {
        line += absl::StrFormat(", %.0f W", p.job_power_watts());
        if (p.rank_power_watts_size() > 1 && p.rank_power_watts_size() <= 8) {
          std::vector<std::string> ranks;
          for (double w : p.rank_power_watts()) ranks.push_back(absl::StrFormat("%.0f", w));
          line += " (ranks " + absl::StrJoin(ranks, "+") + ")";
        }
      } else {
        line += absl::StrFormat(", rank 0 %.0f W", p.power_watts());
      }
      if (p.energy_estimated()) line += " (estimated)";
    }
    if (job.spec().energy_budget_joules() > 0) {
      line += absl::StrFormat("  budget %.0f%%%s", 100 * p.energy_budget_used(),
                              p.budget_warning() ? " (warning)" : "");
    }
    if (p.test_accuracy() >= 0) line += absl::StrFormat("  test accuracy %.4f", p.test_accuracy());
    if (p.phase() == v1::JOB_PHASE_EVALUATION) line += "  (evaluating)";
    if (p.phase() == v1::JOB_PHASE_CHECKPOINT) line += "  (checkpointing)";
    if (p.phase() == v1::JOB_PHASE_STAGING) line += "  (staging data)";
    line += absl::StrFormat("  %.0f s elapsed", p.elapsed_seconds());
    if (const std::string left = TimeLeft(job); !left.empty()) line += " (" + left + ")";
  }
  return line;
}

namespace {

// What a line written to a file or a pipe changes on: the state, the epoch, the phase,
// the wait's reason, the test accuracy (not the step, the loss or the joules, which move
// with every report).
std::string Milestone(const v1::Job& job) {
  const v1::JobProgress& p = job.progress();
  return absl::StrFormat("%d|%d|%d|%s|%.4f", job.state(), p.epoch(), p.phase(),
                         job.state() == v1::JOB_STATE_PENDING ? job.reason() : "",
                         p.test_accuracy());
}

}  // namespace

int WatchJob(JobClient& client, int64_t id) {
  const bool tty = isatty(STDOUT_FILENO);
  v1::Job job;
  v1::Job last;
  bool any = false;
  std::string last_line, last_milestone;
  // Not a terminal: a line per milestone, and at most one a minute between them.
  auto last_written = std::chrono::steady_clock::now() - std::chrono::hours(1);
  // With standby coordinators the stream follows the leader: a stream that ends
  // UNAVAILABLE (the leader lost, or stepped down) is opened again at whichever leads then
  // (a GetJob finds it), for up to a minute without one.
  auto leaderless_since = std::chrono::steady_clock::now();
  grpc::Status s;
  int reopened = 0;
  for (;;) {
    if (client.address_count() > 1) {
      absl::StatusOr<v1::Job> found = client.GetJob(id);
      if (!found.ok()) {
        if (!absl::IsUnavailable(found.status()) && !absl::IsDeadlineExceeded(found.status()) &&
            !absl::IsCancelled(found.status())) {
          return client.Report("watch", found.status());
        }
        if (std::chrono::steady_clock::now() - leaderless_since > std::chrono::minutes(1)) {
          return client.Report("watch", found.status());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        continue;
      }
      leaderless_since = std::chrono::steady_clock::now();
    }
    grpc::ClientContext ctx;
    PrepareContext(&ctx);
    v1::WatchJobRequest req;
    req.set_job_id(id);
    auto reader = client.stub().WatchJob(&ctx, req);
    while (reader->Read(&job)) {
      any = true;
      last = job;
      const std::string line = ProgressLine(job, id);
      if (line.empty()) continue;
      if (line == last_line) continue;
      last_line = line;
      if (tty) {
        std::cout << "\r\033[K" << line << std::flush;
      } else {
        const std::string milestone = Milestone(job);
        const auto now = std::chrono::steady_clock::now();
        if (milestone == last_milestone && now - last_written < std::chrono::minutes(1)) continue;
        last_milestone = milestone;
        last_written = now;
        std::cout << line << "\n" << std::flush;
      }
    }
    s = reader->Finish();
    const bool ended = last.state() == v1::JOB_STATE_SUCCEEDED ||
                       last.state() == v1::JOB_STATE_FAILED ||
                       last.state() == v1::JOB_STATE_CANCELLED;
    // A leader killed mid-stream ends it UNAVAILABLE or, when its connection is reset,
    // CANCELLED (this client never cancels): either way the next leader is looked for.
    const bool lost_leader = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             s.error_code() == grpc::StatusCode::CANCELLED;
    if (s.ok() || ended || client.address_count() < 2 || !lost_leader) break;
    // Not at once: a leader whose streams keep ending gets a pause, and a minute of them
    // ends the watch.
    if (++reopened > 120) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (tty && any) std::cout << "\n";
  if (!s.ok()) return ReportRpcError("watch", client.address(), s);
  if (!any) {
    std::cerr << "error: watch: the coordinator sent nothing for job " << id << "\n";
    return kExitFailed;
  }
  std::cout << JobDetails(last);
  if (last.state() == v1::JOB_STATE_SUCCEEDED) {
    std::cout << absl::StrFormat(
        "final test accuracy: %.4f   wall time: %.1f s   energy: %.1f J%s\n",
        last.result().test_accuracy(), last.result().wall_seconds(),
        last.result().energy().total_joules(),
        last.result().energy().estimated() ? " (estimated)" : "");
    return kExitOk;
  }
  return kExitFailed;
}

void AddWatchCommand(CLI::App& app, GlobalOptions& g, int* rc) {
  auto id = std::make_shared<int64_t>(0);
  CLI::App* cmd = app.add_subcommand("watch", "follow a job's progress until it ends");
  cmd->add_option("id", *id, "job id")->required();
  cmd->callback([&g, id, rc] {
    JobClient client = JobClient::ForCoordinator(g);
    *rc = WatchJob(client, *id);
  });
}

}  // namespace joule::client
