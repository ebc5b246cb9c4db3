#ifndef JOULE_COMMON_SECURITY_H_
#define JOULE_COMMON_SECURITY_H_

#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace joule {

// TLS for a gRPC server. Plain text is allowed only when asked for (`insecure`) and only
// on a loopback address.
struct ServerTls {
  std::string cert_file;       // PEM certificate chain
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // when set, clients must present a certificate it signed
  bool insecure = false;
};

// TLS for a gRPC client (the CLI, a worker). `ca_file` verifies the server (empty: the
// system roots); `cert_file`/`key_file` are this client's certificate, for servers that
// require one. Plain text only when `insecure` and the target is a loopback address.
struct ClientTls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  bool insecure = false;
};

// True for 127.0.0.0/8, ::1 and "localhost" (the host part of `address`, "host:port").
bool IsLoopbackAddress(const std::string& address);

// Errors: INVALID_ARGUMENT when plain text is asked for off loopback, or neither TLS nor
// plain text is configured; NOT_FOUND naming a PEM file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls, const std::string& listen_address);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTls& tls, const std::string& target);

// Bearer tokens. Read from a file (the whole file, whitespace trimmed) or, when `path` is
// empty, from the environment variable `env`; never logged. Empty when neither is set.
// Errors: NOT_FOUND naming a file that cannot be read; INVALID_ARGUMENT for an empty file,
// or a token with a byte outside printable ASCII (no HTTP/2 header can carry it), naming the
// file or variable and the byte's offset.
absl::StatusOr<std::string> LoadToken(const std::string& path, const char* env);

// The client name Authenticate returns when authentication is off; the coordinator lets it
// cancel any job, so no client in a tokens file may take it.
inline constexpr char kAnonymousClient[] = "anonymous";

// The client tokens a coordinator accepts (token -> name): a file of "NAME TOKEN" lines
// (blank lines and lines starting with # are skipped), each client named so that per-client
// limits can apply. NAME and TOKEN are printable ASCII without spaces. One client may hold
// several tokens (to rotate them); one token may not name two clients.
// Errors: NOT_FOUND for a file that cannot be read; INVALID_ARGUMENT naming the line for a
// line that is not two fields, a byte that is not printable ASCII, the reserved name
// "anonymous", a token that an earlier line already gave (naming that line too), or a file
// with no client at all.
absl::StatusOr<std::map<std::string, std::string>> LoadClientTokens(const std::string& path);

// Adds "authorization: Bearer TOKEN" to a call (nothing for an empty token).
void AddBearer(grpc::ClientContext* ctx, const std::string& token);

// Checks the call's bearer token against `tokens` (token -> client name), in constant time
// per candidate. Returns the client's name; "anonymous" when `tokens` is empty (auth off).
// Errors: UNAUTHENTICATED, naming neither the token sent nor the ones expected.
absl::StatusOr<std::string> Authenticate(const grpc::ServerContextBase& ctx,
                                         const std::map<std::string, std::string>& tokens);
// The same for a token given any other way (an HTTP header or cookie): its client's name,
// "anonymous" when `tokens` is empty. Errors: UNAUTHENTICATED.
absl::StatusOr<std::string> AuthenticateToken(const std::string& sent,
                                              const std::map<std::string, std::string>& tokens);

}  // namespace joule

#endif  // JOULE_COMMON_SECURITY_H_
