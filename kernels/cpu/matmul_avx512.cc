// AVX-512 (F/BW/VL, plus F16C for scalar half loads) matmul path. Compiled with per-file target
// flags; see matmul_impl.h for why only intrinsics and file-local code appear here.

#include "kernels/cpu/matmul_impl.h"

#if defined(__AVX512F__)

#include "kernels/cpu/avx512_intrinsics.h"

#include <cstring>
#include <type_traits>
#include <new>

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 16;
// x rows from which the panel path takes over; fewer take the decode tiles.
constexpr int kMaxRows = 4;

using Vec = __m512;
Vec VecZero() { return _mm512_setzero_ps(); }
Vec VecLoad(const float* p) { return _mm512_load_ps(p); }
void VecStore(float* p, Vec v) { _mm512_store_ps(p, v); }
Vec VecFmadd(Vec a, Vec b, Vec acc) { return _mm512_fmadd_ps(a, b, acc); }

// Batched register tile, 6 x 4: 24 accumulators + 4 weight vectors + 1 x vector of the 32 zmm
// registers; 10 loads per 24 FMAs.
constexpr int kPanelRows = 6;
constexpr int kPanelTileCols = 4;

#include "kernels/cpu/avx512_reduce.inc"  // HorizontalSum, HorizontalSum4

// Stores HorizontalSum(acc[c]) (+ bias[c * col_step]) at y[c * col_step] for c < C.
template <int C>
void StoreSums(const __m512* acc, const float* bias, float* y, int64_t col_step) {
  float s[C];
  int c = 0;
  for (; c + 4 <= C; c += 4) HorizontalSum4(acc + c, s + c);
  for (; c < C; ++c) s[c] = HorizontalSum(acc[c]);
  for (c = 0; c < C; ++c) y[c * col_step] = bias != nullptr ? s[c] + bias[c * col_step] : s[c];
}

// The first n (<= 16) of 16 lanes.
__mmask16 Mask16(int n) { return static_cast<__mmask16>((1u << n) - 1u); }

// Weight converters: Load() gives the kVecs fp32 vectors of the kStep elements at kk, and LoadX()
// the x vectors they multiply, in the same element order; the Masked forms read only the first
// `rest` (< kStep) elements and give zeros for the others.
struct F32W {
  static constexpr int kStep = 16, kVecs = 1, kElemBytes = 4;
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    out[0] = _mm512_loadu_ps(reinterpret_cast<const float*>(row) + kk);
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, int rest, __m512* out) {
    out[0] = _mm512_maskz_loadu_ps(Mask16(rest), reinterpret_cast<const float*>(row) + kk);
  }
  static void LoadX(const float* x, __m512* out) { out[0] = _mm512_loadu_ps(x); }
  static void LoadXMasked(const float* x, int rest, __m512* out) {
    out[0] = _mm512_maskz_loadu_ps(Mask16(rest), x);
  }
};

// 32 f16 weights per step from one 64-byte load; the vectors hold elements 0-15 and 16-31. One
// 32-byte load per 16 weights streamed 13 % slower in one-thread decode on Zen 4 (25 against 29
// GB/s); on AVX2 the opposite held (16-byte loads 29, 32-byte 24).
struct F16W {
  static constexpr int kStep = 32, kVecs = 2, kElemBytes = 2;
  static void Widen(__m512i h, __m512* out) {
    out[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    out[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  }
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    Widen(_mm512_loadu_si512(row + 2 * kk), out);
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, int rest, __m512* out) {
    Widen(_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << rest) - 1), row + 2 * kk), out);
  }
  static void LoadX(const float* x, __m512* out) {
    out[0] = _mm512_loadu_ps(x);
    out[1] = _mm512_loadu_ps(x + 16);
  }
  static void LoadXMasked(const float* x, int rest, __m512* out) {
    out[0] = _mm512_maskz_loadu_ps(Mask16(rest < 16 ? rest : 16), x);
    out[1] = _mm512_maskz_loadu_ps(Mask16(rest > 16 ? rest - 16 : 0), x + 16);
  }
};

// bf16 is the top half of an fp32, so interleaving zero words below 32 weights widens them with
// one in-lane shuffle per 16 (vpmovzxwd + vpslld were two, one crossing lanes): the two vectors
// hold elements {0-3, 8-11, 16-19, 24-27} and {4-7, 12-15, 20-23, 28-31}, and LoadX gives x in that
// order (one 128-bit-lane shuffle per vector).
struct BF16W {
  static constexpr int kStep = 32, kVecs = 2, kElemBytes = 2;
  static void Widen(__m512i h, __m512* out) {
    out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), h));
    out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), h));
  }
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    Widen(_mm512_loadu_si512(row + 2 * kk), out);
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, int rest, __m512* out) {
    Widen(_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << rest) - 1), row + 2 * kk), out);
  }
  static void Regroup(__m512 lo, __m512 hi, __m512* out) {
    out[0] = _mm512_shuffle_f32x4(lo, hi, 0x88);  // 128-bit lanes 0, 2 of lo, then of hi
    out[1] = _mm512_shuffle_f32x4(lo, hi, 0xdd);  // lanes 1, 3
  }
  static void LoadX(const float* x, __m512* out) {
    Regroup(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16), out);
  }
  static void LoadXMasked(const float* x, int rest, __m512* out) {
    Regroup(_mm512_maskz_loadu_ps(Mask16(rest < 16 ? rest : 16), x),
            _mm512_maskz_loadu_ps(Mask16(rest > 16 ? rest - 16 : 0), x + 16), out);
  }
};

