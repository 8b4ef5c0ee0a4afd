// AVX-512 paths of kernels/cpu/logits.h, compiled with per-file target flags: intrinsics and
// file-local code only (see matmul_impl.h for why).

#include "kernels/cpu/logits.h"

#if defined(__AVX512F__)

#include "kernels/cpu/avx512_intrinsics.h"

#include "kernels/cpu/logits_exp.h"

namespace kvserve::cpu::internal {

ArgMaxResult ArgMaxCheckedAvx512(const float* x, int64_t n) {
  // One pass: per lane the largest value and the first index holding it (a later equal value
  // does not replace it: the comparison is strict), and a mask of lanes that saw NaN or +inf.
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  __m512 best = _mm512_set1_ps(-__builtin_inff());
  __m512i best_index = _mm512_setzero_si512();
  __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    bad |= _mm512_cmp_ps_mask(v, inf, _CMP_NLT_UQ);  // NaN or +inf
    const __mmask16 greater = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, greater, v);
    best_index = _mm512_mask_mov_epi32(best_index, greater, index);
    index = _mm512_add_epi32(index, step);
  }
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-__builtin_inff()), tail, x + i);
    bad |= _mm512_mask_cmp_ps_mask(tail, v, inf, _CMP_NLT_UQ);
    const __mmask16 greater = _mm512_mask_cmp_ps_mask(tail, v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, greater, v);
    best_index = _mm512_mask_mov_epi32(best_index, greater, index);
  }
  ArgMaxResult result;
  if (bad != 0) {
    for (int64_t j = 0; j < n; ++j) {
      if (!(x[j] < __builtin_inff())) {
        result.bad = j;
        break;
      }
    }
    return result;
  }
  // The largest lane value; among lanes holding it, the smallest index. (All -inf: every lane
  // keeps index 0, which is the first -inf.)
  const float max = _mm512_reduce_max_ps(best);
  const __mmask16 at_max = _mm512_cmp_ps_mask(best, _mm512_set1_ps(max), _CMP_EQ_OQ);
  const __m512i candidates =
      _mm512_mask_mov_epi32(_mm512_set1_epi32(0x7fffffff), at_max, best_index);
  result.index = _mm512_reduce_min_epi32(candidates);
  return result;
}

namespace {

#include "kernels/cpu/exp_avx512.inc"  // ExpVec

__mmask16 Live(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

}  // namespace

void ExpShiftedAvx512(const float* x, int64_t n, float shift, float scale, float* out) {
  const __m512 vshift = _mm512_set1_ps(shift);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = Live(n - i);
    const __m512 e = ExpVec(_mm512_maskz_loadu_ps(live, x + i), vshift, vscale);
    _mm512_mask_storeu_ps(out + i, live, e);
  }
}

void ExpBlockSumsAvx512(const float* x, int64_t n, float shift, float scale, float* sums) {
  const __m512 vshift = _mm512_set1_ps(shift);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = Live(n - i);
    // Lanes past n load as 0 and must add as exactly 0, not exp(0 - shift).
    const __m512 e =
        _mm512_maskz_mov_ps(live, ExpVec(_mm512_maskz_loadu_ps(live, x + i), vshift, vscale));
    // The pairwise tree in index order; every lane of a level holds its pair's sum (a + b and
    // b + a are the same float), lane 0 ends with the total.
    const __m512 v1 = _mm512_add_ps(e, _mm512_permute_ps(e, 0xB1));      // e0+e1, e2+e3, ...
    const __m512 v2 = _mm512_add_ps(v1, _mm512_permute_ps(v1, 0x4E));    // quads
    const __m512 v3 = _mm512_add_ps(v2, _mm512_shuffle_f32x4(v2, v2, 0xB1));  // eights
    const __m512 v4 = _mm512_add_ps(v3, _mm512_shuffle_f32x4(v3, v3, 0x4E));  // sixteen
    sums[i / 16] = _mm512_cvtss_f32(v4);
  }
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to the base path

namespace kvserve::cpu::internal {

ArgMaxResult ArgMaxCheckedAvx512(const float* x, int64_t n) { return ArgMaxCheckedBase(x, n); }

void ExpShiftedAvx512(const float* x, int64_t n, float shift, float scale, float* out) {
  ExpShiftedBase(x, n, shift, scale, out);
}

void ExpBlockSumsAvx512(const float* x, int64_t n, float shift, float scale, float* sums) {
  ExpBlockSumsBase(x, n, shift, scale, sums);
}

}  // namespace kvserve::cpu::internal

#endif
