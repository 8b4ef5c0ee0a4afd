#include "kernels/cuda/argmax.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ranking.cuh"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 256;  // a power of two (BlockBest)

__global__ void ArgMaxKernel(const float* logits, int64_t vocab, int64_t stride, int32_t* out) {
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  const float* row = logits + blockIdx.x * stride;
  float best_v = 0.0f;
  int64_t best_i = -1;  // -1: none yet
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (best_i < 0 || RanksBefore(row[i], i, best_v, best_i)) {
      best_v = row[i];
      best_i = i;
    }
  }
  BlockBest(best_v, best_i, sv, si);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(best_i < 0 ? 0 : best_i);
}

}  // namespace

cudaError_t ArgMax(const float* logits, int64_t rows, int64_t vocab, int64_t stride, int32_t* out,
                   cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  KVSERVE_LAUNCH(ArgMaxKernel, static_cast<unsigned>(rows), kThreads, 0, stream, logits, vocab,
                 stride, out);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
