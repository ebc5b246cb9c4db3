#include "server/rendezvous_kv.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace joule::server {

void RendezvousKv::OpenScope(const std::string& scope) {
  std::lock_guard<std::mutex> lock(mu_);
  scopes_[scope];
}

void RendezvousKv::CloseScope(const std::string& scope) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    scopes_.erase(scope);
  }
  changed_.notify_all();
}

size_t RendezvousKv::ScopeCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scopes_.size();
}

absl::Status RendezvousKv::Set(const std::string& scope, const std::string& key,
                               std::string value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous key of ", key.size(), " bytes (want 1..", kMaxKeyBytes, ")"));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous value for \"", key, "\" is ",
                                                   value.size(), " bytes, more than ",
                                                   kMaxValueBytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = scopes_.find(scope);
    if (it == scopes_.end()) {
      return absl::NotFoundError(absl::StrCat("rendezvous scope \"", scope, "\" is not open"));
    }
    if (it->second.size() >= kMaxKeysPerScope && !it->second.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous scope \"", scope, "\" is full (", kMaxKeysPerScope, " keys)"));
    }
    it->second[key] = std::move(value);
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status RendezvousKv::WaitLocked(std::unique_lock<std::mutex>& lock,
                                      const std::string& scope,
                                      const std::vector<std::string>& keys,
                                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool opened = scopes_.contains(scope);
  if (!opened) {
    return absl::NotFoundError(absl::StrCat("rendezvous scope \"", scope, "\" is not open"));
  }
  while (true) {
    auto it = scopes_.find(scope);
    if (it == scopes_.end()) {
      return absl::AbortedError(absl::StrCat("rendezvous scope \"", scope, "\" was closed"));
    }
    std::vector<std::string> missing;
    for (const std::string& k : keys) {
      if (!it->second.contains(k)) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous scope \"", scope, "\": timed out after ", timeout.count(),
                       " ms waiting for keys ", absl::StrJoin(missing, ", ")));
    }
  }
}

absl::StatusOr<std::string> RendezvousKv::Get(const std::string& scope, const std::string& key,
                                              std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (absl::Status s = WaitLocked(lock, scope, {key}, timeout); !s.ok()) return s;
  return scopes_[scope][key];
}

absl::Status RendezvousKv::Wait(const std::string& scope, const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return WaitLocked(lock, scope, keys, timeout);
}

}  // namespace joule::server
