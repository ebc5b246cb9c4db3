#include "tests/testing/postgres_server.h"

// Built with PostgreSQL support only (libpq); the tests that use it are left out otherwise.
#if JOULE_WITH_POSTGRESQL

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/testing/process.h"

namespace joule::testing {
namespace {

namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;
constexpr const char* kPassword = "joule-test-password";

// The newest installed server's bin directory, or "".
std::string FindBin() {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    if (fs::exists(e.path() / "bin" / "initdb") && fs::exists(e.path() / "bin" / "pg_ctl")) {
      found.push_back(e.path() / "bin");
    }
  }
  if (found.empty()) return "";
  std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) {
    return std::stoi(a.parent_path().filename().string()) <
           std::stoi(b.parent_path().filename().string());
  });
  return found.back().string();
}

}  // namespace

std::unique_ptr<PostgresServer> PostgresServer::Start(std::string* why, bool* skip,
                                                      const Where& where) {
  *skip = false;
  std::unique_ptr<PostgresServer> s(new PostgresServer());
  s->where_ = where;
  s->bin_ = FindBin();
  if (s->bin_.empty()) {
    *skip = true;
    *why = "PostgreSQL is not installed (Debian: postgresql; bash scripts/install-deps.sh)";
    return nullptr;
  }
  s->as_nobody_ = geteuid() == 0;
  std::string tmpl = (fs::temp_directory_path() / "joule_pg_XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    *why = "cannot create a temporary directory";
    return nullptr;
  }
  s->dir_ = tmpl;
  const std::string pwfile = s->dir_ + "/initdb-password";
  std::ofstream(pwfile) << kPassword << "\n";
  if (s->as_nobody_ && (chown(s->dir_.c_str(), kNobody, kNobody) != 0 ||
                        chown(pwfile.c_str(), kNobody, kNobody) != 0)) {
    *why = "cannot give the server's directory to nobody";
    return nullptr;
  }
  std::string out;
  if (RunCommand(s->AsServerUser({s->bin_ + "/initdb", "-D", s->dir_ + "/data", "-U", "joule",
                                  "--auth=scram-sha-256", "--pwfile=" + pwfile, "-E", "UTF8",
                                  "--no-sync", "--locale=C"}),
                 &out) != 0) {
    *why = "initdb failed: " + out;
    return nullptr;
  }
  fs::remove(pwfile);
  if (where.address != "127.0.0.1") {
    // Test hosts (198.18.0.0/15) log in with the password too.
    std::ofstream(s->dir_ + "/data/pg_hba.conf", std::ios::app)
        << "host all all 198.18.0.0/15 scram-sha-256\n";
  }
  // The client's password file: libpq wants it private to the user reading it.
  s->passfile_ = s->dir_ + "/client.pgpass";
  {
    std::ofstream pass(s->passfile_);
    pass << "*:*:*:joule:" << kPassword << "\n";
  }
  fs::permissions(s->passfile_, fs::perms::owner_read | fs::perms::owner_write);
  for (int attempt = 0; attempt < 3; ++attempt) {
    s->port_ = FreeLoopbackPort();  // the server binds it right after; a clash retries
    if (s->Restart()) return s;
  }
  std::ifstream log(s->log_file());
  *why = "the server did not start: " +
         std::string(std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>());
  return nullptr;
}

PostgresServer::~PostgresServer() {
  Stop();
  std::error_code ec;
  if (!dir_.empty()) fs::remove_all(dir_, ec);
}

std::vector<std::string> PostgresServer::AsServerUser(std::vector<std::string> argv) const {
  if (!as_nobody_) return argv;
  std::vector<std::string> out = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                  "--clear-groups", "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

bool PostgresServer::PgCtl(const std::vector<std::string>& args, std::string* out) const {
  std::vector<std::string> argv = {bin_ + "/pg_ctl", "-D", dir_ + "/data"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(AsServerUser(argv), out) == 0;
}

bool PostgresServer::Stop() {
  if (!running_) return true;
  std::string out;
  running_ = !PgCtl({"-m", "immediate", "-w", "stop"}, &out);
  return !running_;
}

bool PostgresServer::Restart() {
  if (running_) return true;
  std::string out;
  std::vector<std::string> argv = {bin_ + "/pg_ctl",
                                   "-D",
                                   dir_ + "/data",
                                   "-l",
                                   log_file(),
                                   "-w",
                                   "-t",
                                   "60",
                                   "-o",
                                   "-p " + std::to_string(port_) + " -k " + dir_ +
                                       " -c listen_addresses=" + where_.address + " -c fsync=on",
                                   "start"};
  argv = AsServerUser(argv);
  argv.insert(argv.begin(), where_.prefix.begin(), where_.prefix.end());
  running_ = RunCommand(argv, &out) == 0;
  return running_;
}

void PostgresServer::SignalAll(int sig) const {
  std::ifstream pidfile(dir_ + "/data/postmaster.pid");
  pid_t postmaster = 0;
  if (!(pidfile >> postmaster) || postmaster <= 0) return;
  if (sig == SIGSTOP) kill(postmaster, sig);  // first, so that it forks nothing new
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state;
    pid_t ppid = 0;
    if (sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == postmaster) {
      kill(std::stoi(e.path().filename().string()), sig);
    }
  }
  if (sig != SIGSTOP) kill(postmaster, sig);
}

void PostgresServer::Pause() { SignalAll(SIGSTOP); }
void PostgresServer::Resume() { SignalAll(SIGCONT); }

std::string PostgresServer::password() { return kPassword; }

std::string PostgresServer::Uri(const std::string& db) const {
  return "postgresql://joule@" + where_.address + ":" + std::to_string(port_) + "/" + db +
         "?passfile=" + passfile_;
}

std::string PostgresServer::CreateDatabase(const std::string& name, std::string* why) {
  PGconn* c = PQconnectdb(Uri("postgres").c_str());
  std::string uri;
  if (PQstatus(c) != CONNECTION_OK) {
    *why = PQerrorMessage(c);
  } else {
    PGresult* r = PQexec(c, ("CREATE DATABASE " + name).c_str());
    if (PQresultStatus(r) == PGRES_COMMAND_OK) {
      uri = Uri(name);
    } else {
      *why = PQresultErrorMessage(r);
    }
    PQclear(r);
  }
  PQfinish(c);
  return uri;
}

}  // namespace joule::testing

#endif  // JOULE_WITH_POSTGRESQL
