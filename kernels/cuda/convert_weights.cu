#include <algorithm>

#include "kernels/cuda/convert_weights.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace kvserve::cuda {
namespace {

__global__ void ConvertKernel(const uint8_t* src, DType dtype, int64_t row_bytes, int64_t rows,
                              int64_t cols, bool to_f32, void* dst) {
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const float v = LoadWeight(src + (e / cols) * row_bytes, dtype, e % cols);
    if (to_f32) {
      static_cast<float*>(dst)[e] = v;
    } else {
      static_cast<uint16_t*>(dst)[e] = FloatToBf16Bits(v);
    }
  }
}

}  // namespace

cudaError_t ConvertWeights(const void* src, DType dtype, int64_t rows, int64_t cols, DType out,
                           void* dst, cudaStream_t stream) {
  if (out != DType::kBF16 && out != DType::kF32) return cudaErrorInvalidValue;
  const int64_t total = rows * cols;
  if (total <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(total, 256), 1, 65535));
  KVSERVE_LAUNCH(ConvertKernel, blocks, 256, 0, stream, static_cast<const uint8_t*>(src), dtype,
                 DTypeRowBytes(dtype, cols), rows, cols, out == DType::kF32, dst);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
