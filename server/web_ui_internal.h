#ifndef JOULE_SERVER_WEB_UI_INTERNAL_H_
#define JOULE_SERVER_WEB_UI_INTERNAL_H_
// What the web UI's files share (server/web_ui.cc, server/web_ui_analysis.cc); not an
// interface of its own.
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/http_server.h"
#include "server/coordinator.h"

namespace joule::server::web_ui {

using Request = HttpServer::Request;
using Response = HttpServer::FullResponse;

// A JSON answer, not cached, not sniffed; invalid UTF-8 is replaced, never thrown on.
Response Json(const nlohmann::json& value, int status = 200);
// Whether a request lacks what the UI asks of it (a token, a loopback Host): the refusal
// (401 for the API, the login page for a page), or nothing.
using Refusal = std::function<std::optional<Response>(const Request&, bool api)>;
// A page's handler from its body (HTML with one inline <script>, served as
// /ui/assets/page-NAME.js): the shared head, the refusal, the CSRF cookie.
using PageMaker = std::function<HttpServer::RequestHandler(const char* body, const char* name)>;

// The usage, sweeps, sweep and compare pages and their API (/api/usage, /api/sweeps,
// /api/sweep, /api/compare).
void InstallAnalysisPages(HttpServer& http, Coordinator* c, const Refusal& refused,
                          const PageMaker& page);

}  // namespace joule::server::web_ui

#endif  // JOULE_SERVER_WEB_UI_INTERNAL_H_
