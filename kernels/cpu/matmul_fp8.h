#ifndef KVSERVE_KERNELS_CPU_MATMUL_FP8_H_
#define KVSERVE_KERNELS_CPU_MATMUL_FP8_H_

// FP8 E4M3 weights with per-row scales (DType::kF8E4M3): the CPU twin of the CUDA backend's FP8
// GEMM (kernels/cuda/fp8_gemm.h), and the quantizer both backends' weights come from.

#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"

namespace kvserve::cpu {

/// Quantizes `rows` rows of `cols` f32 / f16 / bf16 elements (row r at src + r * row bytes) to
/// FP8 E4M3 with one scale per row: scales[r] = absmax / 448 and codes[r * cols + c] =
/// FloatToFp8E4M3(x / scales[r]) (EncodeKvVector's rule; an all-zero row has scale 0 and zero
/// codes). Parallel over rows on `pool` (may be null). The CUDA backend's weight quantizer
/// produces the same bytes.
void QuantizeRowsFp8(const void* src, DType src_dtype, int64_t rows, int64_t cols, uint8_t* codes,
                     float* scales, ThreadPool* pool);

/// cpu::Matmul for w_dtype kF8E4M3 (MatmulArgs::w_scale): each x row quantized to FP8 with its
/// own scale, then exact FP8 products summed in f32 (eight interleaved partial sums, an order
/// fixed by k). A reference path: no SIMD of its own beyond what the compiler makes of the sums.
void MatmulFp8(const MatmulArgs& args, ThreadPool* pool);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_MATMUL_FP8_H_
