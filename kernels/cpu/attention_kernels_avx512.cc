// AVX-512 F attention inner loops. Compiled with per-file target flags (attention_kernels.h).

#include "kernels/cpu/attention_kernels.h"

#if defined(__AVX512F__)

// See matmul_avx512.cc: g++ 12's AVX-512 intrinsics trip -Wmaybe-uninitialized falsely.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 16;
constexpr int kKeysPerPass = 4;    // independent dot products in flight
constexpr int kChunksPerPass = 4;  // independent 16-float accumulator chunks in flight

__mmask16 TailMask(int64_t remaining) {
  return remaining >= kLanes ? static_cast<__mmask16>(0xffff)
                             : static_cast<__mmask16>((1u << remaining) - 1u);
}

float HorizontalSum(__m512 v) {  // fixed order, as in matmul_avx512.cc
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  for (int width = 8; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
  }
  return t[0];
}

template <int N>
void ScoresN(const float* q, const float* k, int64_t head_dim, float scale, float* scores) {
  __m512 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += kLanes) {
    const __mmask16 m = TailMask(head_dim - d);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
    for (int j = 0; j < N; ++j) {
      acc[j] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k + j * head_dim + d), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) scores[j] = HorizontalSum(acc[j]) * scale;
}

void Scores(const float* q, const float* k, int64_t count, int64_t head_dim, float scale,
            float* scores) {
  int64_t key = 0;
  for (; key + kKeysPerPass <= count; key += kKeysPerPass) {
    ScoresN<kKeysPerPass>(q, k + key * head_dim, head_dim, scale, scores + key);
  }
  for (; key < count; ++key) ScoresN<1>(q, k + key * head_dim, head_dim, scale, scores + key);
}

void Accumulate(const float* probs, const float* v, int64_t count, int64_t head_dim, float* acc) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += kLanes * kChunksPerPass) {
    __mmask16 m[kChunksPerPass];
    __m512 a[kChunksPerPass];
    for (int c = 0; c < kChunksPerPass; ++c) {
      const int64_t d = d0 + c * kLanes;
      m[c] = d < head_dim ? TailMask(head_dim - d) : static_cast<__mmask16>(0);
      a[c] = _mm512_maskz_loadu_ps(m[c], acc + d);
    }
    for (int64_t key = 0; key < count; ++key) {
      const __m512 p = _mm512_set1_ps(probs[key]);
      const float* vr = v + key * head_dim + d0;
      for (int c = 0; c < kChunksPerPass; ++c) {
        a[c] = _mm512_fmadd_ps(p, _mm512_maskz_loadu_ps(m[c], vr + c * kLanes), a[c]);
      }
    }
    for (int c = 0; c < kChunksPerPass; ++c) {
      _mm512_mask_storeu_ps(acc + d0 + c * kLanes, m[c], a[c]);
    }
  }
}

}  // namespace

AttentionKernels AttentionKernelsAvx512() { return {&Scores, &Accumulate}; }

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected

namespace kvserve::cpu::internal {
AttentionKernels AttentionKernelsAvx512() { return AttentionKernelsScalar(); }
}  // namespace kvserve::cpu::internal

#endif
