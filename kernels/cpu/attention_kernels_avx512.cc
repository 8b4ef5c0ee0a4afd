// AVX-512 F/BW/VL attention inner loops. Compiled with per-file target flags
// (attention_kernels.h).

#include "kernels/cpu/attention_kernels.h"

#if defined(__AVX512F__)

#include "kernels/cpu/avx512_intrinsics.h"

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 16;
constexpr int kKeysPerPass = 16;   // independent dot products in flight, reduced together
constexpr int kChunksPerPass = 4;  // independent 16-float accumulator chunks in flight

__mmask16 TailMask(int64_t remaining) {
  return remaining >= kLanes ? static_cast<__mmask16>(0xffff)
                             : static_cast<__mmask16>((1u << remaining) - 1u);
}

// Loads the 16 consecutive elements of a cache row selected by `m` as exact floats (unselected
// lanes are 0 and their memory is not touched).
template <KvCacheDType T>
struct Elem;
template <>
struct Elem<KvCacheDType::kF32> {
  using Type = float;
  static __m512 Load(const float* p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
  }
};
template <>
struct Elem<KvCacheDType::kF16> {
  using Type = uint16_t;
  static __m512 Load(const uint16_t* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};
template <>
struct Elem<KvCacheDType::kBF16> {
  using Type = uint16_t;
  static __m512 Load(const uint16_t* p, __mmask16 m) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
};
template <>
struct Elem<KvCacheDType::kInt8> {
  using Type = int8_t;
  static __m512 Load(const int8_t* p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
  }
};
// FP8 E4M3FN -> f16 by moving bits: s.eeee.mmm becomes the half s.0eeee.mmm0000000, which is the
// fp8 value times 2^-8 for every finite code (normal and subnormal alike, as both formats put the
// subnormal boundary at exponent field 0); times 256 is exact. 0x7f / 0xff get an all-ones half
// exponent (NaN).
__m256i Fp8ToHalfBits(__m256i codes16) {
  const __m256i low7 = _mm256_and_si256(codes16, _mm256_set1_epi16(0x7f));
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(codes16, _mm256_set1_epi16(0x80)), 8);
  const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(low7, _mm256_set1_epi16(0x7f)),
                                       _mm256_set1_epi16(0x7c00));
  return _mm256_or_si256(_mm256_or_si256(sign, _mm256_slli_epi16(low7, 7)), nan);
}

template <>
struct Elem<KvCacheDType::kFp8E4M3> {
  using Type = uint8_t;
  static __m512 Load(const uint8_t* p, __mmask16 m) {
    const __m256i codes = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));  // masked lanes: 0
    return _mm512_mul_ps(_mm512_cvtph_ps(Fp8ToHalfBits(codes)), _mm512_set1_ps(256.0f));
  }
};

#include "kernels/cpu/avx512_reduce.inc"  // HorizontalSum, HorizontalSum4, HorizontalSum16

// The N accumulators of keys k .. k + N - 1 (rows head_dim elements apart): acc[j] += q * row j
// over 16-element chunks, the last one masked.
template <KvCacheDType T, int N>
void DotAccumulators(const float* q, const typename Elem<T>::Type* k, int64_t head_dim,
                     __m512* acc) {
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += kLanes) {
    const __mmask16 m = TailMask(head_dim - d);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
    for (int j = 0; j < N; ++j) {
      acc[j] = _mm512_fmadd_ps(qv, Elem<T>::Load(k + j * head_dim + d, m), acc[j]);
    }
  }
}

// Sixteen keys: their sums land in the lanes of one vector (HorizontalSum16), scaled and stored
// at once.
template <KvCacheDType T>
void Scores16(const float* q, const typename Elem<T>::Type* k, const float* row_scales,
              int64_t head_dim, float scale, float* scores) {
  __m512 acc[16];
  DotAccumulators<T, 16>(q, k, head_dim, acc);
  __m512 s = HorizontalSum16(acc);
  if constexpr (KvCacheDTypeHasScales(T)) s = _mm512_mul_ps(s, _mm512_loadu_ps(row_scales));
  _mm512_storeu_ps(scores, _mm512_mul_ps(s, _mm512_set1_ps(scale)));
}

