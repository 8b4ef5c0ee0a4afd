#ifndef KVSERVE_KERNELS_SAMPLING_ARGS_H_
#define KVSERVE_KERNELS_SAMPLING_ARGS_H_

// The arguments of Backend::SampleTopKTopP (CPU twin in kernels/cpu/cpu_backend.cc, CUDA kernel
// in kernels/cuda/sampling.cu). Plain data: the CUDA sources read it too.

#include <cstdint>

namespace kvserve {

/// The most candidates SampleTopKTopP keeps per row (SampleRowParams::top_k).
inline constexpr int32_t kMaxSampleTopK = 64;

/// How one row is sampled: exactly what worker/engine/sampler.cc does for a request with
/// temperature -> top_k -> top_p and no penalties or min_p, so that a seeded request draws the
/// same token on the device as on the host (the engine draws `uniform` from its RNG).
struct SampleRowParams {
  /// The logits row to read (several outputs may sample one row: n > 1 forks).
  int64_t row = 0;
  /// The draw, in [0, 1): Sampler::UniformFromBits of the request's next 64-bit draw.
  double uniform = 0.0;
  /// 1: the logits as they are. Else the candidates rank and weigh by
  /// (logit - max) * (1.0f / temperature), TemperatureStep's float arithmetic; > 0.
  float temperature = 1.0f;
  /// < 1: TopPStep's nucleus cut (double sums over the k best); 1: no cut.
  float top_p = 1.0f;
  /// 1 .. kMaxSampleTopK, and below the vocabulary size. Greedy is top_k 1 at temperature 1.
  int32_t top_k = 1;
};

/// One launch of SampleTopKTopP. Pointers are device memory.
struct SampleTopKTopPArgs {
  const float* logits = nullptr;  // [logits rows, stride]
  int64_t vocab = 0;
  int64_t stride = 0;
  const SampleRowParams* params = nullptr;  // [rows]
  int64_t rows = 0;
  /// [rows]: the sampled token id, or -1 where the row holds NaN or +inf or only -inf (the host
  /// sampler refuses those rows).
  int32_t* out = nullptr;
};

}  // namespace kvserve

#endif  // KVSERVE_KERNELS_SAMPLING_ARGS_H_
