// AVX2 path of RmsNorm (rms_norm.h), compiled with per-file target flags: intrinsics and
// file-local code only (matmul_impl.h says why). The same float operations as the portable loop
// and its eight-lane sum of squares, so the same bits, in two passes over the row where that loop
// (vectorized four lanes wide by the baseline build) makes three.

#include "kernels/cpu/rms_norm.h"

#if defined(__AVX2__)

#include <immintrin.h>

#include <cmath>

namespace kvserve::cpu::internal {
namespace {

#include "kernels/cpu/lane_sum8.inc"  // LaneSum8

// 1 / sqrt(mean of squares + eps) from the sum of squares' eight lane sums.
float InverseRms(__m256 lanes, int64_t dim, float eps) {
  return 1.0f / std::sqrt(LaneSum8(lanes) / static_cast<float>(dim) + eps);
}

}  // namespace

void RmsNormRowAvx2(float* x, const float* residual, const float* weight, float* y, int64_t dim,
                    float eps) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const auto live = [&](int64_t i) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(dim - i < 8 ? dim - i : 8)), lane);
  };
  // Eight elements a step, their squares added to the eight lane sums (a lane past the row adds
  // +0, which leaves a sum of squares unchanged).
  __m256 lanes = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256i m = live(i);
    __m256 v = _mm256_maskload_ps(x + i, m);
    if (residual != nullptr) {
      v = _mm256_add_ps(v, _mm256_maskload_ps(residual + i, m));
      _mm256_maskstore_ps(x + i, m, v);
    }
    lanes = _mm256_add_ps(lanes, _mm256_mul_ps(v, v));
  }
  const __m256 inv = _mm256_set1_ps(InverseRms(lanes, dim, eps));
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256i m = live(i);
    const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv);
    _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(v, _mm256_maskload_ps(weight + i, m)));
  }
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to the base path

namespace kvserve::cpu::internal {
void RmsNormRowAvx2(float* x, const float* residual, const float* weight, float* y, int64_t dim,
                    float eps) {
  RmsNormRowBase(x, residual, weight, y, dim, eps);
}
}  // namespace kvserve::cpu::internal

#endif
