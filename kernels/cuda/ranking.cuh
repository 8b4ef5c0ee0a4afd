#ifndef KVSERVE_KERNELS_CUDA_RANKING_CUH_
#define KVSERVE_KERNELS_CUDA_RANKING_CUH_

// The total order of logits used by argmax and top-k: larger value first, the lower index on
// ties, NaN last (CpuBackend's RanksBefore).

#include <cstdint>

namespace kvserve::cuda {

__device__ __forceinline__ bool RanksBefore(float va, int64_t a, float vb, int64_t b) {
  if (isnan(vb)) return !isnan(va) || a < b;
  if (isnan(va)) return false;
  return va > vb || (va == vb && a < b);
}

// Block-wide best (value, index) under RanksBefore; every thread gets the result. `shared_v`
// and `shared_i` hold blockDim.x entries.
__device__ inline void BlockBest(float& v, int64_t& i, float* shared_v, int64_t* shared_i) {
  shared_v[threadIdx.x] = v;
  shared_i[threadIdx.x] = i;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float ov = shared_v[threadIdx.x + half];
      const int64_t oi = shared_i[threadIdx.x + half];
      if (oi >= 0 && (shared_i[threadIdx.x] < 0 ||
                      RanksBefore(ov, oi, shared_v[threadIdx.x], shared_i[threadIdx.x]))) {
        shared_v[threadIdx.x] = ov;
        shared_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  v = shared_v[0];
  i = shared_i[0];
  __syncthreads();
}

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_RANKING_CUH_
