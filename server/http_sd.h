#ifndef JOULE_SERVER_HTTP_SD_H_
#define JOULE_SERVER_HTTP_SD_H_

#include <string>
#include <vector>

#include "joule/v1/job.pb.h"

namespace joule::server {

// Prometheus HTTP service discovery (https://prometheus.io/docs/prometheus/latest/http_sd/)
// for `workers` (those serving /metrics): one target group each, labelled joule_worker and
// joule_host, with the job and rank it runs now (empty when idle) as __meta_joule_job and
// __meta_joule_rank. Target labels stay put for a worker's life (a changing target label
// would start new series for all of its metrics at every job); the current job and rank
// are __meta_ labels, which relabel_configs can use and which are dropped otherwise.
// Never throws: a name that is not UTF-8 (names are checked at registration) is replaced.
std::string HttpSdJson(const std::vector<v1::WorkerInfo>& workers);

}  // namespace joule::server

#endif  // JOULE_SERVER_HTTP_SD_H_
