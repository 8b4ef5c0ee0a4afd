#ifndef KVSERVE_KERNELS_CUDA_FP8_GEMM_H_
#define KVSERVE_KERNELS_CUDA_FP8_GEMM_H_

// The kernels of FP8 E4M3 weights (DType::kF8E4M3) besides cuBLASLt's GEMM: row quantization
// (weights at load, activations every call), the GEMV of a few rows, and the scale-and-store
// pass where cuBLASLt cannot apply the scales itself. cuda::Matmul (matmul.cu) drives them.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/dtype.h"

namespace kvserve::cuda {

/// x rows up to which Fp8Gemv takes a call (cuBLASLt above).
inline constexpr int kFp8GemvMaxRows = 8;

/// Quantizes `rows` rows of `cols` f32 / f16 / bf16 values (row r at element r * src_stride of
/// src) to FP8 E4M3 with one scale per row, the bytes cpu::QuantizeRowsFp8 makes: scales[r] =
/// absmax / 448, codes[r * codes_stride + c] = e4m3(x / scales[r]), rounded to nearest even and
/// saturated (an all-zero row: scale 0, zero codes). One block per row.
cudaError_t QuantizeRowsFp8(const void* src, DType src_dtype, int64_t src_stride, int64_t rows,
                            int64_t cols, uint8_t* codes, int64_t codes_stride, float* scales,
                            cudaStream_t stream);

/// y[r, j] = (sum_c xq[r, c] w[j, c]) * (xs[r] * w_scale[j]) (+ bias[j]) for r < m <=
/// kFp8GemvMaxRows: args' FP8 weights (args.w, args.w_scale) against x rows quantized by
/// QuantizeRowsFp8 (codes xq, row r at r * xq_stride, 16-byte aligned rows; scales xs). One warp
/// per weight row, 16 codes per lane and load where k % 16 == 0. y in args.y_dtype.
cudaError_t Fp8Gemv(const cpu::MatmulArgs& args, const uint8_t* xq, int64_t xq_stride,
                    const float* xs, cudaStream_t stream);

/// y[r, c] = acc[r, c] * (xs[r] * ws[c]) (+ bias[c]) for r < m, c < n, stored in y_dtype (f32
/// or bf16, rounded once); xs and ws null mean the accumulators are scaled already.
cudaError_t Fp8ScaleRows(const float* acc, int64_t acc_stride, const float* xs, const float* ws,
                         const float* bias, void* y, DType y_dtype, int64_t y_stride, int64_t m,
                         int64_t n, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_FP8_GEMM_H_
