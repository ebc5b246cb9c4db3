// joule: the command-line client of a Joule cluster.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <functional>
#include <string>

#include "client/cli.h"
#include "common/names.h"

int main(int argc, char** argv) {
  CLI::App app{"joule: submit, watch and manage Joule training jobs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", joule::VersionLine("joule"));
  joule::client::GlobalOptions g;
  app.add_option("--coordinator", g.coordinator,
                 "coordinator host:port (default $JOULE_COORDINATOR, else the local "
                 "cluster's, else 127.0.0.1:7070)");
  app.add_option("--state-dir", g.state_dir,
                 "local cluster state (default $JOULE_STATE_DIR or ~/.joule/cluster)");
  app.add_option("--tls-ca", g.tls_ca, "PEM CA certificate that signed the coordinator's");
  app.add_option("--tls-cert", g.tls_cert, "PEM client certificate, where one is required");
  app.add_option("--tls-key", g.tls_key, "PEM key of the client certificate");
  app.add_flag("--insecure", g.insecure,
               "plain text instead of TLS (loopback coordinators only; also JOULE_INSECURE=1)");
  app.add_option("--token-file", g.token_file, "file holding this client's bearer token "
                                               "(default: $JOULE_TOKEN)");
  joule::client::SetGlobalOptions(&g);
  int rc = joule::client::kExitOk;
  joule::client::AddSubmitCommand(app, g, &rc);
  joule::client::AddEstimateCommand(app, g, &rc);
  joule::client::AddJobCommands(app, g, &rc);
  joule::client::AddUsageCommand(app, g, &rc);
  joule::client::AddWatchCommand(app, g, &rc);
  joule::client::AddWorkersCommand(app, g, &rc);
  joule::client::AddClusterCommands(app, g, &rc);
  joule::client::AddReportCommand(app, g, &rc);
  joule::client::AddLogsCommand(app, g, &rc);
  joule::client::AddExportCommand(app, g, &rc);
  joule::client::AddSweepCommands(app, g, &rc);
  joule::client::AddTuneCommands(app, g, &rc);
  // JOULE_PARSE_ONLY=1: parse and check the command line, run nothing (the README's
  // examples are tested this way, tests/client/readme_examples.py).
  if (const char* p = std::getenv("JOULE_PARSE_ONLY"); p != nullptr && std::string(p) == "1") {
    std::function<void(CLI::App*)> disarm = [&](CLI::App* a) {
      a->callback([] {});
      for (CLI::App* sub : a->get_subcommands({})) disarm(sub);
    };
    for (CLI::App* sub : app.get_subcommands({})) disarm(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    if (code != 0) joule::client::SuggestForParseError(app, e);
    return code == 0 ? 0 : joule::client::kExitUsage;
  }
  return rc;
}
