#ifndef KVSERVE_KERNELS_CUDA_MATMUL_H_
#define KVSERVE_KERNELS_CUDA_MATMUL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cpu/matmul.h"

namespace kvserve::cuda {

/// Bytes of scratch Matmul needs for `args` (x converted to the weights' 16-bit type).
size_t MatmulScratchBytes(const cpu::MatmulArgs& args);

/// GPU twin of cpu::Matmul: y[m, n] = x[m, k] W[n, k]^T (+ bias), fp32 accumulation. W is a
/// device matrix in bf16 or f16 (x is converted to that type in `scratch` first, then cuBLAS),
/// f32 (strict fp32 GEMM, no TF32), or a GGUF quantized format kept packed: up to 8 x rows take a
/// GEMV kernel that reads the blocks as stored (f32 x, exact dequantized weights), more rows
/// dequantize 8 MiB slabs of W to bf16 in `scratch` for cuBLAS. `handle` must be bound to
/// `stream`.
/// Returns a readable error (nullptr on success).
const char* Matmul(const cpu::MatmulArgs& args, cublasHandle_t handle, void* scratch,
                   cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_MATMUL_H_
