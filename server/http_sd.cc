#include "server/http_sd.h"

#include <nlohmann/json.hpp>

namespace joule::server {

std::string HttpSdJson(const std::vector<v1::WorkerInfo>& workers) {
  nlohmann::json groups = nlohmann::json::array();
  for (const v1::WorkerInfo& w : workers) {
    const bool busy = w.state() == v1::WORKER_STATE_BUSY;
    groups.push_back({{"targets", {w.metrics_address()}},
                      {"labels",
                       {{"joule_worker", w.worker_id()},
                        {"joule_host", w.host()},
                        {"__meta_joule_job", busy ? std::to_string(w.job_id()) : ""},
                        {"__meta_joule_rank", busy ? std::to_string(w.rank()) : ""}}}});
  }
  return groups.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace joule::server
