// AVX2 + FMA + F16C attention inner loops. Compiled with per-file target flags
// (attention_kernels.h).

#include "kernels/cpu/attention_kernels.h"

#if defined(__AVX2__)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/logits_exp.h"

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 8;
constexpr int64_t kLine = 64;  // cache line bytes (RowPrefetch)

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

#include "kernels/cpu/avx2_reduce.inc"  // HorizontalSum, HorizontalSum4, HorizontalSum8

// Score tiles: K keys x G queries of the group, K * G in {1, 2, 4, 8} dot products in flight.
// Each chunk of a key row is decoded once for the G queries. acc[g * K + j] is query g's sum for
// key j, so after HorizontalSum8 query g's K scores are lanes g * K .. g * K + K - 1.
// `pf` (null for none) is the prefetch run's row for the tile's first key, `pf_rows` rows left:
// with each chunk step the tile requests K lines of them, in address order (row by row, not the
// tile's column order: the L2 prefetcher follows ascending requests).
template <KvCacheDType T, int K, int G>
inline void ScoreTile(const float* q, const typename Elem<T>::Type* k, const float* row_scales,
                      int64_t head_dim, float scale, float* scores, int64_t stride,
                      const uint8_t* pf, int64_t pf_rows) {
  constexpr int kDots = K * G;
  constexpr int64_t kElemBytes = sizeof(typename Elem<T>::Type);
  const int64_t pf_bytes = pf_rows * head_dim * kElemBytes;
  __m256 acc[kDots];
#pragma GCC unroll 8
  for (int i = 0; i < kDots; ++i) acc[i] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + kLanes <= head_dim; d += kLanes) {
    // A new line of each row: request K lines of the prefetch rows, in address order.
    const bool request = pf != nullptr && d * kElemBytes % kLine == 0;
    int64_t line = d * kElemBytes * K;
    __m256 qv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) qv[g] = _mm256_loadu_ps(q + g * head_dim + d);
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) {
      if (request && line < pf_bytes) __builtin_prefetch(pf + line, 0, 3);
      line += kLine;
      const __m256 kv = Elem<T>::Load(k + j * head_dim + d);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g * K + j] = _mm256_fmadd_ps(qv[g], kv, acc[g * K + j]);
    }
  }
  if (d < head_dim) {  // the last partial chunk, zero-padded
    __m256 qv[G];
    for (int g = 0; g < G; ++g) qv[g] = LoadTailF32(q + g * head_dim + d, head_dim - d);
    for (int j = 0; j < K; ++j) {
      const __m256 kv = LoadTail<T>(k + j * head_dim + d, head_dim - d);
      for (int g = 0; g < G; ++g) acc[g * K + j] = _mm256_fmadd_ps(qv[g], kv, acc[g * K + j]);
    }
  }
  if constexpr (kDots == 8) {
    __m256 s = HorizontalSum8(acc);
    if constexpr (KvCacheDTypeHasScales(T)) {
      __m256 rs;
      if constexpr (K == 8) {
        rs = _mm256_loadu_ps(row_scales);
      } else if constexpr (K == 4) {
        rs = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(row_scales));
      } else {
        double pair;
        std::memcpy(&pair, row_scales, sizeof(pair));
        rs = _mm256_castpd_ps(_mm256_set1_pd(pair));
      }
      s = _mm256_mul_ps(s, rs);
    }
    s = _mm256_mul_ps(s, _mm256_set1_ps(scale));
    if constexpr (G == 1) {
      _mm256_storeu_ps(scores, s);
    } else if constexpr (G == 2) {
      _mm_storeu_ps(scores, _mm256_castps256_ps128(s));
      _mm_storeu_ps(scores + stride, _mm256_extractf128_ps(s, 1));
    } else {
      const __m128 lo = _mm256_castps256_ps128(s);
      const __m128 hi = _mm256_extractf128_ps(s, 1);
      _mm_storel_pi(reinterpret_cast<__m64*>(scores), lo);
      _mm_storeh_pi(reinterpret_cast<__m64*>(scores + stride), lo);
      _mm_storel_pi(reinterpret_cast<__m64*>(scores + 2 * stride), hi);
      _mm_storeh_pi(reinterpret_cast<__m64*>(scores + 3 * stride), hi);
    }
  } else {
    float sums[kDots];
    if constexpr (kDots == 4) {
      HorizontalSum4(acc, sums);
    } else {
      for (int i = 0; i < kDots; ++i) sums[i] = HorizontalSum(acc[i]);
    }
    for (int g = 0; g < G; ++g) {
      for (int j = 0; j < K; ++j) {
        float v = sums[g * K + j];
        if constexpr (KvCacheDTypeHasScales(T)) v *= row_scales[j];
        scores[g * stride + j] = v * scale;
      }
    }
  }
}

