#include "worker/energy/node_power.h"

#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace joule::worker {
namespace {

using Json = nlohmann::json;

// An error's text made one line and short (a BMC's body may be anything).
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s;
}

class RedfishReader final : public NodePowerReader {
 public:
  static absl::StatusOr<std::unique_ptr<RedfishReader>> Make(const RedfishOptions& o) {
    std::unique_ptr<RedfishReader> r(new RedfishReader());
    r->base_ = o.url;
    while (!r->base_.empty() && r->base_.back() == '/') r->base_.pop_back();
    const bool https = absl::StartsWith(r->base_, "https://");
    if (!https && !absl::StartsWith(r->base_, "http://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("redfish: \"", OneLine(o.url), "\" is not an http(s)://host URL"));
    }
    const std::string host = r->base_.substr(r->base_.find("//") + 2);
    if (host.find('@') != std::string::npos) {  // never echo what may be a password
      return absl::InvalidArgumentError(
          "redfish: the URL carries credentials (user@host): give them in "
          "--redfish-credentials-file");
    }
    if (host.empty() || host.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "redfish: \"", OneLine(o.url), "\" must name the BMC only (scheme://host[:port])"));
    }
    r->client_ = std::make_unique<httplib::Client>(r->base_);
    if (!o.credentials_file.empty()) {
      std::ifstream in(o.credentials_file);
      std::string line;
      if (!in || !std::getline(in, line)) {
        return absl::InvalidArgumentError(
            absl::StrCat("redfish: credentials file ", o.credentials_file, " cannot be read"));
      }
      line = std::string(absl::StripAsciiWhitespace(line));
      const size_t colon = line.find(':');
      if (colon == std::string::npos || colon == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "redfish: credentials file ", o.credentials_file, " is not user:password"));
      }
      r->client_->set_basic_auth(line.substr(0, colon), line.substr(colon + 1));
      if (!https) {
        spdlog::warn("energy: redfish {}: credentials over plain HTTP can be read on the way",
                     r->base_);
      }
    }
    const auto t = o.timeout;
    r->timeout_ = t;
    r->client_->set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
    r->client_->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
    r->client_->set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
    // One connection for every reading (a TLS handshake a second costs a BMC's small CPU
    // more than the reading); a BMC that closes it gets a new one at the next reading.
    r->client_->set_keep_alive(true);
    if (https) {
      if (!o.ca_file.empty()) r->client_->set_ca_cert_path(o.ca_file);
      r->client_->enable_server_certificate_verification(!o.insecure_tls);
      if (o.insecure_tls) {
        spdlog::warn("energy: redfish {}: the BMC's certificate is not verified (--insecure)",
                     r->base_);
      }
    }
    r->chassis_ = o.chassis;
    return r;
  }

  // Finds the chassis and the resource that gives a reading.
  absl::Status Discover() {
    std::string chassis_path;
    if (!chassis_.empty()) {
      chassis_path = "/redfish/v1/Chassis/" + chassis_;
    } else {
      absl::StatusOr<Json> collection = Get("/redfish/v1/Chassis");
      if (!collection.ok()) return collection.status();
      const Json* members = Find(*collection, {"Members"});
      if (members == nullptr || !members->is_array() || members->empty() ||
          !(*members)[0].is_object() || !(*members)[0].contains("@odata.id") ||
          !(*members)[0]["@odata.id"].is_string()) {
        return absl::DataLossError(
            absl::StrCat("redfish ", base_, "/redfish/v1/Chassis: no chassis member"));
      }
      chassis_path = (*members)[0]["@odata.id"].get<std::string>();
      if (!absl::StartsWith(chassis_path, "/redfish/v1/")) {
        return absl::DataLossError(absl::StrCat("redfish ", base_,
                                                "/redfish/v1/Chassis: a member's @odata.id \"",
                                                OneLine(chassis_path), "\" is not a path"));
      }
    }
    // The newer resource first; a BMC without it answers 404.
    absl::Status newer;
    for (Kind kind : {Kind::kEnvironmentMetrics, Kind::kPower}) {
      path_ = chassis_path + (kind == Kind::kEnvironmentMetrics ? "/EnvironmentMetrics" : "/Power");
      kind_ = kind;
      absl::StatusOr<double> w = ReadWatts();
      if (w.ok()) return absl::OkStatus();
      if (absl::IsPermissionDenied(w.status()) || absl::IsUnavailable(w.status())) {
        return w.status();
      }
      if (kind == Kind::kEnvironmentMetrics) newer = w.status();
      if (kind == Kind::kPower) {
        return absl::Status(w.status().code(),
                            absl::StrCat(w.status().message(), "; and ", newer.message()));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<double> ReadWatts() override {
    absl::StatusOr<Json> body = Get(path_);
    if (!body.ok()) return body.status();
    const Json* reading = kind_ == Kind::kEnvironmentMetrics
                              ? Find(*body, {"PowerWatts", "Reading"})
                              : Find(*body, {"PowerControl", "0", "PowerConsumedWatts"});
    const char* field = kind_ == Kind::kEnvironmentMetrics ? "PowerWatts.Reading"
                                                           : "PowerControl[0].PowerConsumedWatts";
    if (reading == nullptr || !reading->is_number()) {
      return absl::DataLossError(absl::StrCat("redfish ", base_, path_, ": no number at ", field,
                                              reading == nullptr ? "" : " (null or not a number)"));
    }
    const double w = reading->get<double>();
    if (!std::isfinite(w) || w < 0 || w > kMaxNodeWatts) {
      return absl::DataLossError(absl::StrCat("redfish ", base_, path_, ": ", field, " = ", w,
                                              " W is not a node's power"));
    }
    return w;
  }

  std::string Describe() const override { return absl::StrCat("redfish ", base_, path_); }

 private:
  enum class Kind { kEnvironmentMetrics, kPower };
  RedfishReader() = default;

  // The object at `keys` (a digit string indexes an array), or null.
  static const Json* Find(const Json& j, std::initializer_list<const char*> keys) {
    const Json* at = &j;
    for (const char* k : keys) {
      if (k[0] >= '0' && k[0] <= '9') {
        const size_t i = static_cast<size_t>(std::atoi(k));
        if (!at->is_array() || at->size() <= i) return nullptr;
        at = &(*at)[i];
      } else {
        if (!at->is_object()) return nullptr;
        auto it = at->find(k);
        if (it == at->end()) return nullptr;
        at = &*it;
      }
    }
    return at;
  }

  absl::StatusOr<Json> Get(const std::string& path) {
    std::string body;
    bool too_long = false, too_slow = false;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    httplib::Headers headers = {{"Accept", "application/json"}, {"OData-Version", "4.0"}};
    httplib::Result res = client_->Get(path, headers, [&](const char* data, size_t n) {
      if (body.size() + n > kMaxRedfishBodyBytes) {
        too_long = true;
        return false;
      }
      if (std::chrono::steady_clock::now() > deadline) {  // a BMC that drips its answer
        too_slow = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    const std::string where = absl::StrCat("redfish ", base_, path);
    if (too_long) {
      return absl::DataLossError(
          absl::StrCat(where, ": answer longer than ", kMaxRedfishBodyBytes, " bytes"));
    }
    if (too_slow) {
      return absl::UnavailableError(
          absl::StrCat(where, ": no whole answer within ", timeout_.count(), " ms"));
    }
    if (!res) {
      return absl::UnavailableError(absl::StrCat(where, ": ", httplib::to_string(res.error()),
                                                 " (within ", timeout_.count(), " ms)"));
    }
    if (res->status == 401 || res->status == 403) {
      return absl::PermissionDeniedError(
          absl::StrCat(where, ": HTTP ", res->status, " (credentials refused)"));
    }
    if (res->status != 200) {
      return absl::NotFoundError(absl::StrCat(where, ": HTTP ", res->status));
    }
    Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::DataLossError(absl::StrCat(where, ": not JSON"));
    return j;
  }

  std::string base_, chassis_, path_;
  Kind kind_ = Kind::kPower;
  std::chrono::milliseconds timeout_{2000};
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NodePowerReader>> OpenRedfish(const RedfishOptions& options) {
  absl::StatusOr<std::unique_ptr<RedfishReader>> r = RedfishReader::Make(options);
  if (!r.ok()) return r.status();
  if (absl::Status s = (*r)->Discover(); !s.ok()) return s;
  return std::unique_ptr<NodePowerReader>(*std::move(r));
}

namespace {

// Runs `argv` (PATH searched) in a process group of its own, with an environment of
// PATH, LANG=C and `extra_env` only (not the worker's tokens), default signal handling
// and an empty signal mask (the worker blocks SIGTERM and ignores SIGPIPE), stdin from
// /dev/null, its stdout and stderr together (at most 64 KiB kept). Past `timeout` (its
// output open or not) the whole group is killed (a wrapper's children too). The exit status in
// *status (128 + N for signal N). Errors: UNAVAILABLE when it cannot start or ran past the timeout.
absl::StatusOr<std::string> RunWithTimeout(const std::vector<std::string>& argv,
                                           const std::vector<std::string>& extra_env,
                                           std::chrono::milliseconds timeout, int* status) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings(extra_env);
  const char* path = std::getenv("PATH");
  env_strings.push_back(absl::StrCat("PATH=", path != nullptr ? path : "/usr/bin:/bin"));
  env_strings.push_back("LANG=C");
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(pipe_fds[1]);
  if (err != 0) {
    close(pipe_fds[0]);
    return absl::UnavailableError(absl::StrCat(argv[0], ": ", std::strerror(err)));
  }
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
        .count();
  };
  // Its output until it closes (or the deadline)...
  while (left_ms() > 0) {
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left_ms()));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;  // EINTR or the deadline: checked above
    char buf[4096];
    const ssize_t n = read(pipe_fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of output: it closed or exited
    if (out.size() < 65536) out.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  // ...then its exit, never past the deadline: one that closed its output and lives on is
  // killed too.
  int wstatus = 0;
  bool exited = false;
  for (;;) {
    const pid_t r = waitpid(pid, &wstatus, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) {
      exited = r == pid;
      break;
    }
    if (left_ms() <= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(5, left_ms())));
  }
  if (!exited) {
    kill(-pid, SIGKILL);  // the group: a wrapper's children too
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    return absl::UnavailableError(
        absl::StrCat(argv[0], ": no answer within ", timeout.count(), " ms (killed)"));
  }
  *status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  return out;
}

class IpmiDcmiReader final : public NodePowerReader {
 public:
  IpmiDcmiReader(IpmiOptions options, std::vector<std::string> argv, std::string password)
      : options_(std::move(options)), argv_(std::move(argv)), password_(std::move(password)) {}

  absl::StatusOr<double> ReadWatts() override {
    int status = 0;
    std::vector<std::string> env;
    if (!password_.empty()) env.push_back("IPMI_PASSWORD=" + password_);
    absl::StatusOr<std::string> out = RunWithTimeout(argv_, env, options_.timeout, &status);
    if (!out.ok())
      return absl::UnavailableError(absl::StrCat("ipmi dcmi: ", out.status().message()));
    if (status != 0) {
      return absl::UnavailableError(
          absl::StrCat("ipmi dcmi: ", options_.ipmitool, " exited ", status, ": ", OneLine(*out)));
    }
    // "    Instantaneous power reading:                   180 Watts"
    double watts = -1;
    bool deactivated = false;
    for (absl::string_view line : absl::StrSplit(*out, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (absl::StartsWith(line, "Power reading state is:")) {
        deactivated = absl::StrContains(line, "deactivated");
      }
      if (!absl::ConsumePrefix(&line, "Instantaneous power reading:")) continue;
      line = absl::StripAsciiWhitespace(line);
      if (!absl::ConsumeSuffix(&line, "Watts")) continue;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(line), &watts)) watts = -1;
    }
    if (deactivated) {
      return absl::DataLossError(
          "ipmi dcmi: the BMC's power reading state is deactivated "
          "(ipmitool dcmi power activate turns it on)");
    }
    if (!(watts >= 0) || watts > kMaxNodeWatts) {
      return absl::DataLossError(
          absl::StrCat("ipmi dcmi: no \"Instantaneous power reading: N Watts\" in ",
                       options_.ipmitool, "'s answer: ", OneLine(*out)));
    }
    return watts;
  }

  std::string Describe() const override {
    return absl::StrCat("ipmi dcmi ", options_.host.empty() ? "local BMC" : options_.host);
  }

 private:
  IpmiOptions options_;
  std::vector<std::string> argv_;
  std::string password_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NodePowerReader>> OpenIpmiDcmi(const IpmiOptions& options) {
  std::vector<std::string> argv = {options.ipmitool};
  std::string password;
  if (!options.host.empty()) {
    argv.insert(argv.end(), {"-I", "lanplus", "-H", options.host});
    if (!options.credentials_file.empty()) {
      std::ifstream in(options.credentials_file);
      std::string line;
      if (!in || !std::getline(in, line)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ipmi dcmi: credentials file ", options.credentials_file, " cannot be read"));
      }
      line = std::string(absl::StripAsciiWhitespace(line));
      const size_t colon = line.find(':');
      if (colon == std::string::npos || colon == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ipmi dcmi: credentials file ", options.credentials_file, " is not user:password"));
      }
      argv.insert(argv.end(), {"-U", line.substr(0, colon), "-E"});
      password = line.substr(colon + 1);
    }
  }
  // ipmitool's own timeout and one retry, inside ours.
  const int64_t seconds = std::max<int64_t>(1, options.timeout.count() / 3000);
  argv.insert(argv.end(), {"-N", std::to_string(seconds), "-R", "1", "dcmi", "power", "reading"});
  auto reader = std::make_unique<IpmiDcmiReader>(options, std::move(argv), std::move(password));
  absl::StatusOr<double> first = reader->ReadWatts();
  if (!first.ok()) return first.status();
  return std::unique_ptr<NodePowerReader>(std::move(reader));
}

NodeEnergyPoller::NodeEnergyPoller(std::unique_ptr<NodePowerReader> reader, const Clock* clock,
                                   std::chrono::milliseconds period,
                                   std::chrono::milliseconds max_gap)
    : reader_(std::move(reader)), clock_(clock), period_(period), max_gap_(max_gap) {}

NodeEnergyPoller::~NodeEnergyPoller() {
  Stop();
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the lock: a neighbour takes over
  if (!own_devices_path_.empty()) unlink(own_devices_path_.c_str());
}

// Writes `text` to `path` through a temporary file and a rename, so readers see the old
// text or the new, never a part; not synced. False with errno set when it fails.
static bool ReplaceSmallFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int saved = errno;
  close(fd);
  errno = saved;
  return written && rename(tmp.c_str(), path.c_str()) == 0;
}

std::string DefaultNodePowerDir() { return absl::StrCat("/tmp/joule-node-power-", geteuid()); }

absl::Status NodeEnergyPoller::SetShared(const std::string& dir) {
  // The directory is this user's alone (0700, not a link): no other user can hold the
  // lock or write the node's total.
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("node power: cannot create ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 0077) != 0) {
    return absl::UnavailableError(
        absl::StrCat("node power: ", dir, " is not a directory of this user's alone (mode 0700)"));
  }
  // One key per host and BMC resource: workers of other hosts (a shared filesystem) or
  // reading other BMCs never share.
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string key = absl::StrFormat(
      "%016x", std::hash<std::string>{}(absl::StrCat(host, "|", reader_->Describe())));
  const std::string lock_path = absl::StrCat(dir, "/node-", key, ".lock");
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("node power: cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  lock_fd_ = fd;
  state_path_ = absl::StrCat(dir, "/node-", key, ".state");
  {
    std::lock_guard<std::mutex> exchange_lock(exchange_mu_);
    std::random_device random;
    devices_token_ = absl::StrFormat("%08x%08x", random(), random());
  }
  return absl::OkStatus();
}

bool NodeEnergyPoller::polling() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lock_fd_ < 0 || holds_lock_;
}

void NodeEnergyPoller::Start() {
  Poll();
  if (period_.count() <= 0 || thread_.joinable()) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (cv_.wait_for(lock, period_, [this] { return stopping_; })) break;
      lock.unlock();
      Poll();
      lock.lock();
    }
  });
}

