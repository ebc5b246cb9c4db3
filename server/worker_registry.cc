#include "server/worker_registry.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/carbon_intensity.h"
#include "common/text.h"

namespace joule::server {

namespace {

// A registration's BlasInfo: short valid UTF-8 texts, a bounded feature list and thread
// count (what `joule workers`, the web UI and reports show of it).
absl::Status CheckBlasInfo(const v1::BlasInfo& b) {
  for (const auto& [name, text, limit] : {std::tuple{"blas.library", &b.library(), 32},
                                          {"blas.config", &b.config(), 256},
                                          {"blas.core", &b.core(), 32},
                                          {"blas.cpu_model", &b.cpu_model(), 128},
                                          {"blas.choice", &b.choice(), 512}}) {
    if (absl::Status s = CheckText(name, *text, limit); !s.ok()) return s;
  }
  if (b.cpu_features_size() > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("blas.cpu_features has ", b.cpu_features_size(), " entries, more than 32"));
  }
  for (const std::string& f : b.cpu_features()) {
    if (absl::Status s = CheckText("blas.cpu_features", f, 32); !s.ok()) return s;
  }
  if (b.threads() < 0 || b.threads() > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("blas.threads ", b.threads(), " is out of range [0, 65536]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> WorkerRegistry::Register(const v1::RegisterWorkerRequest& request,
                                                     TimePoint now, int64_t now_unix_ms) {
  if (absl::Status s = CheckText("host", request.host(), 253); !s.ok()) return s;
  if (absl::Status s = CheckText("metrics_address", request.metrics_address(), 261); !s.ok()) {
    return s;
  }
  if (request.energy_sources_size() > 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "energy_sources has ", request.energy_sources_size(), " entries, more than 8"));
  }
  for (const std::string& source : request.energy_sources()) {
    if (absl::Status s = CheckText("energy_sources", source, 32); !s.ok()) return s;
  }
  if (absl::Status s = CheckBlasInfo(request.blas()); !s.ok()) return s;
  if (!request.region().empty()) {
    if (absl::Status s = CheckRegionName("region", request.region()); !s.ok()) return s;
  }
  std::string id = absl::StrCat("w", next_seq_++, ".", boot_);
  // An adopted worker keeps the id an earlier coordinator gave it, which may (a boot token
  // of 16 bits) be one this one would make: never two workers under one id.
  while (workers_.count(id) != 0) id = absl::StrCat("w", next_seq_++, ".", boot_);
  Worker& w = workers_[id];
  w.info.set_worker_id(id);
  w.info.set_host(request.host());
  w.info.set_region(request.region().empty() ? default_region_ : request.region());
  regions_seen_.insert(w.info.region());
  w.info.set_device_kind(request.device_kind() == v1::DEVICE_KIND_GPU ? v1::DEVICE_KIND_GPU
                                                                       : v1::DEVICE_KIND_CPU);
  w.info.set_cores(request.cores());
  w.info.set_pid(request.pid());
  w.info.set_metrics_address(request.metrics_address());
  *w.info.mutable_energy_sources() = request.energy_sources();
  *w.info.mutable_blas() = request.blas();
  if (!std::isfinite(w.info.blas().sgemm_gflops()) || w.info.blas().sgemm_gflops() < 0) {
    w.info.mutable_blas()->set_sgemm_gflops(0);
  }
  w.info.set_memory_bytes(std::max<int64_t>(0, request.memory_bytes()));
  w.info.set_device_memory_bytes(std::max<int64_t>(0, request.device_memory_bytes()));
  w.info.set_state(v1::WORKER_STATE_REGISTERED);
  w.info.set_registered_unix_ms(now_unix_ms);
  w.info.set_last_seen_unix_ms(now_unix_ms);
  w.last_seen = now;
  return id;
}

absl::StatusOr<WorkerRegistry::Worker*> WorkerRegistry::Adopt(
    const v1::RegisterWorkerRequest& request, TimePoint now, int64_t now_unix_ms) {
  const std::string& id = request.resume_worker_id();
  if (absl::Status s = CheckText("resume_worker_id", id, 64); !s.ok()) return s;
  if (id.empty() || workers_.count(id) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("worker \"", SanitizeUtf8(id, 64), "\" cannot be adopted: the id is taken"));
  }
  // The same checks as a new registration (Register), under the worker's own id.
  v1::RegisterWorkerRequest checked = request;
  checked.clear_resume_worker_id();
  absl::StatusOr<std::string> fresh = Register(checked, now, now_unix_ms);
  if (!fresh.ok()) return fresh.status();
  auto node = workers_.extract(*fresh);
  node.key() = id;
  node.mapped().info.set_worker_id(id);
  auto inserted = workers_.insert(std::move(node));
  return &inserted.position->second;
}

