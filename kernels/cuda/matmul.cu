#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/matmul.h"

namespace kvserve::cuda {
namespace {

// x [m, k] (row stride x_stride) -> dense [m, k] in 16-bit `to_bf16 ? bf16 : f16`.
__global__ void ConvertActivations(const float* x, int64_t x_stride, int64_t m, int64_t k,
                                   bool to_bf16, uint16_t* out) {
  const int64_t total = m * k;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[(e / k) * x_stride + e % k];
    out[e] = to_bf16 ? FloatToBf16Bits(v) : __half_as_ushort(__float2half_rn(v));
  }
}

__global__ void AddBias(float* y, int64_t y_stride, int64_t m, int64_t n, const float* bias) {
  const int64_t total = m * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    y[(e / n) * y_stride + e % n] += bias[e % n];
  }
}

unsigned Blocks(int64_t total) {
  return static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(total, 256), 1, 65535));
}

}  // namespace

size_t MatmulScratchBytes(const cpu::MatmulArgs& a) {
  return a.w_dtype == DType::kF32 ? 0 : sizeof(uint16_t) * a.m * a.k;
}

const char* Matmul(const cpu::MatmulArgs& a, cublasHandle_t handle, void* scratch,
                   cudaStream_t stream) {
  if (a.m <= 0 || a.n <= 0) return nullptr;
  const float alpha = 1.0f;
  const float beta = 0.0f;
  // Row-major y[m, n] is column-major y^T [n, m] = W [n, k] (column-major W^T, ld k, transposed)
  // times x^T [k, m] (column-major, ld x_stride).
  const void* x = a.x;
  int64_t ldx = a.x_stride;
  cudaDataType_t type = CUDA_R_32F;
  if (a.w_dtype == DType::kBF16 || a.w_dtype == DType::kF16) {
    const bool bf16 = a.w_dtype == DType::kBF16;
    KVSERVE_LAUNCH(ConvertActivations, Blocks(a.m * a.k), 256, 0, stream, a.x, a.x_stride, a.m, a.k,
                   bf16, static_cast<uint16_t*>(scratch));
    if (cudaGetLastError() != cudaSuccess) return "activation conversion launch failed";
    x = scratch;
    ldx = a.k;
    type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  } else if (a.w_dtype != DType::kF32) {
    return "cuda matmul: quantized weights must be converted at load";
  }
  const cublasStatus_t st =
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(a.n), static_cast<int>(a.m),
                   static_cast<int>(a.k), &alpha, a.w, type, static_cast<int>(a.k), x, type,
                   static_cast<int>(ldx), &beta, a.y, CUDA_R_32F, static_cast<int>(a.y_stride),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return cublasGetStatusString(st);
  if (a.bias != nullptr) {
    KVSERVE_LAUNCH(AddBias, Blocks(a.m * a.n), 256, 0, stream, a.y, a.y_stride, a.m, a.n, a.bias);
    if (cudaGetLastError() != cudaSuccess) return "bias launch failed";
  }
  return nullptr;
}

}  // namespace kvserve::cuda
