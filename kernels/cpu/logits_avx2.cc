// AVX2 paths of kernels/cpu/logits.h (ExpShifted and ExpBlockSums), compiled with per-file target
// flags: intrinsics and file-local code only (see matmul_impl.h for why). The same float
// operations as logits.cc's ExpOne and ExpVec, eight lanes at a time, so the bits are the same.

#include "kernels/cpu/logits.h"

#if defined(__AVX2__)

#include <immintrin.h>

#include "kernels/cpu/logits_exp.h"

namespace kvserve::cpu::internal {
namespace {

#include "kernels/cpu/exp_avx2.inc"  // ExpVec

// Lanes 0 .. left - 1 (all eight from 8 on).
__m256i Live(int64_t left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < 8 ? left : 8)), lane);
}

// The sum of a block's first eight values in ExpBlockTree's order, in lane 0: pairs, then pairs
// of pairs, then the two halves (a + b and b + a are the same float).
__m256 TreeSum8(__m256 e) {
  const __m256 v1 = _mm256_add_ps(e, _mm256_permute_ps(e, 0xB1));
  const __m256 v2 = _mm256_add_ps(v1, _mm256_permute_ps(v1, 0x4E));
  return _mm256_add_ps(v2, _mm256_permute2f128_ps(v2, v2, 0x01));
}

}  // namespace

void ExpShiftedAvx2(const float* x, int64_t n, float shift, float scale, float* out) {
  const __m256 vshift = _mm256_set1_ps(shift);
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, ExpVec(_mm256_loadu_ps(x + i), vshift, vscale));
  }
  if (i < n) {
    const __m256i live = Live(n - i);
    _mm256_maskstore_ps(out + i, live, ExpVec(_mm256_maskload_ps(x + i, live), vshift, vscale));
  }
}

void ExpBlockSumsAvx2(const float* x, int64_t n, float shift, float scale, float* sums) {
  const __m256 vshift = _mm256_set1_ps(shift);
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < n; i += kExpBlock) {
    // Lanes past n load as 0 and must add as exactly 0, not exp(0 - shift).
    const __m256i live_lo = Live(n - i);
    const __m256i live_hi = Live(n - i - 8);
    const __m256 lo = _mm256_and_ps(_mm256_castsi256_ps(live_lo),
                                    ExpVec(_mm256_maskload_ps(x + i, live_lo), vshift, vscale));
    const __m256 hi = _mm256_and_ps(_mm256_castsi256_ps(live_hi),
                                    ExpVec(_mm256_maskload_ps(x + i + 8, live_hi), vshift, vscale));
    sums[i / kExpBlock] = _mm256_cvtss_f32(_mm256_add_ps(TreeSum8(lo), TreeSum8(hi)));
  }
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to the base path

namespace kvserve::cpu::internal {

void ExpShiftedAvx2(const float* x, int64_t n, float shift, float scale, float* out) {
  ExpShiftedBase(x, n, shift, scale, out);
}

void ExpBlockSumsAvx2(const float* x, int64_t n, float shift, float scale, float* sums) {
  ExpBlockSumsBase(x, n, shift, scale, sums);
}

}  // namespace kvserve::cpu::internal

#endif
