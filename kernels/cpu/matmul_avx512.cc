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

// Weight rows per tile when fewer than kMaxRows x rows remain (decode): more independent FMA
// chains. Tile shapes never change any element's reduction order.
constexpr int kColsFewRows = 8;
constexpr int kCols = 4;  // weight rows per register tile

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

struct F16W {
  static constexpr int kStep = 16, kVecs = 1, kElemBytes = 2;
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    out[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * kk)));
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, int rest, __m512* out) {
    out[0] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Mask16(rest), row + 2 * kk));
  }
  static void LoadX(const float* x, __m512* out) { out[0] = _mm512_loadu_ps(x); }
  static void LoadXMasked(const float* x, int rest, __m512* out) {
    out[0] = _mm512_maskz_loadu_ps(Mask16(rest), x);
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

#include "kernels/cpu/matmul_walk.inc"  // before the files that use it

#include "kernels/cpu/matmul_int8.inc"

// One R x C register tile: rows row0.., weight rows col0, col0 + col_step, ...,
// col0 + (C - 1) * col_step.
template <class W, int R, int C>
void Tile(const MatmulArgs& a, const MatmulPlan& plan, int64_t row0, int64_t col0, int64_t col_step,
          WeightLookahead* walk) {
  WeightLookahead ahead = *walk;  // in registers while the tile runs (WeightLookahead)
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = a.x + (row0 + r) * a.x_stride;
  const uint8_t* w[C];
  for (int c = 0; c < C; ++c) {
    w[c] = static_cast<const uint8_t*>(a.w) + (col0 + c * col_step) * plan.w_row_bytes;
  }
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + W::kStep <= a.k; kk += W::kStep) {
    ahead.Advance(C * W::kStep * W::kElemBytes);
    __m512 xv[R][W::kVecs];
    for (int r = 0; r < R; ++r) W::LoadX(x[r] + kk, xv[r]);
    for (int c = 0; c < C; ++c) {  // each weight row used as soon as it is converted
      __m512 wv[W::kVecs];
      W::Load(w[c], kk, wv);
      for (int r = 0; r < R; ++r) {
        for (int v = 0; v < W::kVecs; ++v) acc[r][c] = _mm512_fmadd_ps(xv[r][v], wv[v], acc[r][c]);
      }
    }
  }
  if (kk < a.k) {  // masked final step: zeros beyond k, as the panel path's zero padding
    const int rest = static_cast<int>(a.k - kk);
    __m512 xv[R][W::kVecs];
    for (int r = 0; r < R; ++r) W::LoadXMasked(x[r] + kk, rest, xv[r]);
    for (int c = 0; c < C; ++c) {
      __m512 wv[W::kVecs];
      W::LoadMasked(w[c], kk, rest, wv);
      for (int r = 0; r < R; ++r) {
        for (int v = 0; v < W::kVecs; ++v) acc[r][c] = _mm512_fmadd_ps(xv[r][v], wv[v], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    StoreSums<C>(acc[r], a.bias != nullptr ? a.bias + col0 : nullptr,
                 a.y + (row0 + r) * a.y_stride + col0, col_step);
  }
  *walk = ahead;
}

// The decode tiles: every x row (fewer than kMaxRows; more take the panel path) against weight
// rows col0, col0 + col_step, ..., col0 + (C - 1) * col_step.
template <class W, int C>
void DecodeRows(const MatmulArgs& a, const MatmulPlan& plan, int64_t col0, int64_t col_step,
                WeightLookahead* ahead) {
  static_assert(kMaxRows == 4, "one case per row count below kMaxRows");
  switch (a.m) {
    case 3:
      Tile<W, 3, C>(a, plan, 0, col0, col_step, ahead);
      break;
    case 2:
      Tile<W, 2, C>(a, plan, 0, col0, col_step, ahead);
      break;
    case 1:
      Tile<W, 1, C>(a, plan, 0, col0, col_step, ahead);
      break;
    default:
      break;
  }
}

// ---- Batched path (m >= kMaxRows): prefill and batched decode (matmul_panel.inc). ----
#include "kernels/cpu/matmul_panel.inc"

template <class W>
void Columns(const MatmulArgs& a, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  if (a.m >= kMaxRows) {
    PanelColumns<FloatPanel<W>>(a, plan, n_begin, n_end);
    return;
  }
  // Decode-like (fewer rows than a register tile): weights straight from memory, converted in
  // registers, more weight rows in flight.
  WalkDecodeColumns<kColsFewRows, kCols>(
      a.w, plan.w_row_bytes, n_begin, n_end,
      [&](auto cols, int64_t col, int64_t step, WeightLookahead* ahead) {
        DecodeRows<W, decltype(cols)::value>(a, plan, col, step, ahead);
      });
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
