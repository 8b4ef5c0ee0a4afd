#ifndef KVSERVE_KERNELS_CUDA_CONVERT_WEIGHTS_H_
#define KVSERVE_KERNELS_CUDA_CONVERT_WEIGHTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace kvserve::cuda {

/// Load-time weight conversion, the GPU twin of cpu::ConvertRowToF32 followed by rounding:
/// `src` [rows, cols] in `dtype` (device bytes, GGUF block layouts for q8_0 / q4_0) ->
/// `dst` [rows, cols] in `out` (kBF16, rounded to nearest even, or kF32, exact).
/// Quantized weights are dequantized here: the GEMMs only take 16-bit or f32 weights.
cudaError_t ConvertWeights(const void* src, DType dtype, int64_t rows, int64_t cols, DType out,
                           void* dst, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_CONVERT_WEIGHTS_H_
