// AVX2 + FMA + F16C matmul path. Compiled with per-file target flags; see matmul_impl.h for why
// only intrinsics and file-local code appear here.

#include "kernels/cpu/matmul_impl.h"

#if defined(__AVX2__)

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <type_traits>

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 8;
// x rows from which the panel path takes over; fewer take the decode tiles.
constexpr int kMaxRows = 4;
// Weight streams of the decode tiles (fewer than kMaxRows x rows; Columns says why): four for one
// x row, two for two or three (4 and 6 accumulators of the 16 ymm registers).
constexpr int kStreamsOneRow = 4;
constexpr int kStreamsFewRows = 2;

// Weight converters: Load() gives the kVecs fp32 vectors of the kStep elements at kk, and LoadX()
// the x vectors they multiply, in the same element order.
struct F32W {
  static constexpr int kStep = 8, kVecs = 1, kElemBytes = 4;
  static void Load(const uint8_t* row, int64_t kk, __m256* out) {
    out[0] = _mm256_loadu_ps(reinterpret_cast<const float*>(row) + kk);
  }
  static void LoadX(const float* x, __m256* out) { out[0] = _mm256_loadu_ps(x); }
};

struct F16W {
  static constexpr int kStep = 8, kVecs = 1, kElemBytes = 2;
  static void Load(const uint8_t* row, int64_t kk, __m256* out) {
    out[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * kk)));
  }
  static void LoadX(const float* x, __m256* out) { out[0] = _mm256_loadu_ps(x); }
};

// bf16 is the top half of an fp32, so interleaving zero words below 16 weights widens them with
// one in-lane shuffle per eight: the two vectors hold elements {0-3, 8-11} and {4-7, 12-15}, and
// LoadX gives x in that order. vpmovzxwd + vpslld (two operations per eight, one crossing lanes)
// held a one-row GEMV in L2 to 28-32 GB/s on one Zen 4 thread, below what memory delivers.
struct BF16W {
  static constexpr int kStep = 16, kVecs = 2, kElemBytes = 2;
  static void Load(const uint8_t* row, int64_t kk, __m256* out) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * kk));
    out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), h));
    out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), h));
  }
  static void LoadX(const float* x, __m256* out) {
    const __m256 lo = _mm256_loadu_ps(x);
    const __m256 hi = _mm256_loadu_ps(x + 8);
    out[0] = _mm256_permute2f128_ps(lo, hi, 0x20);
    out[1] = _mm256_permute2f128_ps(lo, hi, 0x31);
  }
};

#include "kernels/cpu/matmul_int8.inc"

#include "kernels/cpu/avx2_reduce.inc"  // HorizontalSum, HorizontalSum4

// Stores HorizontalSum(acc[c]) (+ bias[c * col_step]) at y[c * col_step] for c < C.
template <int C>
void StoreSums(const __m256* acc, const float* bias, float* y, int64_t col_step) {
  float s[C];
  int c = 0;
  for (; c + 4 <= C; c += 4) HorizontalSum4(acc + c, s + c);
  for (; c < C; ++c) s[c] = HorizontalSum(acc[c]);
  for (c = 0; c < C; ++c) y[c * col_step] = bias != nullptr ? s[c] + bias[c * col_step] : s[c];
}

// Stores a register tile's sums: HorizontalSum(acc[r][c]) (+ bias[c]) at y[r * y_stride + c], row
// by row (GCC inlines these). Eight accumulators at a time through HorizontalSum8 was no faster
// for the 4 x 3 tile (batch-32 f32 on two threads: ~5 % slower in three alternating runs, within
// this VM's noise).
template <int R, int C>
void StoreTileSums(const __m256 (&acc)[R][C], const float* bias, float* y, int64_t y_stride) {
  for (int r = 0; r < R; ++r) StoreSums<C>(acc[r], bias, y + r * y_stride, 1);
}

