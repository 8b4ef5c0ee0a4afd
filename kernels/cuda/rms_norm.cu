#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rms_norm.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row: residual add (x becomes the new stream), sum of squares, scale. x (and the
// residual) in x_dtype, y in y_dtype (f32 or bf16); the sum runs in f32 on the values as
// stored, so a bf16 y is rounded once.
__global__ void RmsNormKernel(cpu::RmsNormArgs a, int64_t residual_stride) {
  const int64_t r = blockIdx.x;
  const bool x_bf16 = a.x_dtype == DType::kBF16;
  const bool y_bf16 = a.y_dtype == DType::kBF16;
  const int64_t x_row = r * a.x_stride;
  const int64_t res_row = r * residual_stride;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) {
    float v = LoadAct(a.x, x_row + i, x_bf16);
    if (a.residual != nullptr) {
      v += LoadAct(a.residual, res_row + i, x_bf16);
      StoreAct(a.x, x_row + i, v, x_bf16);
      if (x_bf16) v = LoadAct(a.x, x_row + i, true);  // the stream as stored
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
  const int64_t y_row = r * a.y_stride;
  for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) {
    StoreAct(a.y, y_row + i, LoadAct(a.x, x_row + i, x_bf16) * inv * a.weight[i], y_bf16);
  }
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
