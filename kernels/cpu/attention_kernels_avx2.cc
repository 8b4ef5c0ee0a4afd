// AVX2 + FMA attention inner loops. Compiled with per-file target flags (attention_kernels.h).

#include "kernels/cpu/attention_kernels.h"

#if defined(__AVX2__)

#include <immintrin.h>

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 8;
constexpr int kKeysPerPass = 4;    // independent dot products in flight
constexpr int kChunksPerPass = 4;  // independent 8-float accumulator chunks in flight

float HorizontalSum(__m256 v) {  // fixed order, as in matmul_avx2.cc
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

template <int N>
void ScoresN(const float* q, const float* k, int64_t head_dim, float scale, float* scores) {
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + kLanes <= head_dim; d += kLanes) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int j = 0; j < N; ++j) {
      acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + j * head_dim + d), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) {
    float s = HorizontalSum(acc[j]);
    for (int64_t e = d; e < head_dim; ++e) s += q[e] * k[j * head_dim + e];
    scores[j] = s * scale;
  }
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
  const int64_t full = head_dim / kLanes * kLanes;
  int64_t d0 = 0;
  for (; d0 + kLanes * kChunksPerPass <= full; d0 += kLanes * kChunksPerPass) {
    __m256 a[kChunksPerPass];
    for (int c = 0; c < kChunksPerPass; ++c) a[c] = _mm256_loadu_ps(acc + d0 + c * kLanes);
    for (int64_t key = 0; key < count; ++key) {
      const __m256 p = _mm256_set1_ps(probs[key]);
      const float* vr = v + key * head_dim + d0;
      for (int c = 0; c < kChunksPerPass; ++c) {
        a[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + c * kLanes), a[c]);
      }
    }
    for (int c = 0; c < kChunksPerPass; ++c) _mm256_storeu_ps(acc + d0 + c * kLanes, a[c]);
  }
  for (; d0 < full; d0 += kLanes) {
    __m256 a = _mm256_loadu_ps(acc + d0);
    for (int64_t key = 0; key < count; ++key) {
      a = _mm256_fmadd_ps(_mm256_set1_ps(probs[key]), _mm256_loadu_ps(v + key * head_dim + d0), a);
    }
    _mm256_storeu_ps(acc + d0, a);
  }
  for (int64_t key = 0; key < count; ++key) {  // d % 8 tail (head_dim is rarely not a multiple)
    for (int64_t d = full; d < head_dim; ++d) acc[d] += probs[key] * v[key * head_dim + d];
  }
}

}  // namespace

AttentionKernels AttentionKernelsAvx2() { return {&Scores, &Accumulate}; }

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected

namespace kvserve::cpu::internal {
AttentionKernels AttentionKernelsAvx2() { return AttentionKernelsScalar(); }
}  // namespace kvserve::cpu::internal

#endif
