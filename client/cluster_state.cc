#include "client/cluster_state.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace joule::client {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kHeader = "# joule cluster pids v2";

}  // namespace

absl::StatusOr<ProcessIdentity> IdentifyProcess(pid_t pid, const std::string& proc_root) {
  if (pid <= 0) return absl::NotFoundError(absl::StrCat("no process ", pid));
  const std::string dir = absl::StrCat(proc_root, "/", pid);
  std::string stat;
  {
    std::ifstream f(dir + "/stat");
    if (!f) return absl::NotFoundError(absl::StrCat("no process ", pid));
    std::getline(f, stat);
  }
  // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so fields are
  // counted from the last ')'. After it come field 3 (state) onwards.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) {
    return absl::InternalError(absl::StrCat(dir, "/stat: cannot parse"));
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  constexpr size_t kStateIndex = 0;       // field 3
  constexpr size_t kStartTimeIndex = 19;  // field 22
  ProcessIdentity id;
  id.pid = pid;
  if (fields.size() <= kStartTimeIndex ||
      !absl::SimpleAtoi(fields[kStartTimeIndex], &id.start_ticks)) {
    return absl::InternalError(absl::StrCat(dir, "/stat: cannot parse"));
  }
  if (fields[kStateIndex] == "Z" || fields[kStateIndex] == "X") {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  std::error_code ec;
  fs::path exe = fs::read_symlink(dir + "/exe", ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
    }
    return absl::PermissionDeniedError(absl::StrCat("cannot read ", dir, "/exe: ", ec.message()));
  }
  absl::string_view path = exe.native();
  absl::ConsumeSuffix(&path, " (deleted)");  // the program file was replaced since
  id.exe = std::string(path);
  return id;
}

Ownership CheckProcess(const ProcessIdentity& recorded, std::string* why,
                       const std::string& proc_root) {
  absl::StatusOr<ProcessIdentity> live = IdentifyProcess(recorded.pid, proc_root);
  if (!live.ok()) {
    if (absl::IsNotFound(live.status())) return Ownership::kGone;
    if (why) *why = std::string(live.status().message());
    return Ownership::kNotOurs;
  }
  if (*live == recorded) return Ownership::kOurs;
  if (why) {
    *why = live->exe != recorded.exe
               ? absl::StrCat("it now runs ", live->exe)
               : absl::StrCat("it started at another time (", live->start_ticks,
                              " ticks after "
                              "boot, not ",
                              recorded.start_ticks,
                              "), so another process "
                              "holds the PID now");
  }
  return Ownership::kNotOurs;
}

std::string FormatPidsFile(const std::vector<ProcessIdentity>& processes) {
  std::string out = absl::StrCat(kHeader, ": PID START_TICKS EXE\n");
  for (const ProcessIdentity& p : processes) {
    absl::StrAppend(&out, p.pid, " ", p.start_ticks, " ", p.exe, "\n");
  }
  return out;
}

absl::StatusOr<PidsFile> ParsePidsFile(const std::string& text, const std::string& path) {
  PidsFile file;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  const bool v2 = !lines.empty() && absl::StartsWith(lines[0], kHeader);
  for (size_t i = v2 ? 1 : 0; i < lines.size(); ++i) {
    absl::string_view line = absl::StripAsciiWhitespace(lines[i]);
    if (line.empty()) continue;
    auto bad = [&](absl::string_view want) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " line ", i + 1, ": want ", want, ", found \"", line, "\""));
    };
    if (!v2) {
      pid_t pid;
      if (!absl::SimpleAtoi(line, &pid) || pid <= 0) {
        return bad("a PID (or a file whose first line is \"# joule cluster pids v2\")");
      }
      file.legacy_pids.push_back(pid);
      continue;
    }
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    ProcessIdentity p;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &p.pid) || p.pid <= 0 ||
        !absl::SimpleAtoi(parts[1], &p.start_ticks) || parts[2].empty()) {
      return bad("\"PID START_TICKS EXE\"");
    }
    p.exe = std::string(parts[2]);
    file.processes.push_back(std::move(p));
  }
  return file;
}

}  // namespace joule::client
