// AVX2 path of SiluMul (activation.h), compiled with per-file target flags: intrinsics and
// file-local code only (matmul_impl.h says why). The same float operations as the portable
// loop, 8 lanes at a time, so the same bits; one pass, where that loop stores the exps, reads
// them back and divides four lanes at a time.

#include "kernels/cpu/activation.h"

#if defined(__AVX2__)

#include <immintrin.h>

#include "kernels/cpu/logits_exp.h"

namespace kvserve::cpu::internal {
namespace {

#include "kernels/cpu/exp_avx2.inc"  // ExpVec

}  // namespace

void SiluMulRowAvx2(const float* g, const float* u, float* o, int64_t n) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i live =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i < 8 ? n - i : 8)), lane);
    const __m256 x = _mm256_maskload_ps(g + i, live);
    const __m256 e = ExpVec(_mm256_or_ps(x, sign), zero, one);
    // e where x's sign bit is set (an integer test: NaN compares no differently), else 1.
    const __m256 factor = _mm256_blendv_ps(one, e, x);
    const __m256 y = _mm256_mul_ps(_mm256_div_ps(_mm256_mul_ps(x, factor), _mm256_add_ps(one, e)),
                                   _mm256_maskload_ps(u + i, live));
    _mm256_maskstore_ps(o + i, live, y);
  }
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to the base path

namespace kvserve::cpu::internal {
void SiluMulRowAvx2(const float* g, const float* u, float* o, int64_t n) {
  SiluMulRowBase(g, u, o, n);
}
}  // namespace kvserve::cpu::internal

#endif
