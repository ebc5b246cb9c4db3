#include "worker/comm/kv_client.h"

#include "absl/strings/str_cat.h"

namespace joule::worker {

absl::StatusOr<std::vector<std::string>> KvAllgather(KvClient& kv, const std::string& name,
                                                     int rank, int size, const std::string& value,
                                                     std::chrono::milliseconds timeout) {
  if (absl::Status s = kv.Set(absl::StrCat(name, "/", rank), value); !s.ok()) return s;
  std::vector<std::string> all;
  all.reserve(size);
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::string> v = kv.Get(absl::StrCat(name, "/", r), timeout);
    if (!v.ok()) return v.status();
    all.push_back(*std::move(v));
  }
  return all;
}

}  // namespace joule::worker
