#ifndef KVSERVE_KERNELS_CUDA_SAMPLING_H_
#define KVSERVE_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvserve::cuda {

/// Top-k / top-p sampling parameters (see Backend::SampleTopKTopP).
struct SampleArgs {
  const float* logits;  // [rows, stride], device
  int64_t rows, vocab, stride;
  int32_t k;  // 1..64
  float top_p, temperature;
  const float* uniforms;  // [rows], device, in [0, 1)
  int32_t* out;           // [rows], device
};

/// GPU twin of CpuBackend::SampleTopKTopP. One block per row selects the k best logits by k
/// block-wide passes (each pass takes the best logit ranked after the previous pick: no sort,
/// O(k * vocab)), then one thread does the softmax, nucleus cut and draw in the CPU's order.
cudaError_t SampleTopKTopP(const SampleArgs& args, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_SAMPLING_H_