// One R x C register tile: rows row0.., weight rows col0...
template <class W, int R, int C>
void Tile(const MatmulArgs& a, const MatmulPlan& plan, int64_t row0, int64_t col0,
          int64_t col_step) {
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = a.x + (row0 + r) * a.x_stride;
  const uint8_t* w[C];
  for (int c = 0; c < C; ++c) {
    w[c] = static_cast<const uint8_t*>(a.w) + (col0 + c * col_step) * plan.w_row_bytes;
  }
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + W::kStep <= a.k; kk += W::kStep) {
    __m256 xv[R][W::kVecs];
    for (int r = 0; r < R; ++r) W::LoadX(x[r] + kk, xv[r]);
    // Each weight row used as soon as it is converted: all C rows first (8 x 2 vectors for bf16)
    // left GCC no registers for the accumulators, and it spilled them on every step.
    for (int c = 0; c < C; ++c) {
      __m256 wv[W::kVecs];
      W::Load(w[c], kk, wv);
      for (int r = 0; r < R; ++r) {
        for (int v = 0; v < W::kVecs; ++v) acc[r][c] = _mm256_fmadd_ps(xv[r][v], wv[v], acc[r][c]);
      }
    }
  }
  if (kk < a.k) {  // zero-padded final step
    const int64_t rest = a.k - kk;
    __m256 wv[C][W::kVecs];
    for (int c = 0; c < C; ++c) {
      alignas(32) uint8_t buf[W::kStep * W::kElemBytes] = {};
      std::memcpy(buf, w[c] + kk * W::kElemBytes, rest * W::kElemBytes);
      W::Load(buf, 0, wv[c]);
    }
    for (int r = 0; r < R; ++r) {
      alignas(32) float xb[W::kStep] = {};
      std::memcpy(xb, x[r] + kk, rest * sizeof(float));
      __m256 xv[W::kVecs];
      W::LoadX(xb, xv);
      for (int v = 0; v < W::kVecs; ++v) {
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv[v], wv[c][v], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    StoreSums<C>(acc[r], a.bias != nullptr ? a.bias + col0 : nullptr,
                 a.y + (row0 + r) * a.y_stride + col0, col_step);
  }
}

// The decode tiles: the x rows (fewer than kMaxRows) against weight rows col0, col0 + col_step,
// ..., col0 + (C - 1) * col_step.
template <class W, int C>
void DecodeRows(const MatmulArgs& a, const MatmulPlan& plan, int64_t col0, int64_t col_step) {
  static_assert(kMaxRows == 4, "one case per row count below kMaxRows");
  switch (a.m) {
    case 3:
      Tile<W, 3, C>(a, plan, 0, col0, col_step);
      break;
    case 2:
      Tile<W, 2, C>(a, plan, 0, col0, col_step);
      break;
    case 1:
      Tile<W, 1, C>(a, plan, 0, col0, col_step);
      break;
    default:
      break;
  }
}

// Columns [n_begin, n_end) cut into S equal parts, tile i taking weight row i of every part: each
// part is read as one ascending stream (Columns says why).
template <class W, int S>
void StreamTiles(const MatmulArgs& a, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  const int64_t part = (n_end - n_begin) / S;
  for (int64_t i = 0; i < part; ++i) DecodeRows<W, S>(a, plan, n_begin + i, part);
  for (int64_t col = n_begin + S * part; col < n_end; ++col) DecodeRows<W, 1>(a, plan, col, 1);
}

// ---- Batched path (m >= kMaxRows): prefill and batched decode (matmul_panel.inc). ----
using Vec = __m256;
Vec VecZero() { return _mm256_setzero_ps(); }
Vec VecLoad(const float* p) { return _mm256_load_ps(p); }
void VecStore(float* p, Vec v) { _mm256_store_ps(p, v); }
Vec VecFmadd(Vec a, Vec b, Vec acc) { return _mm256_fmadd_ps(a, b, acc); }
// Batched register tile, 4 x 3 of the 16 ymm registers: 12 accumulators + 3 weight vectors + 1 x
// vector, 7 loads per 12 FMAs. bf16 in place (two vectors per load, widened against a zero
// register) has one register too few for that and takes 4 x 2. The previous 4 x 2 for every
// format had 8 chains for the 8 FMAs in flight (2 units x 4 cycles of latency) and ran f32 at
// ~0.56 of the FMA peak (model matmuls at batch 32, one Zen 4 thread); 4 x 3 ran it at 0.6-0.65.
constexpr int kPanelRows = 4;
template <class K>
constexpr int kPanelTileCols = K::kVecs == 1 ? 3 : 2;
constexpr int kPanelCols = 24;  // weight rows per panel: whole 3- and 2-wide tiles
// k elements per slice: a 4 x 3 tile's seven rows of 1024 f32 (28 KiB) fit the L1. At k = 2816
// (batch 256, two threads) whole rows ran f32 at 0.75 and bf16 at 0.66 of the FMA peak, slices of
// 1024 at 0.78-0.82 and 0.69-0.79; 256 and 512 were no better (docs/benchmarks.md).
constexpr int64_t kPanelKBlock = 1024;
// The next panel's prefetch: one line every other tile step (12 or 8 FMAs, 6 or 4 cycles on Zen 4:
// ~5-8 bytes per cycle, as the AVX-512 tile asks). The AVX-512 rate of two lines per step asked
// for each panel in its first fifth, faster than memory delivers it, and held up the tiles'
// loads: a batch-32 step took 13-30 % (f32) and 15-25 % (bf16) longer on two threads, 10-15 %
// (f32) on one (docs/benchmarks.md).
constexpr int kPanelPrefetchLines = 1;
constexpr int kPanelPrefetchEvery = 2;

#include "kernels/cpu/matmul_panel.inc"

template <class W>
void Columns(const MatmulArgs& a, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  if (a.m >= kMaxRows) {
    if (a.k % W::kStep == 0) {  // the weights' rows are the panel (FloatPanel says why)
      PanelColumns<FloatPanel<W, true>>(a, plan, n_begin, n_end);
    } else {
      PanelColumns<FloatPanel<W, false>>(a, plan, n_begin, n_end);
    }
    return;
  }
  // Decode-like (fewer rows than a register tile): weights straight from memory, converted in
  // registers, each piece of columns cut into equal parts read side by side, every part one
  // ascending stream start to end. The hardware prefetchers follow such streams at the speed of a
  // plain read loop, and the parts' weight rows give the core independent FMA chains: one row at
  // a time has a single chain through its accumulator, four FMAs per 64 bytes of f16/bf16, which
  // held those to 17 GB/s. Eight rows side by side within a page (plus a software look-ahead)
  // streamed 9-17 % slower than one ascending stream. One-thread decode on Zen 4, AVX2 forced,
  // fraction of the triad, medians of six alternating runs (docs/benchmarks.md, "Weight
  // streams"): f32 0.86 -> 0.93, f16 0.76 -> 0.87, bf16 0.73 -> 0.83 with four streams against
  // the previous tiles; two and three streams were slower, six and eight slower still. Tile
  // shapes never change an element's reduction order.
  if (a.m == 1) {
    StreamTiles<W, kStreamsOneRow>(a, plan, n_begin, n_end);
  } else {
    StreamTiles<W, kStreamsFewRows>(a, plan, n_begin, n_end);
  }
}

}  // namespace

