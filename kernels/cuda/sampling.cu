#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ranking.cuh"
#include "kernels/cuda/sampling.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxK = 64;

__global__ void SampleKernel(SampleArgs a, int32_t k) {
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  __shared__ float top_v[kMaxK];
  __shared__ int64_t top_i[kMaxK];
  const float* row = a.logits + blockIdx.x * a.stride;
  float prev_v = 0.0f;
  int64_t prev_i = -1;
  for (int32_t round = 0; round < k; ++round) {
    float best_v = 0.0f;
    int64_t best_i = -1;
    for (int64_t i = threadIdx.x; i < a.vocab; i += blockDim.x) {
      const float v = row[i];
      if (prev_i >= 0 && !RanksBefore(prev_v, prev_i, v, i)) continue;  // already taken
      if (best_i < 0 || RanksBefore(v, i, best_v, best_i)) {
        best_v = v;
        best_i = i;
      }
    }
    BlockBest(best_v, best_i, sv, si);
    if (threadIdx.x == 0) {
      top_v[round] = best_v;
      top_i[round] = best_i;
    }
    prev_v = best_v;
    prev_i = best_i;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float e[kMaxK];
  const float top = top_v[0];
  float sum = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    e[i] = expf((top_v[i] - top) / a.temperature);
    sum += e[i];
  }
  int32_t n = k;
  float cum = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    cum += e[i];
    if (cum / sum >= a.top_p) {
      n = i + 1;
      break;
    }
  }
  float kept = 0.0f;
  for (int32_t i = 0; i < n; ++i) kept += e[i];
  const float target = a.uniforms[blockIdx.x] * kept;
  int32_t pick = n - 1;
  float walk = 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    walk += e[i];
    if (walk > target) {
      pick = i;
      break;
    }
  }
  a.out[blockIdx.x] = static_cast<int32_t>(top_i[pick]);
}

}  // namespace

cudaError_t SampleTopKTopP(const SampleArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  const int32_t k = static_cast<int32_t>(
      std::min<int64_t>(std::clamp(args.k, 1, kMaxK), std::max<int64_t>(args.vocab, 1)));
  KVSERVE_LAUNCH(SampleKernel, static_cast<unsigned>(args.rows), kThreads, 0, stream, args, k);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
