#ifndef JOULE_COMMON_HTTP_SERVER_H_
#define JOULE_COMMON_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace prometheus {
class Registry;
}

namespace joule {

// A small HTTP server (cpp-httplib) for what Joule exposes to Prometheus: /metrics in the
// Prometheus text format from a prometheus-cpp Registry, and JSON endpoints such as the
// coordinator's http_sd. GET only; the listener runs on its own thread.
//
// (Not civetweb, which prometheus-cpp's Exposer uses: Debian's civetweb gives its threads
// 100 KiB stacks, too small for the static TLS of a process that loads LibTorch, so it
// cannot start inside a worker: "Cannot create first worker thread".)
//
// Register handlers with Serve*() before Start(). Handlers run on the server's threads and
// must be thread-safe.
class HttpServer {
 public:
  struct Response {
    std::string content_type;
    std::string body;
  };
  using Handler = std::function<Response()>;
  // What a handler of ServeRequest sees of a request.
  struct Request {
    std::string method;                          // "GET" or "POST"
    std::string path;
    std::vector<std::string> matches;            // the path pattern's groups
    std::map<std::string, std::string> params;   // query (and form, for POST) parameters
    std::map<std::string, std::string> headers;  // names lower-case
    std::string body;
  };
  struct FullResponse {
    int status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;  // e.g. Set-Cookie, Location
  };
  using RequestHandler = std::function<FullResponse(const Request&)>;

  HttpServer();
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves `registry` at `path` (text exposition format 0.0.4).
  void ServeMetrics(const std::string& path, std::shared_ptr<prometheus::Registry> registry);
  void Serve(const std::string& path, Handler handler);
  // GET (and, with `post`, POST) requests whose path matches `pattern` (an ECMAScript
  // regular expression over the whole path, e.g. "/api/jobs/(\\d+)"). Bodies of at most
  // 64 KiB are read.
  void ServeRequest(const std::string& pattern, RequestHandler handler, bool post = false);

  // Listens on `address` ("host:port"; port 0 picks a free one). Errors: INVALID_ARGUMENT
  // for an address without a port, UNAVAILABLE naming the address when it cannot be bound.
  absl::Status Start(const std::string& address);
  // "host:port" as bound; empty before Start.
  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};  // the listening thread's loop has ended
  std::string address_;
};

}  // namespace joule

#endif  // JOULE_COMMON_HTTP_SERVER_H_
