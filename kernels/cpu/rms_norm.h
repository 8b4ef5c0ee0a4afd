#ifndef KVSERVE_KERNELS_CPU_RMS_NORM_H_
#define KVSERVE_KERNELS_CPU_RMS_NORM_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"

namespace kvserve::cpu {

/// Per row: if residual != nullptr, first x += residual (in place: x becomes the new residual
/// stream); then y = x / sqrt(mean(x^2) + eps) * weight.
struct RmsNormArgs {
  float* x;               // [rows, dim], row i at x + i * x_stride
  const float* residual;  // [rows, dim], row i at residual + i * residual_stride, or nullptr
  const float* weight;    // [dim]
  // [rows, dim], row i at y + i * y_stride; aliases nothing else, except that y may be x itself
  // (in place, y_stride == x_stride) when there is no residual.
  float* y;
  int64_t rows, dim;
  float eps;
  int64_t x_stride, y_stride;   // elements
  int64_t residual_stride = 0;  // elements; 0 means dim (contiguous rows)
  // kF32, or kBF16 on device backends (Backend::activation_dtype): x and residual in x_dtype,
  // y in y_dtype (the same when y is x); the sums run in f32 and y is rounded once. The CPU
  // kernel takes f32 only.
  DType x_dtype = DType::kF32;
  DType y_dtype = DType::kF32;
};

/// Runs RmsNorm over rows, in parallel on `pool` (nullptr = inline). Each row's result depends
/// only on that row (fixed 8-lane sum of squares), never on batch or thread count.
void RmsNorm(const RmsNormArgs& args, ThreadPool* pool);

namespace internal {
// One row of RmsNorm (f32): the portable loop, and the AVX2 and AVX-512 loops (rms_norm_avx2.cc,
// rms_norm_avx512.cc: the same float operations and the same eight-lane sum, so the same bits),
// which RmsNorm picks by ActiveCpuIsa(). residual may be null; y may be x when it is.
void RmsNormRowBase(float* x, const float* residual, const float* weight, float* y, int64_t dim,
                    float eps);
void RmsNormRowAvx2(float* x, const float* residual, const float* weight, float* y, int64_t dim,
                    float eps);
void RmsNormRowAvx512(float* x, const float* residual, const float* weight, float* y, int64_t dim,
                      float eps);
}  // namespace internal

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_RMS_NORM_H_
