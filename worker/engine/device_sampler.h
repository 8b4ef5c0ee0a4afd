#ifndef KVSERVE_WORKER_ENGINE_DEVICE_SAMPLER_H_
#define KVSERVE_WORKER_ENGINE_DEVICE_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "worker/engine/sampling_params.h"

namespace kvserve {

/// Samples a step's logits where they were computed (Backend::SampleTopKTopP), so that only the
/// token ids (4 bytes a row) come back to the host instead of whole vocabulary rows.
///
/// The kernel reproduces the host Sampler (sampler.h) exactly for the requests RowParams
/// accepts: same candidates, same order, same float and double arithmetic, and the engine draws
/// each row's uniform from the request's own RNG with Sampler::NextUniform, exactly once per
/// non-greedy token as Sampler::Sample would. A seeded request therefore gets the same tokens
/// whichever path samples it (checked by tests/kernels/cuda/cuda_engine_test.cc).
class DeviceSampler {
 public:
  /// The kernel's parameters for a request (row and uniform left for the caller), or nullopt
  /// when the host sampler does something the kernel does not: log-probabilities, penalties,
  /// min_p, or a non-greedy request without top_k in 1..kMaxSampleTopK below the vocabulary
  /// size (top_k 0 keeps the whole vocabulary; the host draws over the top_k >= vocabulary
  /// candidates in id order). Greedy is top_k 1 at temperature 1 (the argmax, lowest id on
  /// ties). Constrained requests (token masks) are the caller's to exclude.
  static std::optional<SampleRowParams> RowParams(const SamplingParams& params, int32_t vocab_size);

  /// `backend` (a device backend) must outlive the sampler.
  explicit DeviceSampler(Backend* backend) : backend_(backend) {}

  /// tokens[i] = the token rows[i] draws from `logits` ([rows, vocab] in the backend's memory),
  /// or -1 where the host sampler would refuse the row (NaN, +inf, all -inf). Waits for the
  /// result.
  absl::Status Sample(const float* logits, int64_t vocab, std::span<const SampleRowParams> rows,
                      std::span<int32_t> tokens);

 private:
  Backend* backend_;
  DeviceBuffer params_;  // [rows] SampleRowParams, grown as needed
  DeviceBuffer tokens_;  // [rows] int32
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_DEVICE_SAMPLER_H_
