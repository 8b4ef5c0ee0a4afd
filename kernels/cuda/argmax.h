#ifndef KVSERVE_KERNELS_CUDA_ARGMAX_H_
#define KVSERVE_KERNELS_CUDA_ARGMAX_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvserve::cuda {

/// GPU twin of CpuBackend::ArgMax: out[r] = the first index of the largest logit of row r
/// (NaN never wins). One block per row.
cudaError_t ArgMax(const float* logits, int64_t rows, int64_t vocab, int64_t stride, int32_t* out,
                   cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_ARGMAX_H_
