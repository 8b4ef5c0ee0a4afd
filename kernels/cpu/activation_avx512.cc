// AVX-512 path of SiluMul (activation.h), compiled with per-file target flags: intrinsics and
// file-local code only (matmul_impl.h says why). The same float operations as the portable
// loop, 16 lanes at a time, so the same bits; one pass, where that loop stores the exps, reads
// them back and divides four lanes at a time.

#include "kernels/cpu/activation.h"

#if defined(__AVX512F__)

#include "kernels/cpu/avx512_intrinsics.h"
#include "kernels/cpu/logits_exp.h"

namespace kvserve::cpu::internal {
namespace {

#include "kernels/cpu/exp_avx512.inc"  // ExpVec

}  // namespace

void SiluMulRowAvx512(const float* g, const float* u, float* o, int64_t n) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live =
        n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(live, g + i);
    const __m512i bits = _mm512_castps_si512(x);
    const __m512 e = ExpVec(_mm512_castsi512_ps(_mm512_or_si512(bits, sign)), zero, one);
    // e where x's sign bit is set (an integer test: NaN compares no differently), else 1.
    const __m512 factor =
        _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512()), one, e);
    const __m512 y = _mm512_mul_ps(_mm512_div_ps(_mm512_mul_ps(x, factor), _mm512_add_ps(one, e)),
                                   _mm512_maskz_loadu_ps(live, u + i));
    _mm512_mask_storeu_ps(o + i, live, y);
  }
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to the base path

namespace kvserve::cpu::internal {
void SiluMulRowAvx512(const float* g, const float* u, float* o, int64_t n) {
  SiluMulRowBase(g, u, o, n);
}
}  // namespace kvserve::cpu::internal

#endif
