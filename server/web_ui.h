#ifndef JOULE_SERVER_WEB_UI_H_
#define JOULE_SERVER_WEB_UI_H_
// The coordinator's web UI (joule-coordinator --web-ui), on its metrics HTTP port:
//   /ui/            jobs: state, progress, accuracy, energy and power, refreshed every 2 s
//   /ui/job?id=N    a job: live power by rank, energy by phase, loss and accuracy by epoch,
//                   the spec, the log (followed while it runs)
//   /ui/workers     workers: state, job, energy source, its rank's and the job's energy so far
//   /ui/usage       accounting (`joule usage`): by user, sweep, model, device kind, label or
//                   time, per day or week: a table, energy by group and over time
//   /ui/sweeps      sweeps (label sweep=NAME); /ui/sweep?name=S: its cells, jobs and charts
//                   (`joule sweep --html`'s), followed while its jobs run
//   /ui/tunes       `joule tune`'s searches; /ui/tune?name=N: its cells rung by rung, the
//                   choice so far, each cell's path and the front
//   /ui/compare?ids=A,B  jobs side by side: facts, accuracy by epoch and by energy, loss,
//                   energy by phase (up to 8 jobs; the jobs and sweep pages check them)
//   /ui/login       a form taking a client token; a session (a random id in an HttpOnly,
//                   SameSite=Strict cookie, never the token; 12 hours) follows
//   /api/jobs, /api/jobs/N, /api/jobs/N/power, /api/jobs/N/charts, /api/jobs/N/log?after=S,
//   /api/workers, /api/usage, /api/sweeps, /api/sweep?name=S, /api/tunes,
//   /api/tune?name=N, /api/compare?ids=A,B:
//                   the JSON the pages read (common/json_output.h)
// Charts are drawn by the vendored Vega-Lite (third_party/vega, served from /ui/assets/).
// With client tokens configured every page and API call needs one (Authorization: Bearer
// TOKEN, or the login session): a request without is refused with 401; the assets and the
// login page are public. Without tokens (a loopback coordinator) everything is open, as
// its gRPC API is, to requests whose Host is loopback (not to a DNS-rebinding page).
#include <map>
#include <string>

#include "common/http_server.h"
#include "server/coordinator.h"

namespace joule::server {

// Registers the UI's routes on `http` (before it starts). `coordinator` must outlive it.
void InstallWebUi(HttpServer& http, Coordinator* coordinator,
                  std::map<std::string, std::string> client_tokens);

}  // namespace joule::server

#endif  // JOULE_SERVER_WEB_UI_H_
