#ifndef KVSERVE_WORKER_SERVER_GRPC_STATUS_H_
#define KVSERVE_WORKER_SERVER_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace kvserve {

/// The gRPC status carrying the same code and message (absl and gRPC share code numbers).
inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_GRPC_STATUS_H_