#include "kernels/cpu/matmul_int8.inc"

// The decode tiles (fewer than kMaxRows x rows; more take the panel path). A piece of columns is
// cut into kStreams equal parts, and tile i takes weight row i of every part against x rows
// 0 .. R - 1: each part is read as one ascending stream, start to end, which the hardware
// prefetchers follow at the speed of a plain read loop, and the parts' rows give the core
// independent FMA chains. One accumulator per (weight row, x row), as in the panel path: every
// output keeps its reduction order. One-thread decode on Zen 4, medians of six alternating runs,
// fraction of the triad (docs/benchmarks.md, "Weight streams"): one stream (one weight row at a
// time, a single chain of FMAs) f32 0.83, f16 0.85, bf16 0.85; two streams 0.91, 0.89, 0.93; four
// 0.86, 0.85, 0.86. Eight rows side by side within a page were slower than one stream ("One weight
// row at a time").
constexpr int kStreams = 2;

template <class W, int R, int S>
void StreamTile(const MatmulArgs& a, const MatmulPlan& plan, const int64_t* cols) {
  const uint8_t* w[S];
  for (int s = 0; s < S; ++s) w[s] = static_cast<const uint8_t*>(a.w) + cols[s] * plan.w_row_bytes;
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = a.x + r * a.x_stride;
  __m512 acc[S][R];
  for (auto& row : acc) {
    for (__m512& v : row) v = _mm512_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + W::kStep <= a.k; kk += W::kStep) {
    __m512 wv[S][W::kVecs];
    for (int s = 0; s < S; ++s) W::Load(w[s], kk, wv[s]);
    for (int r = 0; r < R; ++r) {
      __m512 xv[W::kVecs];
      W::LoadX(x[r] + kk, xv);
      for (int v = 0; v < W::kVecs; ++v) {
        for (int s = 0; s < S; ++s) acc[s][r] = _mm512_fmadd_ps(xv[v], wv[s][v], acc[s][r]);
      }
    }
  }
  if (kk < a.k) {  // masked final step: zeros beyond k, as the panel path's zero padding
    const int rest = static_cast<int>(a.k - kk);
    __m512 wv[S][W::kVecs];
    for (int s = 0; s < S; ++s) W::LoadMasked(w[s], kk, rest, wv[s]);
    for (int r = 0; r < R; ++r) {
      __m512 xv[W::kVecs];
      W::LoadXMasked(x[r] + kk, rest, xv);
      for (int v = 0; v < W::kVecs; ++v) {
        for (int s = 0; s < S; ++s) acc[s][r] = _mm512_fmadd_ps(xv[v], wv[s][v], acc[s][r]);
      }
    }
  }
  for (int s = 0; s < S; ++s) {
    for (int r = 0; r < R; ++r) {
      StoreSums<1>(&acc[s][r], a.bias != nullptr ? a.bias + cols[s] : nullptr,
                   a.y + r * a.y_stride + cols[s], 1);
    }
  }
}

template <class W, int R>
void StreamTiles(const MatmulArgs& a, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  const int64_t part = (n_end - n_begin) / kStreams;
  for (int64_t i = 0; i < part; ++i) {
    int64_t cols[kStreams];
    for (int s = 0; s < kStreams; ++s) cols[s] = n_begin + s * part + i;
    StreamTile<W, R, kStreams>(a, plan, cols);
  }
  for (int64_t col = n_begin + kStreams * part; col < n_end; ++col) {
    StreamTile<W, R, 1>(a, plan, &col);
  }
}

// ---- Batched path (m >= kMaxRows): prefill and batched decode (matmul_panel.inc). ----
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
  // registers.
  static_assert(kMaxRows == 4, "one case per row count below kMaxRows");
  switch (a.m) {
    case 3:
      StreamTiles<W, 3>(a, plan, n_begin, n_end);
      break;
    case 2:
      StreamTiles<W, 2>(a, plan, n_begin, n_end);
      break;
    case 1:
      StreamTiles<W, 1>(a, plan, n_begin, n_end);
      break;
    default:
      break;
  }
}

}  // namespace

void MatmulColumnsAvx512(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
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

void MatmulColumnsAvx512(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                         int64_t n_end) {
  MatmulColumnsScalar(args, plan, n_begin, n_end);
}

}  // namespace kvserve::cpu::internal

#endif
