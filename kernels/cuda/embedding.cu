#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/launch.cuh"

namespace kvserve::cuda {
namespace {

// One block per token row; threads stride the row.
__global__ void EmbeddingKernel(const uint8_t* table, DType dtype, int64_t row_bytes, int64_t dim,
                                const int32_t* ids, float* out) {
  const int64_t i = blockIdx.x;
  const uint8_t* row = table + static_cast<int64_t>(ids[i]) * row_bytes;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
    out[i * dim + c] = LoadWeight(row, dtype, c);
}

}  // namespace

cudaError_t EmbeddingGather(const EmbeddingArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return cudaSuccess;
  KVSERVE_LAUNCH(EmbeddingKernel, static_cast<unsigned>(a.n), 256, 0, stream,
                 static_cast<const uint8_t*>(a.table), a.dtype, DTypeRowBytes(a.dtype, a.dim),
                 a.dim, a.ids, a.out);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
