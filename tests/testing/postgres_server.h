#ifndef JOULE_TESTS_TESTING_POSTGRES_SERVER_H_
#define JOULE_TESTS_TESTING_POSTGRES_SERVER_H_

#include <memory>
#include <string>
#include <vector>

namespace joule::testing {

// A PostgreSQL server of a test's own: Debian's postgresql binaries
// (/usr/lib/postgresql/VERSION/bin, the newest installed), a cluster initialised in a
// temporary directory, listening on 127.0.0.1 on a free port (and a Unix socket in that
// directory), with password authentication (scram-sha-256) for the role "joule", whose
// password is in a password file only the client reads. When the test runs as root the
// server runs as `nobody` (initdb and postgres refuse root). Stopped (immediate mode) and
// its directory removed on destruction. Not thread-safe.
class PostgresServer {
 public:
  // Where the server runs: by default on this machine's loopback.
  struct Where {
    // The argv prefix the server is started under (a test host's NetnsHosts::Prefix).
    std::vector<std::string> prefix;
    // The address it listens on and clients connect to (the test host's address; then
    // clients from 198.18.0.0/15 may log in too).
    std::string address = "127.0.0.1";
  };
  // The server, or null with the reason in `*why`: `*skip` is set when PostgreSQL is not
  // installed (bash scripts/install-deps.sh installs it), cleared when it failed to start.
  static std::unique_ptr<PostgresServer> Start(std::string* why, bool* skip, const Where& where);
  static std::unique_ptr<PostgresServer> Start(std::string* why, bool* skip) {
    return Start(why, skip, Where());
  }
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  // Creates an empty database `name` ([a-z0-9_]) and returns its URI (no password: it
  // names the password file with passfile=). Empty on failure, with the reason in `*why`.
  std::string CreateDatabase(const std::string& name, std::string* why);
  // postgresql://joule@ADDRESS:PORT/DB?passfile=FILE
  std::string Uri(const std::string& db) const;
  int port() const { return port_; }
  const std::string& passfile() const { return passfile_; }
  // The role joule's password (what passfile() holds for it).
  static std::string password();
  std::string log_file() const { return dir_ + "/server.log"; }

  // Stops the server (immediate mode: as a crash would) / starts it again on the same
  // port; true when done.
  bool Stop();
  bool Restart();
  // SIGSTOP / SIGCONT to the postmaster and every backend: a server that accepts
  // connections and never answers (a paused VM, a hung disk).
  void Pause();
  void Resume();

 private:
  PostgresServer() = default;
  // The command line run as the server's user.
  std::vector<std::string> AsServerUser(std::vector<std::string> argv) const;
  bool PgCtl(const std::vector<std::string>& args, std::string* out) const;
  void SignalAll(int sig) const;

  Where where_;
  std::string bin_;       // .../bin
  std::string dir_;       // the temporary directory: data/, the socket, the log
  std::string passfile_;  // the client's password file
  int port_ = 0;
  bool as_nobody_ = false;
  bool running_ = false;
};

}  // namespace joule::testing

#endif  // JOULE_TESTS_TESTING_POSTGRES_SERVER_H_