void NodeEnergyPoller::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NodeEnergyPoller::Poll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lock_fd_ >= 0 && !holds_lock_) {
      if (flock(lock_fd_, LOCK_EX | LOCK_NB) == 0) {
        holds_lock_ = true;
        // The last total the previous poller left, then a new segment from this reading:
        // the time between its last reading and this one is not integrated.
        ReadShared();
        have_last_ = false;
        if (totals_.readings > 0) totals_.lost_seconds += Seconds(period_);
        spdlog::info("energy: node: this process reads {} for the host now", reader_->Describe());
      } else {
        ReadShared();
        return;
      }
    }
  }
  PollBmc();
}

// mu_ held. The state file: "joules watts readings failures" (one line, text), joules the
// host's total since its first poller began. totals_.joules is this process's: the host's
// total less the base it had when this process first read it (so a reader that starts
// late charges nothing from before it), re-based when the host's total goes back (a poller
// that began again with no file).
void NodeEnergyPoller::ReadShared() {
  struct stat st;
  if (lstat(state_path_.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  std::ifstream in(state_path_);
  double joules = 0, watts = 0;
  int64_t readings = 0, failures = 0;
  if (!(in >> joules >> watts >> readings >> failures) || !std::isfinite(joules) || joules < 0 ||
      joules > 1e15 || !std::isfinite(watts)) {
    return;  // not written yet (or garbled): nothing new
  }
  std::error_code ec;
  const auto modified = std::filesystem::last_write_time(state_path_, ec);
  const bool fresh =
      !ec && std::filesystem::file_time_type::clock::now() - modified < 5 * period_ + max_gap_;
  if (!have_base_) {
    have_base_ = true;
    shared_base_ = joules - totals_.joules;
  }
  const double ours = joules - shared_base_;
  if (ours > totals_.joules) {
    totals_.joules = ours;
  } else if (ours < totals_.joules - 1e-6) {
    shared_base_ = joules - totals_.joules;  // went back: count on from here
  }
  totals_.watts = fresh ? watts : 0;
  totals_.readings = std::max<int64_t>(readings, 1);
  totals_.failures = failures;
  totals_.last_error = fresh ? "" : "the host's node-power state file is stale";
}

void NodeEnergyPoller::PollBmc() {
  // The reading outside the lock: a BMC may take its whole timeout.
  absl::StatusOr<double> w = reader_->ReadWatts();
  const Clock::TimePoint now = clock_->Now();
  std::unique_lock<std::mutex> lock(mu_);
  std::string state;  // the shared state file's next line, when this process polls
  if (!w.ok()) {
    ++totals_.failures;
    const std::string error(w.status().message());
    if (error != totals_.last_error) spdlog::warn("energy: node: {}", error);
    totals_.last_error = error;
    return;
  }
  ++totals_.readings;
  totals_.last_error.clear();
  if (have_last_) {
    const double dt = Seconds(now - last_time_);
    if (dt > 0 && dt <= Seconds(max_gap_)) {
      totals_.joules += (last_watts_ + *w) / 2 * dt;
    } else if (dt > 0) {
      totals_.lost_seconds += dt;
      spdlog::warn("energy: node: {:.1f} s without a reading (more than {} ms): not integrated", dt,
                   max_gap_.count());
    }
  }
  have_last_ = true;
  last_time_ = now;
  last_watts_ = *w;
  totals_.watts = *w;
  if (lock_fd_ >= 0 && holds_lock_) {
    if (!have_base_) have_base_ = true;  // the first poller: the host's total is its own
    state = absl::StrFormat("%.17g %.17g %d %d\n", shared_base_ + totals_.joules, *w,
                            totals_.readings, totals_.failures);
  }
  lock.unlock();
  // Written outside the lock (metering reads totals() under its own) and not synced: a
  // crash loses at most one reading's total, which the next poller re-bases past.
  if (!state.empty() && !ReplaceSmallFile(state_path_, state)) {
    spdlog::warn("energy: node: cannot write {}: {}", state_path_, std::strerror(errno));
  }
}

double NodeEnergyPoller::ExchangeDeviceJoules(double own_devices_joules) {
  std::lock_guard<std::mutex> lock(exchange_mu_);
  std::string dir, prefix;
  {
    std::lock_guard<std::mutex> state_lock(mu_);
    if (lock_fd_ < 0) return 0;
    const size_t slash = state_path_.rfind('/');
    dir = state_path_.substr(0, slash);
    // node-KEY.state -> node-KEY.devices.
    prefix = state_path_.substr(slash + 1, state_path_.size() - slash - 1 - 5) + "devices.";
  }
  // Named by a token of this process's, not its pid: workers in containers that share
  // the directory may all be pid 1.
  const std::string own_name = absl::StrCat(prefix, devices_token_);
  if (!ReplaceSmallFile(absl::StrCat(dir, "/", own_name),
                        absl::StrFormat("%.17g\n", own_devices_joules)) &&
      !exchange_warned_) {
    exchange_warned_ = true;
    spdlog::warn("energy: node: cannot publish this worker's device energy in {}: {}", dir,
                 std::strerror(errno));
  }
  own_devices_path_ = absl::StrCat(dir, "/", own_name);
  double others = 0;
  std::set<std::string> seen;
  // A live worker publishes at each node reading: one whose file is older than a minute
  // (or five readings, for a slow BMC) has stopped metering and counts no more; one gone
  // for ten times that is removed (a worker removes its own when it stops).
  const auto fresh =
      std::max<std::chrono::nanoseconds>(std::chrono::minutes(1), 5 * period_ + max_gap_);
  const auto gone = 10 * fresh;
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  std::filesystem::directory_iterator it(dir, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, prefix) || name == own_name) continue;
    const std::string_view token(name.data() + prefix.size(), name.size() - prefix.size());
    if (token.size() != devices_token_.size() ||
        !std::all_of(token.begin(), token.end(), absl::ascii_isxdigit)) {
      continue;
    }
    std::error_code time_ec;
    const auto modified = std::filesystem::last_write_time(entry.path(), time_ec);
    if (time_ec || now - modified > gone) {
      std::filesystem::remove(entry.path(), time_ec);
      continue;
    }
    if (now - modified > fresh) continue;
    struct stat st;
    if (lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 64) {
      continue;
    }
    std::ifstream in(entry.path());
    double joules = 0;
    if (!(in >> joules) || !std::isfinite(joules) || joules < 0 || joules > 1e15) continue;
    seen.insert(name);
    auto [last, first] = others_devices_.emplace(name, joules);
    // First seen, or gone back (garbled, or rewritten): counted from here.
    if (!first && joules >= last->second) others += joules - last->second;
    last->second = joules;
  }
  std::erase_if(others_devices_, [&](const auto& kv) { return !seen.contains(kv.first); });
  return others;
}

NodeEnergyPoller::Totals NodeEnergyPoller::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

}  // namespace joule::worker
