#include "worker/agent/grpc_kv_client.h"

#include <grpcpp/grpcpp.h>

#include "common/grpc_status.h"
#include "common/security.h"

namespace joule::worker {
namespace {

// The RPC deadline: the server-side wait plus slack for the round trip.
void Prepare(grpc::ClientContext& ctx, std::chrono::milliseconds wait, const std::string& token) {
  ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(10));
  AddBearer(&ctx, token);
}

}  // namespace

absl::Status GrpcKvClient::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  Prepare(ctx, std::chrono::milliseconds(0), token_);
  v1::KvSetRequest req;
  req.set_prefix(prefix_);
  req.set_key(key);
  req.set_value(value);
  v1::KvSetResponse resp;
  return FromGrpcStatus(stub_->KvSet(&ctx, req, &resp));
}

absl::StatusOr<std::string> GrpcKvClient::Get(const std::string& key,
                                              std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  Prepare(ctx, timeout, token_);
  v1::KvGetRequest req;
  req.set_prefix(prefix_);
  req.set_key(key);
  req.set_timeout_ms(static_cast<int32_t>(timeout.count()));
  v1::KvGetResponse resp;
  grpc::Status s = stub_->KvGet(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.value();
}

absl::Status GrpcKvClient::Wait(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  Prepare(ctx, timeout, token_);
  v1::KvWaitRequest req;
  req.set_prefix(prefix_);
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_ms(static_cast<int32_t>(timeout.count()));
  v1::KvWaitResponse resp;
  return FromGrpcStatus(stub_->KvWait(&ctx, req, &resp));
}

}  // namespace joule::worker