void QuantizeActivationRowAvx2(const float* x, int64_t k, int64_t scale_block, int8_t* q, float* d,
                               int32_t* sums) {
  constexpr float kRound = 12582912.0f;  // QuantizeActivationRow's rounding constant
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 round = _mm256_set1_ps(kRound);
  const __m256 lo = _mm256_set1_ps(-127.0f);
  const __m256 hi = _mm256_set1_ps(127.0f);
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / scale_block; ++b) {
    const float* xb = x + b * scale_block;
    // max(|x|, m) keeps m when |x| is NaN, as std::max(m, |x|) does in the portable version.
    __m256 vmax = _mm256_setzero_ps();
    for (int64_t j = 0; j < scale_block; j += 8) {
      vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + j), abs_mask), vmax);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float amax = 0.0f;
    for (float m : lanes) amax = std::max(amax, m);
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    d[b] = amax / 127.0f;
    for (int64_t j = 0; j < scale_block; j += 32) {
      __m256i v[4];
      for (int i = 0; i < 4; ++i) {
        const __m256 r = _mm256_sub_ps(
            _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8 * i), inv), round), round);
        v[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
      }
      const __m256i s =
          _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
      const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
      sums[(b * scale_block + j) / 32] =
          _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
      const __m256i bytes =
          _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * scale_block + j),
                          _mm256_permutevar8x32_epi32(bytes, unshuffle));
    }
  }
}

void MatmulColumnsAvx2(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                       int64_t n_end) {
  if (Int8Matmul(args, plan, n_begin, n_end)) return;
  switch (args.w_dtype) {
    case DType::kF32:
      Columns<F32W>(args, plan, n_begin, n_end);
      break;
    case DType::kF16:
      Columns<F16W>(args, plan, n_begin, n_end);
      break;
    case DType::kBF16:
      Columns<BF16W>(args, plan, n_begin, n_end);
      break;
    default:  // formats without a kernel on this path yet
      MatmulColumnsScalar(args, plan, n_begin, n_end);
      break;
  }
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to scalar

namespace kvserve::cpu::internal {

void QuantizeActivationRowAvx2(const float* x, int64_t k, int64_t scale_block, int8_t* q, float* d,
                               int32_t* sums) {
  QuantizeActivationRow(x, k, scale_block, q, d, sums);
}

void MatmulColumnsAvx2(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                       int64_t n_end) {
  MatmulColumnsScalar(args, plan, n_begin, n_end);
}

}  // namespace kvserve::cpu::internal

#endif
