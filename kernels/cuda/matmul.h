#ifndef KVSERVE_KERNELS_CUDA_MATMUL_H_
#define KVSERVE_KERNELS_CUDA_MATMUL_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace kvserve::cuda {

/// The cuBLAS state Matmul works with, all bound to the backend's stream.
struct BlasHandles {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;  // FP8 weights' GEMMs
  void* workspace = nullptr;      // cuBLASLt's workspace (cuBLAS's too: one stream, in turn)
  size_t workspace_bytes = 0;
  // cuBLASLt applies FP8 row scales itself (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), as
  // Fp8OuterVectorScaling found; else its f32 result is scaled by a pass of our own.
  bool fp8_outer_vector = false;
};

/// Whether cuBLASLt (blas.lt, with blas's workspace) has an FP8 E4M3 GEMM with per-row (outer
/// vector) scales on this device: asked once per backend, of a small TN problem.
bool Fp8OuterVectorScaling(const BlasHandles& blas);

/// Bytes of scratch Matmul needs for `args` (0 when cuBLAS or the GEMV take x and give y as
/// they are).
size_t MatmulScratchBytes(const cpu::MatmulArgs& args, const BlasHandles& blas);

/// GPU twin of cpu::Matmul: y[m, n] = x[m, k] W[n, k]^T (+ bias), fp32 accumulation, x and y in
/// f32 or bf16 (args.x_dtype, y_dtype). W is a device matrix in bf16 or f16 (cuBLAS, with x in
/// W's type), f32 (strict fp32 GEMM, no TF32), or a GGUF quantized format kept packed: up to 8 x
/// rows take a GEMV kernel that reads the blocks as stored (exact dequantized weights), more
/// rows dequantize 8 MiB slabs of W to bf16 in `scratch` for cuBLAS. bf16 x, bf16 (or
/// quantized) W and a bf16 or f32 y without a bias -- the model's usual Linear on CUDA -- is one
/// cuBLAS call and nothing else; x in another type than the GEMM's is converted in `scratch`
/// first, and a bias goes in after an f32 GEMM, before a bf16 y is rounded (a ConvertRows pass:
/// ActivationConversions counts them).
///
/// FP8 E4M3 weights (kF8E4M3 with args.w_scale): each x row is quantized to E4M3 with a scale of
/// its own into the scratch (QuantizeRowsFp8), then up to kFp8GemvMaxRows rows take Fp8Gemv and
/// more rows one cuBLASLt FP8 GEMM (TN, f32 accumulation) that applies both row scales and
/// writes y -- or, with a bias, an unaligned y or no outer-vector scaling, an f32 result in
/// 8 MiB row chunks of scratch that Fp8ScaleRows scales into y. k % 16 != 0 takes Fp8Gemv in
/// 8-row chunks. Returns a readable error (nullptr on success).
const char* Matmul(const cpu::MatmulArgs& args, const BlasHandles& blas, void* scratch,
                   cudaStream_t stream);

/// Activation conversion / bias passes (ConvertRows launches) Matmul has queued in this process,
/// all devices together: what a bf16-activation forward pass should not need per Linear. Also
/// exported as the C symbol kvserve_cuda_activation_conversions (tests read it with
/// CudaLibrarySymbol).
int64_t ActivationConversions();

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_MATMUL_H_
