// AVX-512 path of RmsNorm (rms_norm.h), compiled with per-file target flags: intrinsics and
// file-local code only (matmul_impl.h says why). The same float operations as the portable loop
// and its eight-lane sum of squares, so the same bits, in two passes over the row where that loop
// (vectorized four lanes wide by the baseline build) makes three.

#include "kernels/cpu/rms_norm.h"

#if defined(__AVX512F__)

#include <cmath>

#include "kernels/cpu/avx512_intrinsics.h"

namespace kvserve::cpu::internal {
namespace {

#include "kernels/cpu/lane_sum8.inc"  // LaneSum8

// 1 / sqrt(mean of squares + eps) from the sum of squares' eight lane sums.
float InverseRms(__m256 lanes, int64_t dim, float eps) {
  return 1.0f / std::sqrt(LaneSum8(lanes) / static_cast<float>(dim) + eps);
}

}  // namespace

void RmsNormRowAvx512(float* x, const float* residual, const float* weight, float* y, int64_t dim,
                      float eps) {
  const auto live = [&](int64_t i) {
    return dim - i >= 16 ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << (dim - i)) - 1u);
  };
  // Sixteen elements a step, their squares added to the eight lane sums half by half (a lane past
  // the row adds +0, which leaves a sum of squares unchanged).
  __m256 lanes = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 m = live(i);
    __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    if (residual != nullptr) {
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, residual + i));
      _mm512_mask_storeu_ps(x + i, m, v);
    }
    const __m512 sq = _mm512_mul_ps(v, v);
    lanes = _mm256_add_ps(lanes, _mm512_castps512_ps256(sq));
    lanes = _mm256_add_ps(lanes, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1)));
  }
  const __m512 inv = _mm512_set1_ps(InverseRms(lanes, dim, eps));
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 m = live(i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to the base path

namespace kvserve::cpu::internal {
void RmsNormRowAvx512(float* x, const float* residual, const float* weight, float* y, int64_t dim,
                      float eps) {
  RmsNormRowBase(x, residual, weight, y, dim, eps);
}
}  // namespace kvserve::cpu::internal

#endif
