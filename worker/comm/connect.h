#ifndef JOULE_WORKER_COMM_CONNECT_H_
#define JOULE_WORKER_COMM_CONNECT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/gloo_process_group.h"
#include "worker/comm/kv_client.h"
#include "worker/comm/shm_process_group.h"

namespace joule::worker {

enum class Transport {
  kAuto,  // shared memory when every rank is on this host, else Gloo
  kGloo,  // Gloo over TCP
  kShm,   // shared memory; fails unless every rank is on this host
  kNccl,  // NCCL on CUDA devices (GPU jobs; builds with the CUDA toolkit and NCCL)
};

// "auto", "gloo" or "shm". Errors: INVALID_ARGUMENT naming the value.
absl::StatusOr<Transport> ParseTransport(const std::string& name);
const char* TransportName(Transport t);

struct ConnectOptions {
  Transport transport = Transport::kAuto;
  GlooOptions gloo;
  ShmOptions shm;
  // GPU jobs: NCCL on CUDA device `cuda_device`, or when it is negative on the device
  // numbered by this rank's local rank (its position among the gang's ranks that share
  // its host, by rank), so that one host's ranks take one GPU each.
  bool gpu = false;
  int cuda_device = -1;
};

// This rank's position among the ranks of the gang whose ShmDomain() equals its own, in
// rank order (publishes "domain/<rank>" and reads every rank's). Errors: the store's.
absl::StatusOr<int> LocalRank(int rank, int size, KvClient& kv, std::chrono::milliseconds timeout);

// The identity of the shared-memory domain this process is in: host name, boot id, and the
// IPC, mount, PID and network namespaces (two containers on one host see different
// /dev/shm; peers' liveness is checked by pid; a network namespace stands for a host, so
// ranks in two of them, as on test hosts, use Gloo even when everything else agrees).
std::string ShmDomain();

// Builds rank `rank`'s process group of a gang through the rendezvous store. With `gpu`,
// an NCCL group (FAILED_PRECONDITION in a build without NCCL). With kAuto,
// every rank publishes its ShmDomain(); if all are equal the ranks set up a
// ShmProcessGroup, and if that fails on any rank (all ranks learn of it) or the domains
// differ, they all connect a GlooProcessGroup. `chosen` (optional) receives the transport
// used. Errors: those of the transports' Create.
absl::StatusOr<std::unique_ptr<ProcessGroup>> ConnectProcessGroup(int rank, int size,
                                                                  KvClient& kv,
                                                                  const ConnectOptions& options,
                                                                  Transport* chosen = nullptr);

}  // namespace joule::worker

#endif  // JOULE_WORKER_COMM_CONNECT_H_
