#ifndef KVSERVE_KERNELS_CPU_MATMUL_H_
#define KVSERVE_KERNELS_CPU_MATMUL_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"

namespace kvserve::cpu {

/// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n] if non-null), fp32 accumulation.
///
/// x and y are f32 unless x_dtype / y_dtype say bf16 (device backends, Backend::
/// activation_dtype): the pointers then address 16-bit elements (strides still count elements)
/// and y is rounded once, after the bias. The CPU kernels take f32 only.
struct MatmulArgs {
  const float* x;    // [m, k] in x_dtype, row i at x + i * x_stride
  int64_t x_stride;  // elements
  const void* w;     // [n, k] row-major in w_dtype; quantized rows are whole blocks (k % 32 == 0)
  DType w_dtype;
  const float* bias;  // [n] or nullptr
  float* y;           // [m, n] in y_dtype, row i at y + i * y_stride; must not alias x or w
  int64_t y_stride;   // elements
  int64_t m, n, k;
  DType x_dtype = DType::kF32;  // kF32 or kBF16
  DType y_dtype = DType::kF32;  // kF32 or kBF16
  // w in the packed layout of kernels/cpu/packed_weights.h (PackRows), not row-major.
  bool w_packed = false;
  // kF8E4M3 weights: [n] f32 row scales, W[j, c] = w_scale[j] * value(code[j, c]). Each x row is
  // then quantized to FP8 E4M3 with its own scale s_i = absmax / 448 (cpu::EncodeKvVector), and
  // y[i, j] = s_i * w_scale[j] * sum_c value(xq[i, c]) * value(code[j, c]) (+ bias[j]): the
  // products of two FP8 values are exact in f32, so the backends differ only in summation order.
  const float* w_scale = nullptr;
};

/// Runs the matmul on the ActiveCpuIsa() path, parallel over n on `pool` (nullptr = inline), and
/// for float weights at larger batches also over groups of rows.
///
/// Determinism: y[i, j] depends only on x row i, W row j, bias[j], k and the ISA path — never on
/// m, the row's position in the batch, the thread count or the chunking (each output element is
/// reduced by one thread in an order fixed by k alone).
void Matmul(const MatmulArgs& args, ThreadPool* pool);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_MATMUL_H_
