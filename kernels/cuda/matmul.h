#ifndef KVSERVE_KERNELS_CUDA_MATMUL_H_
#define KVSERVE_KERNELS_CUDA_MATMUL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cpu/matmul.h"

namespace kvserve::cuda {

/// Bytes of scratch Matmul needs for `args` (x converted to the weights' 16-bit type).
size_t MatmulScratchBytes(const cpu::MatmulArgs& args);

/// GPU twin of cpu::Matmul through cuBLAS: y[m, n] = x[m, k] W[n, k]^T (+ bias), fp32
/// accumulation (CUBLAS_COMPUTE_32F). W is a device matrix in bf16 or f16 (x is converted to
/// that type in `scratch` first) or f32 (strict fp32 GEMM, no TF32). Quantized weights must be
/// converted at load (ConvertWeights). `handle` must be bound to `stream`.
/// Returns a readable error (nullptr on success).
const char* Matmul(const cpu::MatmulArgs& args, cublasHandle_t handle, void* scratch,
                   cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_MATMUL_H_
