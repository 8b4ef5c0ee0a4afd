#include "worker/engine/device_sampler.h"

#include <utility>

#include "worker/engine/sampling_penalties.h"

namespace kvserve {
namespace {

/// Grows `buffer` to at least `bytes` of `backend`'s memory.
absl::Status Reserve(Backend* backend, DeviceBuffer* buffer, size_t bytes) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  absl::StatusOr<DeviceBuffer> grown = backend->AllocBuffer(bytes);
  if (!grown.ok()) return grown.status();
  *buffer = std::move(*grown);
  return absl::OkStatus();
}

}  // namespace

std::optional<SampleRowParams> DeviceSampler::RowParams(const SamplingParams& params,
                                                        int32_t vocab_size) {
  // Sampler::Sample's paths (sampler.cc): log-probabilities and penalties need the whole row
  // on the host; min_p is a step the kernel lacks.
  if (params.logprobs >= 0 || PenaltyStep::Needed(params)) return std::nullopt;
  SampleRowParams row;
  if (params.IsGreedy()) return row;  // top_k 1, temperature 1, top_p 1: the argmax
  if (params.min_p > 0.0f || params.top_k < 1 || params.top_k > kMaxSampleTopK ||
      params.top_k >= vocab_size) {
    return std::nullopt;
  }
  // BuildSamplingSteps: temperature (unless 1), top_k, top_p (unless 1), then Draw.
  row.temperature = params.temperature;
  row.top_p = params.top_p;
  row.top_k = params.top_k;
  return row;
}

absl::Status DeviceSampler::Sample(const float* logits, int64_t vocab,
                                   std::span<const SampleRowParams> rows,
                                   std::span<int32_t> tokens) {
  if (rows.empty()) return absl::OkStatus();
  if (absl::Status s = Reserve(backend_, &params_, rows.size_bytes()); !s.ok()) return s;
  if (absl::Status s = Reserve(backend_, &tokens_, tokens.size_bytes()); !s.ok()) return s;
  if (absl::Status s = backend_->CopyToDevice(params_.get(), rows.data(), rows.size_bytes());
      !s.ok()) {
    return s;
  }
  backend_->SampleTopKTopP({logits, vocab, vocab, params_.as<SampleRowParams>(),
                            static_cast<int64_t>(rows.size()), tokens_.as<int32_t>()});
  return backend_->CopyToHost(tokens.data(), tokens_.get(), tokens.size_bytes());
}

}  // namespace kvserve
