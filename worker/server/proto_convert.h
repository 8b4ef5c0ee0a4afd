#ifndef KVSERVE_WORKER_SERVER_PROTO_CONVERT_H_
#define KVSERVE_WORKER_SERVER_PROTO_CONVERT_H_

// Conversions between the kvserve.v1 protos and the engine's types. Free of grpcpp so the
// mapping can be unit-tested without a server.

#include <cstdint>

#include "absl/status/statusor.h"
#include "kvserve/v1/inference.pb.h"
#include "kvserve/v1/worker.pb.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"

namespace kvserve {

/// max_tokens when a GenerateRequest leaves it 0 (vLLM's and the OpenAI API's default).
inline constexpr int32_t kDefaultMaxTokens = 16;

/// Builds the engine request for `request` (request_id is copied as is; the caller fills an
/// empty one). Unset optional fields take the defaults the proto documents; a text prompt is
/// tokenized with the model's tokenizer. INVALID_ARGUMENT names the field for what can be checked
/// without the engine (prompt/prompt_token_ids presence, ids outside the vocabulary, invalid
/// UTF-8 in the prompt or a stop string); the engine's Submit checks the rest (sampling ranges,
/// stop string counts and lengths, n, context length, max_tokens).
absl::StatusOr<EngineRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                              const LoadedModel& model);

/// The proto form of an engine finish reason. An aborted sample (status CANCELLED) maps to
/// FINISH_REASON_ABORT; callers handle that case themselves.
v1::FinishReason ToProtoFinishReason(FinishReason reason);

/// Fills the per-message fields of `response` from one engine output: index, token_ids, text,
/// logprobs and, when the sample finished, finish_reason, stop_reason and usage. Leaves
/// request_id and worker alone. An output with a CANCELLED status becomes FINISH_REASON_ABORT.
void ToGenerateResponse(const RequestOutput& output, v1::GenerateResponse* response);

/// A LoadReport from the engine's latest statistics.
void ToLoadReport(const EngineStats& stats, int32_t block_size, bool draining,
                  v1::LoadReport* report);

/// A KvEventBatch proto from the engine's batch.
void ToProtoKvEventBatch(const KvEventBatch& batch, v1::KvEventBatch* proto);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_PROTO_CONVERT_H_
