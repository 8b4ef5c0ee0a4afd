#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_combine.h"

namespace kvserve::cuda {
namespace {

// One thread per (token, dim) element: the token's slots are summed in order, so the result
// does not depend on the batch.
__global__ void MoeCombineKernel(MoeCombineArgs a) {
  const int64_t total = a.tokens * a.dim;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = e / a.dim;
    const int64_t d = e % a.dim;
    float acc = 0.0f;
    for (int64_t j = 0; j < a.k; ++j) {
      const int32_t slot = a.slots[t * a.k + j];
      if (slot < 0) continue;
      acc += a.weights[t * a.k + j] * a.rows[int64_t{slot} * a.dim + d];
    }
    a.out[e] = acc;
  }
}

}  // namespace

cudaError_t MoeCombine(const MoeCombineArgs& args, cudaStream_t stream) {
  const int64_t total = args.tokens * args.dim;
  if (total <= 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>(CeilDiv(total, 256), 65535);
  KVSERVE_LAUNCH(MoeCombineKernel, static_cast<unsigned>(blocks), 256, 0, stream, args);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
