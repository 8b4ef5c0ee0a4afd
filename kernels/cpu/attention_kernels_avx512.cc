// AVX-512 F/BW/VL attention inner loops. Compiled with per-file target flags
// (attention_kernels.h).

#include "kernels/cpu/attention_kernels.h"

#if defined(__AVX512F__)

#include <algorithm>

#include "kernels/cpu/avx512_intrinsics.h"
#include "kernels/cpu/logits_exp.h"

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 16;
constexpr int kChunksPerPass = 4;  // 16-float output chunks per accumulate pass
constexpr int64_t kLine = 64;      // cache line bytes (RowPrefetch)

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

// Score tiles: K keys x G queries of the group, K * G in {1, 2, 4, 16} dot products in flight.
// Each chunk of a key row is decoded once for the G queries. acc[g * K + j] is query g's sum
// for key j, so after HorizontalSum16 query g's K scores are lanes g * K .. g * K + K - 1.
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
  __m512 acc[kDots];
#pragma GCC unroll 16
  for (int i = 0; i < kDots; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += kLanes) {
    const __mmask16 m = TailMask(head_dim - d);
    // A new line of each row: request K lines of the prefetch rows, in address order.
    const bool request = pf != nullptr && d * kElemBytes % kLine == 0;
    int64_t line = d * kElemBytes * K;
    __m512 qv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) qv[g] = _mm512_maskz_loadu_ps(m, q + g * head_dim + d);
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) {
      if (request && line < pf_bytes) __builtin_prefetch(pf + line, 0, 3);
      line += kLine;
      const __m512 kv = Elem<T>::Load(k + j * head_dim + d, m);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g * K + j] = _mm512_fmadd_ps(qv[g], kv, acc[g * K + j]);
    }
  }
  if constexpr (kDots == 16) {
    __m512 s = HorizontalSum16(acc);
    if constexpr (KvCacheDTypeHasScales(T)) {
      __m512 rs;
      if constexpr (K == 16) {
        rs = _mm512_loadu_ps(row_scales);
      } else if constexpr (K == 8) {
        const __m256d half = _mm256_castps_pd(_mm256_loadu_ps(row_scales));
        rs = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(half), half, 1));
      } else {
        rs = _mm512_broadcast_f32x4(_mm_loadu_ps(row_scales));
      }
      s = _mm512_mul_ps(s, rs);
    }
    s = _mm512_mul_ps(s, _mm512_set1_ps(scale));
    if constexpr (G == 1) {
      _mm512_storeu_ps(scores, s);
    } else if constexpr (G == 2) {
      _mm256_storeu_ps(scores, _mm512_castps512_ps256(s));
      _mm256_storeu_ps(scores + stride,
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    } else {
      _mm_storeu_ps(scores, _mm512_castps512_ps128(s));
      _mm_storeu_ps(scores + stride, _mm512_extractf32x4_ps(s, 1));
      _mm_storeu_ps(scores + 2 * stride, _mm512_extractf32x4_ps(s, 2));
      _mm_storeu_ps(scores + 3 * stride, _mm512_extractf32x4_ps(s, 3));
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

// G queries over a run: tiles of 16 / G keys, then (one query) 4 keys, then single keys.
template <KvCacheDType T, int G>
void ScoresForQueries(const float* q, const typename Elem<T>::Type* k, const float* row_scales,
                      int64_t count, int64_t head_dim, float scale, float* scores, int64_t stride,
                      RowPrefetch prefetch) {
  constexpr int kKeys = 16 / G;
  const int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(typename Elem<T>::Type));
  const auto* pf = static_cast<const uint8_t*>(prefetch.data);
  int64_t key = 0;
  const auto tile = [&]<int kTileKeys, int kTileQueries>() {
    ScoreTile<T, kTileKeys, kTileQueries>(
        q, k + key * head_dim, row_scales + (row_scales ? key : 0), head_dim, scale, scores + key,
        stride, pf != nullptr ? pf + key * row_bytes : nullptr, prefetch.rows - key);
  };
  for (; key + kKeys <= count; key += kKeys) tile.template operator()<kKeys, G>();
  if constexpr (G == 1) {
    for (; key + 4 <= count; key += 4) tile.template operator()<4, 1>();
  }
  for (; key < count; ++key) tile.template operator()<1, G>();
}

template <KvCacheDType T>
float Weight(const float* probs, const float* row_scales, int64_t key) {
  if constexpr (KvCacheDTypeHasScales(T)) return probs[key] * row_scales[key];
  return probs[key];
}

// G queries x C chunks of 16 output elements from element d0 (the head's last chunk masked): each
// chunk of a value row is decoded once for the G queries. Each key also requests a pass's worth
// of the prefetch run's bytes, in address order.
template <KvCacheDType T, int G, int C>
inline void AccumulateTile(const float* probs, int64_t probs_stride, const float* row_scales,
                           const typename Elem<T>::Type* v, int64_t count, int64_t head_dim,
                           int64_t d0, float* acc, RowPrefetch prefetch) {
  constexpr int64_t kElemBytes = sizeof(typename Elem<T>::Type);
  constexpr int64_t kPassBytes = C * kLanes * kElemBytes;
  const int64_t row_bytes = head_dim * kElemBytes;
  const int64_t pass_bytes = std::min(kPassBytes, row_bytes - d0 * kElemBytes);
  // Requests in address order: as if the prefetch run were laid out pass by pass, this pass
  // takes its `count` rows' share of the bytes from offset d0 * count.
  const auto* pf = static_cast<const uint8_t*>(prefetch.data);
  const int64_t pf_bytes = pf != nullptr ? prefetch.rows * row_bytes : 0;
  int64_t pf_line = d0 * kElemBytes * count;
  __mmask16 m[C];
  __m512 a[G * C];
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) m[c] = TailMask(head_dim - d0 - c * kLanes);
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      a[g * C + c] = _mm512_maskz_loadu_ps(m[c], acc + g * head_dim + d0 + c * kLanes);
    }
  }
  for (int64_t key = 0; key < count; ++key) {
    if (pf_line < pf_bytes) {
      for (int64_t b = 0; b < pass_bytes; b += kLine) {
        if (pf_line + b < pf_bytes) __builtin_prefetch(pf + pf_line + b, 0, 3);
      }
      pf_line += pass_bytes;
    }
    __m512 w[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      w[g] = _mm512_set1_ps(Weight<T>(probs + g * probs_stride, row_scales, key));
    }
    const auto* vr = v + key * head_dim + d0;
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m512 vv = Elem<T>::Load(vr + c * kLanes, m[c]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) a[g * C + c] = _mm512_fmadd_ps(w[g], vv, a[g * C + c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      _mm512_mask_storeu_ps(acc + g * head_dim + d0 + c * kLanes, m[c], a[g * C + c]);
    }
  }
}

