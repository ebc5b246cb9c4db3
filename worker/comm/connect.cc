#include "worker/comm/connect.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#ifdef JOULE_WITH_NCCL
#include "worker/comm/nccl_process_group.h"
#endif

namespace joule::worker {

absl::StatusOr<Transport> ParseTransport(const std::string& name) {
  if (name == "auto") return Transport::kAuto;
  if (name == "gloo") return Transport::kGloo;
  if (name == "shm") return Transport::kShm;
  return absl::InvalidArgumentError(
      absl::StrCat("transport \"", name, "\" is unknown (want auto, gloo or shm)"));
}

const char* TransportName(Transport t) {
  switch (t) {
    case Transport::kAuto: return "auto";
    case Transport::kGloo: return "gloo";
    case Transport::kShm: return "shm";
    case Transport::kNccl: return "nccl";
  }
  return "?";
}

std::string ShmDomain() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::error_code ec;
  const std::string ipc = std::filesystem::read_symlink("/proc/self/ns/ipc", ec).string();
  const std::string mnt = std::filesystem::read_symlink("/proc/self/ns/mnt", ec).string();
  // The PID namespace too: the shared-memory group checks its peers' liveness by pid.
  const std::string pid = std::filesystem::read_symlink("/proc/self/ns/pid", ec).string();
  // And the network namespace: a namespace models a host (scripts/netns-hosts.sh), and
  // ranks in different ones are on different hosts as far as the gang is concerned.
  const std::string net = std::filesystem::read_symlink("/proc/self/ns/net", ec).string();
  return absl::StrCat(host, "|", boot, "|", ipc, "|", mnt, "|", pid, "|", net);
}

absl::StatusOr<int> LocalRank(int rank, int size, KvClient& kv,
                              std::chrono::milliseconds timeout) {
  const std::string mine = ShmDomain();
  absl::StatusOr<std::vector<std::string>> domains =
      KvAllgather(kv, "domain", rank, size, mine, timeout);
  if (!domains.ok()) return domains.status();
  return static_cast<int>(std::count(domains->begin(), domains->begin() + rank, mine));
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ConnectProcessGroup(int rank, int size,
                                                                  KvClient& kv,
                                                                  const ConnectOptions& options,
                                                                  Transport* chosen) {
  if (options.gpu || options.transport == Transport::kNccl) {
#ifdef JOULE_WITH_NCCL
    NcclOptions nccl;
    nccl.timeout = options.gloo.timeout;
    nccl.device = options.cuda_device;
    if (nccl.device < 0) {
      absl::StatusOr<int> local = LocalRank(rank, size, kv, options.gloo.timeout);
      if (!local.ok()) return local.status();
      nccl.device = *local;
    }
    auto pg = NcclProcessGroup::Create(rank, size, kv, nccl);
    if (!pg.ok()) return pg.status();
    if (chosen) *chosen = Transport::kNccl;
    return std::unique_ptr<ProcessGroup>(*std::move(pg));
#else
    return absl::FailedPreconditionError(
        "a GPU job needs a worker built with the CUDA toolkit and NCCL (see README, GPU builds)");
#endif
  }
  bool try_shm = options.transport == Transport::kShm;
  if (options.transport == Transport::kAuto) {
    const std::string mine = ShmDomain();
    absl::StatusOr<std::vector<std::string>> domains =
        KvAllgather(kv, "domain", rank, size, mine, options.gloo.timeout);
    if (!domains.ok()) return domains.status();
    try_shm = std::count(domains->begin(), domains->end(), mine) == size;
  }
  if (try_shm) {
    ShmOptions shm = options.shm;
    shm.timeout = options.gloo.timeout;
    auto pg = ShmProcessGroup::Create(rank, size, kv, shm);
    if (pg.ok()) {
      if (chosen) *chosen = Transport::kShm;
      return std::unique_ptr<ProcessGroup>(*std::move(pg));
    }
    // Every rank sees the same outcome (see ShmProcessGroup::Create), so all fall back.
    if (options.transport == Transport::kShm || !absl::IsUnavailable(pg.status())) {
      return pg.status();
    }
    spdlog::warn("rank {}: shared memory unavailable, using Gloo over TCP: {}", rank,
                 pg.status().ToString());
  }
  auto pg = GlooProcessGroup::Create(rank, size, kv, options.gloo);
  if (!pg.ok()) return pg.status();
  if (chosen) *chosen = Transport::kGloo;
  return std::unique_ptr<ProcessGroup>(*std::move(pg));
}

}  // namespace joule::worker