template <KvCacheDType T>
void Scores4(const float* q, const typename Elem<T>::Type* k, const float* row_scales,
             int64_t head_dim, float scale, float* scores) {
  __m512 acc[4];
  DotAccumulators<T, 4>(q, k, head_dim, acc);
  float s[4];
  HorizontalSum4(acc, s);
  for (int j = 0; j < 4; ++j) {
    if constexpr (KvCacheDTypeHasScales(T)) s[j] *= row_scales[j];
    scores[j] = s[j] * scale;
  }
}

template <KvCacheDType T>
void Scores1(const float* q, const typename Elem<T>::Type* k, const float* row_scales,
             int64_t head_dim, float scale, float* scores) {
  __m512 acc[1];
  DotAccumulators<T, 1>(q, k, head_dim, acc);
  float s = HorizontalSum(acc[0]);
  if constexpr (KvCacheDTypeHasScales(T)) s *= row_scales[0];
  scores[0] = s * scale;
}

template <KvCacheDType T>
void Scores(const float* q, const void* k_bytes, const float* row_scales, int64_t count,
            int64_t head_dim, float scale, float* scores) {
  const auto* k = static_cast<const typename Elem<T>::Type*>(k_bytes);
  int64_t key = 0;
  for (; key + kKeysPerPass <= count; key += kKeysPerPass) {
    Scores16<T>(q, k + key * head_dim, row_scales + (row_scales ? key : 0), head_dim, scale,
                scores + key);
  }
  for (; key + 4 <= count; key += 4) {
    Scores4<T>(q, k + key * head_dim, row_scales + (row_scales ? key : 0), head_dim, scale,
               scores + key);
  }
  for (; key < count; ++key) {
    Scores1<T>(q, k + key * head_dim, row_scales + (row_scales ? key : 0), head_dim, scale,
               scores + key);
  }
}

template <KvCacheDType T>
float Weight(const float* probs, const float* row_scales, int64_t key) {
  if constexpr (KvCacheDTypeHasScales(T)) return probs[key] * row_scales[key];
  return probs[key];
}

template <KvCacheDType T>
void Accumulate(const float* probs, const void* v_bytes, const float* row_scales, int64_t count,
                int64_t head_dim, float* acc) {
  const auto* v = static_cast<const typename Elem<T>::Type*>(v_bytes);
  const __mmask16 all = TailMask(kLanes);
  int64_t d0 = 0;
  for (; d0 + kLanes * kChunksPerPass <= head_dim; d0 += kLanes * kChunksPerPass) {
    __m512 a[kChunksPerPass];
    for (int c = 0; c < kChunksPerPass; ++c) a[c] = _mm512_loadu_ps(acc + d0 + c * kLanes);
    for (int64_t key = 0; key < count; ++key) {
      const __m512 p = _mm512_set1_ps(Weight<T>(probs, row_scales, key));
      const auto* vr = v + key * head_dim + d0;
      for (int c = 0; c < kChunksPerPass; ++c) {
        a[c] = _mm512_fmadd_ps(p, Elem<T>::Load(vr + c * kLanes, all), a[c]);
      }
    }
    for (int c = 0; c < kChunksPerPass; ++c) _mm512_storeu_ps(acc + d0 + c * kLanes, a[c]);
  }
  for (; d0 < head_dim; d0 += kLanes) {  // remaining chunks, the last one masked
    const __mmask16 m = TailMask(head_dim - d0);
    __m512 a = _mm512_maskz_loadu_ps(m, acc + d0);
    for (int64_t key = 0; key < count; ++key) {
      const __m512 p = _mm512_set1_ps(Weight<T>(probs, row_scales, key));
      a = _mm512_fmadd_ps(p, Elem<T>::Load(v + key * head_dim + d0, m), a);
    }
    _mm512_mask_storeu_ps(acc + d0, m, a);
  }
}

}  // namespace

AttentionKernels AttentionKernelsAvx512(KvCacheDType dtype) {
  return ForKvDType(dtype, []<KvCacheDType T>() {
    return AttentionKernels{&Scores<T>, &Accumulate<T>};
  });
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected

namespace kvserve::cpu::internal {
AttentionKernels AttentionKernelsAvx512(KvCacheDType dtype) {
  return AttentionKernelsScalar(dtype);
}
}  // namespace kvserve::cpu::internal

#endif
