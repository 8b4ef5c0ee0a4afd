// AVX2 + FMA + F16C attention inner loops. Compiled with per-file target flags
// (attention_kernels.h).

#include "kernels/cpu/attention_kernels.h"

#if defined(__AVX2__)

#include <immintrin.h>

#include <cstring>

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 8;
constexpr int kKeysPerPass = 8;    // independent dot products in flight, reduced together
constexpr int kChunksPerPass = 4;  // independent 8-float accumulator chunks in flight

// Loads 8 consecutive elements of a cache row as exact floats.
template <KvCacheDType T>
struct Elem;
template <>
struct Elem<KvCacheDType::kF32> {
  using Type = float;
  static __m256 Load(const float* p) { return _mm256_loadu_ps(p); }
};
template <>
struct Elem<KvCacheDType::kF16> {
  using Type = uint16_t;
  static __m256 Load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
template <>
struct Elem<KvCacheDType::kBF16> {
  using Type = uint16_t;
  static __m256 Load(const uint16_t* p) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i wide = _mm256_cvtepu16_epi32(half);
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};
template <>
struct Elem<KvCacheDType::kInt8> {
  using Type = int8_t;
  static __m256 Load(const int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};
// FP8 E4M3FN -> f16 by moving bits: s.eeee.mmm becomes the half s.0eeee.mmm0000000, which is the
// fp8 value times 2^-8 for every finite code (normal and subnormal alike, as both formats put the
// subnormal boundary at exponent field 0); times 256 is exact. 0x7f / 0xff get an all-ones half
// exponent (NaN).
__m128i Fp8ToHalfBits(__m128i codes16) {
  const __m128i low7 = _mm_and_si128(codes16, _mm_set1_epi16(0x7f));
  const __m128i sign = _mm_slli_epi16(_mm_and_si128(codes16, _mm_set1_epi16(0x80)), 8);
  const __m128i nan = _mm_and_si128(_mm_cmpeq_epi16(low7, _mm_set1_epi16(0x7f)),
                                    _mm_set1_epi16(0x7c00));
  return _mm_or_si128(_mm_or_si128(sign, _mm_slli_epi16(low7, 7)), nan);
}

template <>
struct Elem<KvCacheDType::kFp8E4M3> {
  using Type = uint8_t;
  static __m256 Load(const uint8_t* p) {
    const __m128i codes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_mul_ps(_mm256_cvtph_ps(Fp8ToHalfBits(codes)), _mm256_set1_ps(256.0f));
  }
};

// The first n < 8 elements, zero-padded (a zero code decodes to 0 in every dtype).
template <KvCacheDType T>
__m256 LoadTail(const typename Elem<T>::Type* p, int64_t n) {
  typename Elem<T>::Type buf[kLanes] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(buf[0]));
  return Elem<T>::Load(buf);
}

__m256 LoadTailF32(const float* p, int64_t n) { return LoadTail<KvCacheDType::kF32>(p, n); }

#include "kernels/cpu/avx2_reduce.inc"  // HorizontalSum, HorizontalSum8

// The N accumulators of keys k .. k + N - 1 (rows head_dim elements apart): acc[j] += q * row j
// over 8-element chunks, the last partial one zero-padded.
template <KvCacheDType T, int N>
void DotAccumulators(const float* q, const typename Elem<T>::Type* k, int64_t head_dim,
                     __m256* acc) {
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + kLanes <= head_dim; d += kLanes) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int j = 0; j < N; ++j) {
      acc[j] = _mm256_fmadd_ps(qv, Elem<T>::Load(k + j * head_dim + d), acc[j]);
    }
  }
  if (d < head_dim) {
    const __m256 qv = LoadTailF32(q + d, head_dim - d);
    for (int j = 0; j < N; ++j) {
      acc[j] = _mm256_fmadd_ps(qv, LoadTail<T>(k + j * head_dim + d, head_dim - d), acc[j]);
    }
  }
}

// Eight keys: their sums land in the lanes of one vector (HorizontalSum8), scaled and stored at
// once.
template <KvCacheDType T>
void Scores8(const float* q, const typename Elem<T>::Type* k, const float* row_scales,
             int64_t head_dim, float scale, float* scores) {
  __m256 acc[8];
  DotAccumulators<T, 8>(q, k, head_dim, acc);
  __m256 s = HorizontalSum8(acc);
  if constexpr (KvCacheDTypeHasScales(T)) s = _mm256_mul_ps(s, _mm256_loadu_ps(row_scales));
  _mm256_storeu_ps(scores, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
}

template <KvCacheDType T>
void Scores1(const float* q, const typename Elem<T>::Type* k, const float* row_scales,
             int64_t head_dim, float scale, float* scores) {
  __m256 acc[1];
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
    Scores8<T>(q, k + key * head_dim, row_scales + (row_scales ? key : 0), head_dim, scale,
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
  const int64_t full = head_dim / kLanes * kLanes;
  int64_t d0 = 0;
  for (; d0 + kLanes * kChunksPerPass <= full; d0 += kLanes * kChunksPerPass) {
    __m256 a[kChunksPerPass];
    for (int c = 0; c < kChunksPerPass; ++c) a[c] = _mm256_loadu_ps(acc + d0 + c * kLanes);
    for (int64_t key = 0; key < count; ++key) {
      const __m256 p = _mm256_set1_ps(Weight<T>(probs, row_scales, key));
      const auto* vr = v + key * head_dim + d0;
      for (int c = 0; c < kChunksPerPass; ++c) {
        a[c] = _mm256_fmadd_ps(p, Elem<T>::Load(vr + c * kLanes), a[c]);
      }
    }
    for (int c = 0; c < kChunksPerPass; ++c) _mm256_storeu_ps(acc + d0 + c * kLanes, a[c]);
  }
  for (; d0 < full; d0 += kLanes) {
    __m256 a = _mm256_loadu_ps(acc + d0);
    for (int64_t key = 0; key < count; ++key) {
      const __m256 p = _mm256_set1_ps(Weight<T>(probs, row_scales, key));
      a = _mm256_fmadd_ps(p, Elem<T>::Load(v + key * head_dim + d0), a);
    }
    _mm256_storeu_ps(acc + d0, a);
  }
  if (full < head_dim) {  // d % 8 tail (head_dim is rarely not a multiple), zero-padded
    const int64_t rest = head_dim - full;
    float tail[kLanes] = {};
    std::memcpy(tail, acc + full, static_cast<size_t>(rest) * sizeof(float));
    __m256 a = _mm256_loadu_ps(tail);
    for (int64_t key = 0; key < count; ++key) {
      const __m256 p = _mm256_set1_ps(Weight<T>(probs, row_scales, key));
      a = _mm256_fmadd_ps(p, LoadTail<T>(v + key * head_dim + full, rest), a);
    }
    _mm256_storeu_ps(tail, a);
    std::memcpy(acc + full, tail, static_cast<size_t>(rest) * sizeof(float));
  }
}

}  // namespace

AttentionKernels AttentionKernelsAvx2(KvCacheDType dtype) {
  return ForKvDType(dtype, []<KvCacheDType T>() {
    return AttentionKernels{&Scores<T>, &Accumulate<T>};
  });
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected

namespace kvserve::cpu::internal {
AttentionKernels AttentionKernelsAvx2(KvCacheDType dtype) { return AttentionKernelsScalar(dtype); }
}  // namespace kvserve::cpu::internal

#endif
