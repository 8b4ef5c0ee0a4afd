#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/silu_mul.h"

namespace kvserve::cuda {
namespace {

// gate, up and out in a.dtype (f32 or bf16), computed in f32.
__global__ void SiluMulKernel(SiluMulArgs a) {
  const bool bf16 = a.dtype == DType::kBF16;
  const int64_t total = a.rows * a.dim;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / a.dim;
    const int64_t i = e % a.dim;
    const float g = LoadAct(a.gate, r * a.gate_stride + i, bf16);
    const float u = LoadAct(a.up, r * a.up_stride + i, bf16);
    StoreAct(a.out, r * a.out_stride + i, g / (1.0f + expf(-g)) * u, bf16);
  }
}

}  // namespace

cudaError_t SiluMul(const SiluMulArgs& args, cudaStream_t stream) {
  const int64_t total = args.rows * args.dim;
  if (total <= 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>(CeilDiv(total, 256), 65535);
  KVSERVE_LAUNCH(SiluMulKernel, static_cast<unsigned>(blocks), 256, 0, stream, args);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