// G queries over a run: tiles of 8 / G keys, then single keys.
template <KvCacheDType T, int G>
void ScoresForQueries(const float* q, const typename Elem<T>::Type* k, const float* row_scales,
                      int64_t count, int64_t head_dim, float scale, float* scores, int64_t stride,
                      RowPrefetch prefetch) {
  constexpr int kKeys = 8 / G;
  const int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(typename Elem<T>::Type));
  const auto* pf = static_cast<const uint8_t*>(prefetch.data);
  int64_t key = 0;
  const auto tile = [&]<int kTileKeys>() {
    ScoreTile<T, kTileKeys, G>(q, k + key * head_dim, row_scales + (row_scales ? key : 0), head_dim,
                               scale, scores + key, stride,
                               pf != nullptr ? pf + key * row_bytes : nullptr, prefetch.rows - key);
  };
  for (; key + kKeys <= count; key += kKeys) tile.template operator()<kKeys>();
  for (; key < count; ++key) tile.template operator()<1>();
}

template <KvCacheDType T>
float Weight(const float* probs, const float* row_scales, int64_t key) {
  if constexpr (KvCacheDTypeHasScales(T)) return probs[key] * row_scales[key];
  return probs[key];
}

// G queries x C full chunks of 8 output elements from element d0: each chunk of a value row is
// decoded once for the G queries. Each key also requests a pass's worth of the prefetch run's
// bytes, in address order.
template <KvCacheDType T, int G, int C>
inline void AccumulateTile(const float* probs, int64_t probs_stride, const float* row_scales,
                           const typename Elem<T>::Type* v, int64_t count, int64_t head_dim,
                           int64_t d0, float* acc, RowPrefetch prefetch) {
  constexpr int64_t kElemBytes = sizeof(typename Elem<T>::Type);
  constexpr int64_t kPassBytes = C * kLanes * kElemBytes;
  const int64_t row_bytes = head_dim * kElemBytes;
  // Requests in address order: as if the prefetch run were laid out pass by pass, this pass
  // takes its `count` rows' share of the bytes from offset d0 * count.
  const auto* pf = static_cast<const uint8_t*>(prefetch.data);
  const int64_t pf_bytes = pf != nullptr ? prefetch.rows * row_bytes : 0;
  int64_t pf_line = d0 * kElemBytes * count;
  __m256 a[G * C];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      a[g * C + c] = _mm256_loadu_ps(acc + g * head_dim + d0 + c * kLanes);
    }
  }
  for (int64_t key = 0; key < count; ++key) {
    if (pf_line < pf_bytes) {
#pragma GCC unroll 4
      for (int64_t b = 0; b < kPassBytes; b += kLine) {
        if (pf_line + b < pf_bytes) __builtin_prefetch(pf + pf_line + b, 0, 3);
      }
      pf_line += kPassBytes;
    }
    __m256 w[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      w[g] = _mm256_set1_ps(Weight<T>(probs + g * probs_stride, row_scales, key));
    }
    const auto* vr = v + key * head_dim + d0;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m256 vv = Elem<T>::Load(vr + c * kLanes);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) a[g * C + c] = _mm256_fmadd_ps(w[g], vv, a[g * C + c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      _mm256_storeu_ps(acc + g * head_dim + d0 + c * kLanes, a[g * C + c]);
    }
  }
}

