#ifndef JOULE_COMMON_GRPC_STATUS_H_
#define JOULE_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace joule {

// Converts between absl::Status and grpc::Status; the canonical codes are the same
// numbers in both (google.rpc.Code), and the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace joule

#endif  // JOULE_COMMON_GRPC_STATUS_H_
