#include "common/security.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace joule {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string HostOf(const std::string& address) {
  std::string host = address;
  if (absl::StartsWith(host, "ipv4:")) host = host.substr(5);
  if (absl::StartsWith(host, "[")) return host.substr(1, host.find(']') - 1);
  const size_t colon = host.rfind(':');
  return colon == std::string::npos ? host : host.substr(0, colon);
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  const std::string host = HostOf(address);
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls, const std::string& listen_address) {
  if (tls.cert_file.empty() && tls.key_file.empty()) {
    if (!tls.insecure) {
      return absl::InvalidArgumentError(
          "no TLS certificate: give --tls-cert and --tls-key, or --insecure for plain text "
          "on a loopback address");
    }
    if (!IsLoopbackAddress(listen_address)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plain text is only allowed on loopback; ", listen_address,
          " is not (give --tls-cert and --tls-key)"));
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  auto cert = ReadFile(tls.cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(tls.key_file, "TLS key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadFile(tls.client_ca_file, "client CA");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTls& tls, const std::string& target) {
  if (tls.insecure) {
    if (!IsLoopbackAddress(target)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plain text is only allowed to loopback; ", target, " is not (give --tls-ca)"));
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  if (!tls.ca_file.empty()) {
    auto ca = ReadFile(tls.ca_file, "TLS CA");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  if (!tls.cert_file.empty() || !tls.key_file.empty()) {
    auto cert = ReadFile(tls.cert_file, "TLS client certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadFile(tls.key_file, "TLS client key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

namespace {

// The first byte of `s` outside printable ASCII (0x21..0x7E), or npos. A token travels in an
// HTTP/2 header, which carries nothing else; a name is shown in `joule list` and logs.
size_t FirstNonPrintable(absl::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x21 || c > 0x7E) return i;
  }
  return absl::string_view::npos;
}

}  // namespace

absl::StatusOr<std::string> LoadToken(const std::string& path, const char* env) {
  std::string token;
  std::string source;
  if (path.empty()) {
    const char* v = env ? std::getenv(env) : nullptr;
    token = std::string(v ? absl::StripAsciiWhitespace(v) : "");
    source = absl::StrCat("$", env ? env : "");
  } else {
    auto text = ReadFile(path, "token file");
    if (!text.ok()) return text.status();
    token = std::string(absl::StripAsciiWhitespace(*text));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
    }
    source = absl::StrCat("token file ", path);
  }
  // gRPC refuses (aborts on) a header with such a byte; no server could accept it anyway.
  if (size_t i = FirstNonPrintable(token); i != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": byte ", i, " of the token is not printable ASCII (0x",
        absl::Hex(static_cast<unsigned char>(token[i]), absl::kZeroPad2), ")"));
  }
  return token;
}

absl::StatusOr<std::map<std::string, std::string>> LoadClientTokens(const std::string& path) {
  auto text = ReadFile(path, "client tokens file");
  if (!text.ok()) return text.status();
  std::map<std::string, std::string> tokens;
  std::map<std::string, int> token_line;  // token -> the line that named it
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat("client tokens file ", path, " line ", line_no, ": ");
    std::vector<std::string> parts = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "want \"NAME TOKEN\", found ", parts.size(), " fields (comments start a line "
          "with #)"));
    }
    const std::string& name = parts[0];
    const std::string& token = parts[1];
    if (size_t i = FirstNonPrintable(name); i != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "the name has a byte that is not printable ASCII at offset ", i));
    }
    if (size_t i = FirstNonPrintable(token); i != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "the token has a byte that is not printable ASCII at offset ", i,
          " (no client could send it)"));
    }
    if (name == kAnonymousClient) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "the name \"", kAnonymousClient, "\" is reserved (it means authentication is "
          "off, and may cancel any job); choose another"));
    }
    if (auto [it, inserted] = token_line.emplace(token, line_no); !inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "the same token as line ", it->second, "; each client needs its own token"));
    }
    tokens[token] = name;
  }
  if (tokens.empty()) {
    // An empty file must not mean "no authentication".
    return absl::InvalidArgumentError(absl::StrCat("client tokens file ", path,
                                                   " holds no \"NAME TOKEN\" line"));
  }
  return tokens;
}

void AddBearer(grpc::ClientContext* ctx, const std::string& token) {
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
}

absl::StatusOr<std::string> Authenticate(const grpc::ServerContextBase& ctx,
                                         const std::map<std::string, std::string>& tokens) {
  if (tokens.empty()) return std::string(kAnonymousClient);
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError("no bearer token (authorization: Bearer TOKEN)");
  }
  const std::string value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, "Bearer ")) {
    return absl::UnauthenticatedError("authorization is not a bearer token");
  }
  return AuthenticateToken(value.substr(7), tokens);
}

absl::StatusOr<std::string> AuthenticateToken(const std::string& sent,
                                              const std::map<std::string, std::string>& tokens) {
  if (tokens.empty()) return std::string(kAnonymousClient);
  for (const auto& [token, name] : tokens) {
    if (token.size() == sent.size() && CRYPTO_memcmp(token.data(), sent.data(), sent.size()) == 0) {
      return name;
    }
  }
  return absl::UnauthenticatedError("bearer token not accepted");
}

}  // namespace joule