absl::Status WorkerRegistry::OpenSession(const std::string& id, std::shared_ptr<SessionSink> sink,
                                         TimePoint now) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker \"", SanitizeUtf8(id, 64), "\" is not registered; register again"));
  }
  if (it->second.sink) {
    return absl::AlreadyExistsError(absl::StrCat("worker \"", id, "\" already has a session"));
  }
  Worker& w = it->second;
  w.sink = std::move(sink);
  if (w.info.state() != v1::WORKER_STATE_BUSY) w.info.set_state(v1::WORKER_STATE_IDLE);
  w.info.set_session_lost_unix_ms(0);
  w.last_seen = now;
  return absl::OkStatus();
}

void WorkerRegistry::Detach(Worker& w, int64_t now_unix_ms) {
  w.sink.reset();
  w.info.set_session_lost_unix_ms(now_unix_ms);
}

WorkerRegistry::Worker* WorkerRegistry::Resumable(const v1::RegisterWorkerRequest& request) {
  if (request.resume_worker_id().empty()) return nullptr;
  Worker* w = Find(request.resume_worker_id());
  if (w == nullptr || w->info.host() != request.host() || w->info.pid() != request.pid() ||
      !RunsAttempt(*w, request.resume_job_id(), request.resume_attempt())) {
    return nullptr;
  }
  return w;
}

WorkerRegistry::Worker* WorkerRegistry::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

void WorkerRegistry::Touch(Worker& w, TimePoint now, int64_t now_unix_ms) {
  w.last_seen = now;
  w.info.set_last_seen_unix_ms(now_unix_ms);
}

std::optional<WorkerRegistry::Worker> WorkerRegistry::Remove(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  Worker w = std::move(it->second);
  workers_.erase(it);
  return w;
}

void WorkerRegistry::Assign(Worker& w, int64_t job_id, int32_t rank, int32_t attempt) {
  w.info.set_state(v1::WORKER_STATE_BUSY);
  w.info.set_job_id(job_id);
  w.info.set_rank(rank);
  w.attempt = attempt;
  w.stop_deadline.reset();
}

void WorkerRegistry::Release(Worker& w) {
  w.stop_deadline.reset();
  w.info.set_state(v1::WORKER_STATE_IDLE);
  w.info.set_job_id(0);
  w.info.set_rank(0);
  w.attempt = 0;
}

bool WorkerRegistry::RunsAttempt(const Worker& w, int64_t job_id, int32_t attempt) {
  return w.info.state() == v1::WORKER_STATE_BUSY && w.info.job_id() == job_id &&
         w.attempt == attempt;
}

std::vector<std::pair<std::string, std::string>> WorkerRegistry::Expired(
    TimePoint now, std::chrono::milliseconds heartbeat_timeout,
    std::chrono::milliseconds stop_timeout) const {
  std::vector<std::pair<std::string, std::string>> lost;
  for (const auto& [id, w] : workers_) {
    if (now - w.last_seen > heartbeat_timeout) {
      lost.emplace_back(
          id, absl::StrCat("no heartbeat for more than ", heartbeat_timeout.count(), " ms"));
    } else if (w.stop_deadline && now > *w.stop_deadline &&
               w.info.state() == v1::WORKER_STATE_BUSY) {
      lost.emplace_back(id, absl::StrCat("still busy ", stop_timeout.count(),
                                         " ms after being told to stop job ", w.info.job_id()));
    }
  }
  return lost;
}

std::vector<WorkerSlot> WorkerRegistry::Slots() const {
  std::vector<WorkerSlot> slots;
  for (const auto& [id, w] : workers_) {
    if (!w.sink) continue;
    slots.push_back(
        {id, w.info.device_kind(), w.info.state() == v1::WORKER_STATE_IDLE, w.info.region()});
  }
  return slots;
}

std::pair<int, int> WorkerRegistry::CountOfKind(v1::DeviceKind kind) const {
  int registered = 0, idle = 0;
  for (const auto& [id, w] : workers_) {
    if (!w.sink || w.info.device_kind() != kind) continue;
    ++registered;
    idle += w.info.state() == v1::WORKER_STATE_IDLE;
  }
  return {registered, idle};
}

std::pair<int64_t, int64_t> WorkerRegistry::LargestMemory(v1::DeviceKind kind) const {
  int64_t host = 0, device = 0;
  for (const auto& [id, w] : workers_) {
    if (w.info.device_kind() != kind) continue;
    host = std::max(host, w.info.memory_bytes());
    device = std::max(device, w.info.device_memory_bytes());
  }
  return {host, device};
}

std::vector<v1::WorkerInfo> WorkerRegistry::List() const {
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w.info);
  return out;
}

std::vector<v1::WorkerInfo> WorkerRegistry::ScrapeTargets() const {
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_) {
    if (!w.info.metrics_address().empty() && w.sink) out.push_back(w.info);
  }
  return out;
}

}  // namespace joule::server