// G queries over the head: passes of kChunksPerPass chunks, then single chunks.
template <KvCacheDType T, int G>
void AccumulateForQueries(const float* probs, int64_t probs_stride, const float* row_scales,
                          const typename Elem<T>::Type* v, int64_t count, int64_t head_dim,
                          float* acc, RowPrefetch prefetch) {
  int64_t d0 = 0;
  for (; d0 + kLanes * (kChunksPerPass - 1) < head_dim; d0 += kLanes * kChunksPerPass) {
    AccumulateTile<T, G, kChunksPerPass>(probs, probs_stride, row_scales, v, count, head_dim, d0,
                                         acc, prefetch);
  }
  for (; d0 < head_dim; d0 += kLanes) {
    AccumulateTile<T, G, 1>(probs, probs_stride, row_scales, v, count, head_dim, d0, acc, prefetch);
  }
}

#include "kernels/cpu/exp_avx512.inc"        // ExpVec
#include "kernels/cpu/lane_sum8.inc"         // LaneSum8

// G rows of AttentionSoftmaxFn at once: the exps in place, each row's eight lane sums in sum[g]
// (attention_groups.inc's Softmax combines them). The rows' exps are interleaved (one row's chain
// of dependent steps is too short to hide the exp's latency), sixteen keys a step, the lane sums
// taking each step's two halves in order (a lane past the row adds +0, which leaves a sum of exps
// unchanged).
template <int G>
void SoftmaxRows(float* probs, int64_t keys, __m256* sum) {
  const __m512 lowest = _mm512_set1_ps(-__builtin_inff());
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 shift[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    // max(v, m) keeps m where v is NaN, as the scalar loop's std::max(m, v) does.
    __m512 m = lowest;
    for (int64_t i = 0; i < keys; i += kLanes) {
      m = _mm512_max_ps(_mm512_mask_loadu_ps(lowest, TailMask(keys - i), probs + g * keys + i), m);
    }
    shift[g] = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    sum[g] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < keys; i += kLanes) {
    const __mmask16 live = TailMask(keys - i);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      float* p = probs + g * keys + i;
      const __m512 e =
          _mm512_maskz_mov_ps(live, ExpVec(_mm512_maskz_loadu_ps(live, p), shift[g], one));
      _mm512_mask_storeu_ps(p, live, e);
      sum[g] = _mm256_add_ps(sum[g], _mm512_castps512_ps256(e));
      sum[g] =
          _mm256_add_ps(sum[g], _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
  }
}

#include "kernels/cpu/attention_groups.inc"  // Scores, Accumulate, Softmax

}  // namespace

AttentionKernels AttentionKernelsAvx512(KvCacheDType dtype) {
  return ForKvDType(dtype, []<KvCacheDType T>() {
    return AttentionKernels{&Scores<T>, &Accumulate<T>, &Softmax};
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
