#include "common/http_server.h"

#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace joule {

HttpServer::HttpServer() : server_(std::make_unique<httplib::Server>()) {
  server_->set_payload_max_length(64 * 1024);
  // httplib's stop() waits for every connection a client keeps open to reach its keep-alive
  // timeout (5 s by default). A standby coordinator stops its server to hand the port to
  // the leader's, with Prometheus holding a connection between scrapes: 1 s bounds that
  // stop and still serves a browser's burst of requests on one connection.
  server_->set_keep_alive_timeout(1);
}

HttpServer::~HttpServer() {
  if (thread_.joinable()) {
    // httplib's stop() does nothing until the listening loop has begun (is_running()), and
    // a loop that begins after it runs forever: a server destroyed right after Start (a
    // standby coordinator that wins the lease at once) hung its owner. Stop until the loop
    // has ended; a stop after the first is harmless.
    while (!listen_returned_.load()) {
      server_->stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    thread_.join();
  }
}

void HttpServer::Serve(const std::string& path, Handler handler) {
  server_->Get(path, [handler = std::move(handler)](const httplib::Request&,
                                                    httplib::Response& res) {
    Response r = handler();
    res.set_content(r.body, r.content_type.c_str());
  });
}

void HttpServer::ServeRequest(const std::string& pattern, RequestHandler handler, bool post) {
  auto serve = [handler](const httplib::Request& req, httplib::Response& res) {
    Request r;
    r.method = req.method;
    r.path = req.path;
    for (size_t i = 1; i < req.matches.size(); ++i) r.matches.push_back(req.matches[i]);
    for (const auto& [k, v] : req.params) r.params.emplace(k, v);
    for (const auto& [k, v] : req.headers) r.headers.emplace(absl::AsciiStrToLower(k), v);
    r.body = req.body;
    FullResponse out = handler(r);
    res.status = out.status;
    for (const auto& [k, v] : out.headers) res.set_header(k.c_str(), v);
    res.set_content(out.body, out.content_type.c_str());
  };
  server_->Get(pattern, serve);
  if (post) server_->Post(pattern, serve);
}

void HttpServer::ServeMetrics(const std::string& path,
                              std::shared_ptr<prometheus::Registry> registry) {
  Serve(path, [registry] {
    prometheus::TextSerializer serializer;
    return Response{"text/plain; version=0.0.4; charset=utf-8",
                    serializer.Serialize(registry->Collect())};
  });
}

absl::Status HttpServer::Start(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP address \"", address, "\" is not host:port"));
  }
  const std::string host = address.substr(0, colon).empty() ? "0.0.0.0" : address.substr(0, colon);
  if (port == 0) {
    port = server_->bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!server_->bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", address));
  }
  address_ = absl::StrCat(host, ":", port);
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    listen_returned_ = true;
  });
  // Serving when Start returns (and stoppable: see the destructor).
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running() && !listen_returned_.load() &&
         std::chrono::steady_clock::now() < by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

}  // namespace joule
