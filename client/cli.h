#ifndef JOULE_CLIENT_CLI_H_
#define JOULE_CLIENT_CLI_H_

#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "joule/v1/job.grpc.pb.h"

namespace joule::client {

class JobClient;

// Exit codes of `joule`.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;       // the job failed or was cancelled; an RPC failed
inline constexpr int kExitUsage = 2;        // bad flags or spec
inline constexpr int kExitUnavailable = 3;  // the coordinator could not be reached

// Flags every command shares.
struct GlobalOptions {
  std::string coordinator;  // --coordinator; empty = resolve (see ResolveCoordinator)
  std::string state_dir;    // --state-dir; empty = $JOULE_STATE_DIR or ~/.joule/cluster
  std::string tls_ca, tls_cert, tls_key;  // --tls-ca / --tls-cert / --tls-key
  bool insecure = false;    // --insecure (or $JOULE_INSECURE=1): plain text to loopback
  std::string token_file;   // --token-file; else $JOULE_TOKEN
};

// The options every command uses, set once by main() before parsing ends.
void SetGlobalOptions(const GlobalOptions* g);

// The local cluster's state directory: --state-dir, else $JOULE_STATE_DIR, else
// ~/.joule/cluster.
std::string StateDir(const GlobalOptions& g);

// The coordinator to talk to: --coordinator, else $JOULE_COORDINATOR, else the address a
// local `joule cluster up` wrote to STATE_DIR/coordinator.addr, else 127.0.0.1:7070.
std::string ResolveCoordinator(const GlobalOptions& g);

// A JobService stub for `address`, with TLS (or plain text where allowed: --insecure, or
// the local cluster this machine started). Exits with a message on bad TLS settings.
std::unique_ptr<v1::JobService::Stub> JobStub(const std::string& address);
// Marks `address` as the plain-text local cluster this machine started.
void TrustLocalCluster(const std::string& address);
// Adds the client's bearer token to a call.
void PrepareContext(grpc::ClientContext* ctx);
// The deadline of a unary call: 10 s from now.
std::chrono::system_clock::time_point RpcDeadline();

// Prints "error: <what>: <status>" to stderr and returns the matching exit code.
int ReportRpcError(const std::string& what, const std::string& address,
                   const grpc::Status& status);

// Each command adds its subcommand to `app`; the callback stores the exit code in *rc.
void AddSubmitCommand(CLI::App& app, GlobalOptions& g, int* rc);
void AddEstimateCommand(CLI::App& app, GlobalOptions& g, int* rc);
void AddJobCommands(CLI::App& app, GlobalOptions& g, int* rc);  // list, status, cancel
void AddUsageCommand(CLI::App& app, GlobalOptions& g, int* rc);

// `joule usage`'s pieces (client/usage.cc), for tests: a --since/--until time (RFC 3339,
// a date, or a span back from `now` such as 7d) as unix ms (INVALID_ARGUMENT naming the
// forms); the table and the CSV of a response.
absl::StatusOr<int64_t> ParseUsageTime(const std::string& text, absl::Time now);
std::string UsageTable(const v1::UsageResponse& r, const std::string& by);
std::string UsageCsv(const v1::UsageResponse& r);
void AddWatchCommand(CLI::App& app, GlobalOptions& g, int* rc);
void AddWorkersCommand(CLI::App& app, GlobalOptions& g, int* rc);
void AddClusterCommands(CLI::App& app, GlobalOptions& g, int* rc);  // cluster up|down
void AddReportCommand(CLI::App& app, GlobalOptions& g, int* rc);
void AddLogsCommand(CLI::App& app, GlobalOptions& g, int* rc);  // logs ID [-f]
void AddExportCommand(CLI::App& app, GlobalOptions& g, int* rc);  // export ID -o F.npz

// The path of another Joule program: next to this one if it is there, else `name` (PATH).
std::string ProgramPath(const std::string& name);
void AddSweepCommands(CLI::App& app, GlobalOptions& g, int* rc);  // sweep run|status
void AddTuneCommands(CLI::App& app, GlobalOptions& g, int* rc);   // tune run|status

// Follows job `id` until it ends, printing a live progress line and a summary.
// Returns kExitOk when it SUCCEEDED, kExitFailed when it failed or was cancelled.
int WatchJob(JobClient& client, int64_t id);
// `joule watch`'s one-line view of `job` (id `id`) as it pends or runs; "" once it has
// ended.
std::string ProgressLine(const v1::Job& job, int64_t id);
// `joule report`'s table of an ended job, on standard output.
void PrintJobReport(const v1::Job& job);

// Every job `request` selects (its filters; page_size and before_id are set here), newest
// first, at most `max_jobs`, a page of ListJobs at a time. Errors: UNAVAILABLE with the
// RPC's message.
absl::StatusOr<std::vector<v1::Job>> ListAllJobs(JobClient& client, v1::ListJobsRequest request,
                                                 size_t max_jobs);
// Every SUCCEEDED job the coordinator holds, newest first, at most 5000 (the history
// `joule estimate` learns from).
absl::StatusOr<std::vector<v1::Job>> FinishedJobs(JobClient& client);

// `-o,--output table|json` on a command (JSON: common/json_output.h).
void AddOutputOption(CLI::App* cmd, std::string* output);
// After a parse error: for each word the parser did not expect, "did you mean" the closest
// subcommand or flag of the deepest subcommand given (common/text.h ClosestMatch), on
// stderr.
void SuggestForParseError(CLI::App& app, const CLI::ParseError& error);

// Keeps a command's flags alive for the life of the process. Commands hold their flags
// in a shared_ptr their callback captures, and CLI11 writes options into them while
// parsing; JOULE_PARSE_ONLY replaces the callbacks (main.cc), which would free the flags
// mid-parse (seen: a crash at the fifth --set). Not thread-safe: call while building the
// command line.
void KeepAlive(std::shared_ptr<void> flags);

}  // namespace joule::client

#endif  // JOULE_CLIENT_CLI_H_
