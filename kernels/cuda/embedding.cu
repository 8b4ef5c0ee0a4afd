#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/launch.cuh"

namespace kvserve::cuda {
namespace {

// One block per token row; threads stride the row. `out` in f32 or bf16 (out_bf16).
__global__ void EmbeddingKernel(const uint8_t* table, DType dtype, int64_t row_bytes, int64_t dim,
                                const int32_t* ids, float* out, bool out_bf16) {
  const int64_t i = blockIdx.x;
  const uint8_t* row = table + static_cast<int64_t>(ids[i]) * row_bytes;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    StoreAct(out, i * dim + c, LoadWeight(row, dtype, c), out_bf16);
  }
}

}  // namespace

cudaError_t EmbeddingGather(const EmbeddingArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return cudaSuccess;
  KVSERVE_LAUNCH(EmbeddingKernel, static_cast<unsigned>(a.n), 256, 0, stream,
                 static_cast<const uint8_t*>(a.table), a.dtype, DTypeRowBytes(a.dtype, a.dim),
                 a.dim, a.ids, a.out, a.out_dtype == DType::kBF16);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
