#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rms_norm.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row: residual add (x becomes the new stream), sum of squares, scale.
__global__ void RmsNormKernel(cpu::RmsNormArgs a, int64_t residual_stride) {
  const int64_t r = blockIdx.x;
  float* x = a.x + r * a.x_stride;
  const float* res = a.residual != nullptr ? a.residual + r * residual_stride : nullptr;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) {
    float v = x[i];
    if (res != nullptr) {
      v += res[i];
      x[i] = v;
    }
    sq += v * v;
  }
  __shared__ float warp_sums[kThreads / kWarp];
  sq = WarpSum(sq);
  if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = sq;
  __syncthreads();
  if (threadIdx.x < kWarp) {
    float s = threadIdx.x < kThreads / kWarp ? warp_sums[threadIdx.x] : 0.0f;
    s = WarpSum(s);
    if (threadIdx.x == 0) warp_sums[0] = s;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(warp_sums[0] / static_cast<float>(a.dim) + a.eps);
  float* y = a.y + r * a.y_stride;
  for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) y[i] = x[i] * inv * a.weight[i];
}

}  // namespace

cudaError_t RmsNorm(const cpu::RmsNormArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return cudaSuccess;
  const int64_t residual_stride = args.residual_stride != 0 ? args.residual_stride : args.dim;
  KVSERVE_LAUNCH(RmsNormKernel, static_cast<unsigned>(args.rows), kThreads, 0, stream, args,
                 residual_stride);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
