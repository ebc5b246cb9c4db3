#include "client/cli.h"

#include <memory>
#include <vector>
#include <algorithm>

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/energy_report.h"
#include "common/job_spec.h"
#include "common/names.h"
#include "common/security.h"
#include "common/text.h"

namespace joule::client {

std::string StateDir(const GlobalOptions& g) {
  if (!g.state_dir.empty()) return g.state_dir;
  if (const char* env = std::getenv("JOULE_STATE_DIR")) return env;
  const char* home = std::getenv("HOME");
  return absl::StrCat(home ? home : ".", "/.joule/cluster");
}

namespace {
const GlobalOptions* global = nullptr;
std::string local_cluster_address;  // what ResolveCoordinator read from the state dir
// Where ResolveCoordinator's address came from, for the unreachable error: "" (a flag or
// JOULE_COORDINATOR), or the state directory it read, or found no cluster in.
std::string read_state_dir, empty_state_dir;
}  // namespace

void SetGlobalOptions(const GlobalOptions* g) { global = g; }
void TrustLocalCluster(const std::string& address) { local_cluster_address = address; }

std::string ResolveCoordinator(const GlobalOptions& g) {
  if (!g.coordinator.empty()) return g.coordinator;
  if (const char* env = std::getenv("JOULE_COORDINATOR"); env && *env) return env;
  std::ifstream f(StateDir(g) + "/coordinator.addr");
  std::string address;
  if (f >> address && !address.empty()) {
    local_cluster_address = address;
    read_state_dir = StateDir(g);
    return address;
  }
  empty_state_dir = StateDir(g);
  return "127.0.0.1:7070";
}

std::unique_ptr<v1::JobService::Stub> JobStub(const std::string& address) {
  ClientTls tls;
  if (global) {
    tls.ca_file = global->tls_ca;
    tls.cert_file = global->tls_cert;
    tls.key_file = global->tls_key;
    tls.insecure = global->insecure;
  }
  const char* env = std::getenv("JOULE_INSECURE");
  if (env && std::string(env) == "1") tls.insecure = true;
  // The local cluster `joule cluster up` started listens in plain text on loopback.
  if (!local_cluster_address.empty() && address == local_cluster_address && tls.ca_file.empty()) {
    tls.insecure = true;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(tls, address);
  if (!creds.ok()) {
    std::cerr << "error: " << creds.status().message() << "\n";
    std::exit(kExitUsage);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return v1::JobService::NewStub(grpc::CreateCustomChannel(address, *creds, args));
}

void PrepareContext(grpc::ClientContext* ctx) {
  static const std::string token = [] {
    absl::StatusOr<std::string> t = LoadToken(global ? global->token_file : "", "JOULE_TOKEN");
    if (!t.ok()) {
      std::cerr << "error: " << t.status().message() << "\n";
      std::exit(kExitUsage);
    }
    return *t;
  }();
  AddBearer(ctx, token);
}

int ReportRpcError(const std::string& what, const std::string& address,
                   const grpc::Status& status) {
  // The coordinator answered, but its job store could not write or read (a full disk, a
  // locked database): not a coordinator that cannot be reached (issue 23).
  if (status.error_message().rfind("job store: ", 0) == 0) {
    std::cerr << "error: " << what << ": the coordinator at " << address
              << " could not use its job store: " << status.error_message().substr(11) << "\n";
    return kExitFailed;
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::string where;
    if (!read_state_dir.empty()) {
      where = absl::StrCat(" (the local cluster's, from ", read_state_dir,
                           "/coordinator.addr: is it still up?)");
    } else if (!empty_state_dir.empty()) {
      where = absl::StrCat(" (no local cluster in ", empty_state_dir,
                           ": --state-dir or JOULE_STATE_DIR names another)");
    }
    std::cerr << "error: " << what << ": cannot reach the coordinator at " << address << where
              << " (" << status.error_message()
              << "). Start one with `joule cluster up`, or set --coordinator / "
                 "JOULE_COORDINATOR"
              << (status.error_message().find("wrong version number") != std::string::npos
                      ? "; the server speaks plain text: is it a --insecure coordinator (then "
                        "pass --insecure)?"
                      : "")
              << ".\n";
    return kExitUnavailable;
  }
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    std::cerr << "error: " << what << ": " << status.error_message()
              << " (give --token-file or set JOULE_TOKEN)\n";
    return kExitFailed;
  }
  std::cerr << "error: " << what << ": " << status.error_message() << "\n";
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitUsage : kExitFailed;
}


void SuggestForParseError(CLI::App& app, const CLI::ParseError& error) {
  // The deepest subcommand the command line selected.
  CLI::App* at = &app;
  for (;;) {
    std::vector<CLI::App*> chosen = at->get_subcommands();
    if (chosen.empty()) break;
    at = chosen.front();
  }
  std::vector<std::string> words;
  const std::string what = error.what();
  for (const char* marker : {"not expected: ", "not expected:", "Not expected: "}) {
    const size_t p = what.find(marker);
    if (p == std::string::npos) continue;
    for (absl::string_view w : absl::StrSplit(what.substr(p + std::strlen(marker)), ' ',
                                             absl::SkipWhitespace())) {
      words.emplace_back(w);
    }
    break;
  }
  // "A subcommand is required": the words the deepest subcommand could not place.
  if (words.empty()) words = at->remaining(false);
  for (const std::string& w : words) {
    std::vector<std::string> candidates;
    const bool flag = !w.empty() && w[0] == '-';
    if (flag) {
      for (const CLI::Option* o : at->get_options()) {
        for (const std::string& n : o->get_lnames()) candidates.push_back("--" + n);
      }
    } else {
      for (const CLI::App* sub : at->get_subcommands({})) candidates.push_back(sub->get_name());
    }
    const std::string word = flag ? w.substr(0, w.find('=')) : w;
    const std::string near = ClosestMatch(word, candidates);
    if (!near.empty()) {
      std::cerr << "did you mean '" << near << "' instead of '" << SanitizeUtf8(word, 64)
                << "'?\n";
    }
  }
}

void AddOutputOption(CLI::App* cmd, std::string* output) {
  cmd->add_option("-o,--output", *output, "table (default) or json (every field; numbers as "
                                          "numbers, states lower-case, times RFC 3339)")
      ->check(CLI::IsMember({"table", "json"}));
}

std::chrono::system_clock::time_point RpcDeadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(10);
}

void KeepAlive(std::shared_ptr<void> flags) {
  static auto* kept = new std::vector<std::shared_ptr<void>>();  // never destroyed
  kept->push_back(std::move(flags));
}

}  // namespace joule::client
