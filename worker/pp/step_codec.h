#ifndef KVSERVE_WORKER_PP_STEP_CODEC_H_
#define KVSERVE_WORKER_PP_STEP_CODEC_H_

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvserve/v1/pipeline.pb.h"
#include "worker/kv/kv_manager.h"
#include "worker/model/llama_model.h"

namespace kvserve {

/// Writes `batch`'s arrays and `copies` into `msg` (the hand-over is set by the caller).
void EncodeStep(const ForwardBatch& batch, std::span<const BlockCopy> copies,
                v1::PipelineStep* msg);

/// A view of `msg`'s batch (pointing into `msg`, which must outlive it). INVALID_ARGUMENT when
/// the arrays disagree in size; LlamaModel::Forward checks the rest.
absl::StatusOr<ForwardBatch> DecodeStep(const v1::PipelineStep& msg);

/// `floats` as little-endian bytes (the wire form of hand-overs and logits), and back.
void FloatsToBytes(std::span<const float> floats, std::string* bytes);
/// INVALID_ARGUMENT (naming `what`) unless `bytes` holds exactly `count` floats.
absl::Status BytesToFloats(const std::string& bytes, int64_t count, const char* what,
                           float* floats);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PP_STEP_CODEC_H_
