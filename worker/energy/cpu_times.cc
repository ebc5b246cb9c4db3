#include "worker/energy/cpu_times.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace joule::worker {

absl::StatusOr<double> ProcCpuTimes::ProcessSeconds() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return absl::InternalError("getrusage failed");
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

absl::StatusOr<double> ProcCpuTimes::SystemBusySeconds() {
  std::ifstream f(proc_stat_);
  std::string line;
  if (!f || !std::getline(f, line)) {
    return absl::UnavailableError(absl::StrCat(proc_stat_, ": cannot read"));
  }
  // cpu user nice system idle iowait irq softirq steal guest guest_nice (proc(5))
  std::istringstream in(line);
  std::string label;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  if (label != "cpu" || in.fail()) {
    return absl::DataLossError(absl::StrCat(proc_stat_, ": unexpected first line \"", line, "\""));
  }
  static const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (user + nice + system + irq + softirq) / ticks;
}

}  // namespace joule::worker