// G queries over the head: passes of 8 / G full chunks (eight FMA chains), then single full
// chunks, then the d % 8 tail zero-padded (head_dim is rarely not a multiple of 8).
template <KvCacheDType T, int G>
void AccumulateForQueries(const float* probs, int64_t probs_stride, const float* row_scales,
                          const typename Elem<T>::Type* v, int64_t count, int64_t head_dim,
                          float* acc, RowPrefetch prefetch) {
  constexpr int kChunks = 8 / G;
  const int64_t full = head_dim / kLanes * kLanes;
  int64_t d0 = 0;
  for (; d0 + kLanes * kChunks <= full; d0 += kLanes * kChunks) {
    AccumulateTile<T, G, kChunks>(probs, probs_stride, row_scales, v, count, head_dim, d0, acc,
                                  prefetch);
  }
  for (; d0 < full; d0 += kLanes) {
    AccumulateTile<T, G, 1>(probs, probs_stride, row_scales, v, count, head_dim, d0, acc, prefetch);
  }
  if (full < head_dim) {
    const int64_t rest = head_dim - full;
    for (int g = 0; g < G; ++g) {
      const float* p = probs + g * probs_stride;
      float* out = acc + g * head_dim + full;
      float tail[kLanes] = {};
      std::memcpy(tail, out, static_cast<size_t>(rest) * sizeof(float));
      __m256 a = _mm256_loadu_ps(tail);
      for (int64_t key = 0; key < count; ++key) {
        const __m256 w = _mm256_set1_ps(Weight<T>(p, row_scales, key));
        a = _mm256_fmadd_ps(w, LoadTail<T>(v + key * head_dim + full, rest), a);
      }
      _mm256_storeu_ps(tail, a);
      std::memcpy(out, tail, static_cast<size_t>(rest) * sizeof(float));
    }
  }
}

#include "kernels/cpu/exp_avx2.inc"          // ExpVec
#include "kernels/cpu/lane_sum8.inc"         // LaneSum8

// G rows of AttentionSoftmaxFn at once: the exps in place, each row's eight lane sums in sum[g]
// (attention_groups.inc's Softmax combines them). The rows' exps are interleaved (one row's chain
// of dependent steps is too short to hide the exp's latency), eight keys a step, each step's exps
// added to the lane sums (a lane past the row adds +0, which leaves a sum of exps unchanged).
template <int G>
void SoftmaxRows(float* probs, int64_t keys, __m256* sum) {
  const __m256 lowest = _mm256_set1_ps(-__builtin_inff());
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const auto live = [&](int64_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < kLanes ? left : kLanes)),
                              lane);
  };
  __m256 shift[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    // max(v, m) keeps m where v is NaN, as the scalar loop's std::max(m, v) does.
    __m256 m = lowest;
    for (int64_t i = 0; i < keys; i += kLanes) {
      const __m256i in = live(keys - i);
      m = _mm256_max_ps(_mm256_blendv_ps(lowest, _mm256_maskload_ps(probs + g * keys + i, in),
                                         _mm256_castsi256_ps(in)),
                        m);
    }
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 0x01));
    m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4E));
    shift[g] = _mm256_max_ps(m, _mm256_permute_ps(m, 0xB1));
    sum[g] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < keys; i += kLanes) {
    const __m256i in = live(keys - i);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      float* p = probs + g * keys + i;
      const __m256 e =
          _mm256_and_ps(_mm256_castsi256_ps(in), ExpVec(_mm256_maskload_ps(p, in), shift[g], one));
      _mm256_maskstore_ps(p, in, e);
      sum[g] = _mm256_add_ps(sum[g], e);
    }
  }
}

#include "kernels/cpu/attention_groups.inc"  // Scores, Accumulate, Softmax

}  // namespace

AttentionKernels AttentionKernelsAvx2(KvCacheDType dtype) {
  return ForKvDType(dtype, []<KvCacheDType T>() {
    return AttentionKernels{&Scores<T>, &Accumulate<T>, &Softmax};
  });
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected

namespace kvserve::cpu::internal {
AttentionKernels AttentionKernelsAvx2(KvCacheDType dtype) { return AttentionKernelsScalar(dtype); }
}  // namespace kvserve::cpu::internal

#endif
