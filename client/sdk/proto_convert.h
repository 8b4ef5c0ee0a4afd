#ifndef KVSERVE_CLIENT_SDK_PROTO_CONVERT_H_
#define KVSERVE_CLIENT_SDK_PROTO_CONVERT_H_

// Conversions between the SDK's plain structs (client/sdk/client.h) and the kvserve.v1 protobuf
// messages. Internal to the SDK: include it only from client/sdk and its tests.

#include "absl/status/status.h"
#include "client/sdk/client.h"
#include "kvserve/v1/inference.pb.h"

namespace kvserve::sdk_internal {

/// Fills `out` from `params`; INVALID_ARGUMENT naming the field when a value cannot be sent
/// (negative token ids, both or neither of prompt and prompt_token_ids).
absl::Status ToProto(const GenerateParams& params, v1::GenerateRequest* out);

/// Converts one streamed message.
GenerateChunk FromProto(const v1::GenerateResponse& response);

/// Appends `chunk` to the sample it belongs to, growing `completion->samples` as needed.
void AppendChunk(const GenerateChunk& chunk, Completion* completion);

/// Fills `out` from `params` (any text is valid, the empty one too).
void ToProto(const TokenizeParams& params, v1::TokenizeRequest* out);

/// Fills `out` from `params`; INVALID_ARGUMENT naming the index of a negative token id.
absl::Status ToProto(const DetokenizeParams& params, v1::DetokenizeRequest* out);

}  // namespace kvserve::sdk_internal

#endif  // KVSERVE_CLIENT_SDK_PROTO_CONVERT_H_
