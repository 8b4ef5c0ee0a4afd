// AVX-512 (F/BW/VL, plus F16C for scalar half loads) matmul path. Compiled with per-file target
// flags; see matmul_impl.h for why only intrinsics and file-local code appear here.

#include "kernels/cpu/matmul_impl.h"

#if defined(__AVX512F__)

// g++ 12's AVX-512 intrinsics seed results with `__m512 __Y = __Y;` (_mm512_undefined_ps), which
// -Wmaybe-uninitialized flags at every inlined use (a known g++ 12 false positive);
// silence just that header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 16;
constexpr int kMaxRows = 4;  // x rows per register tile
// Weight rows per tile when fewer than kMaxRows x rows remain (decode): more independent FMA
// chains. Tile shapes never change any element's reduction order.
constexpr int kColsFewRows = 8;
constexpr int kCols = 4;  // weight rows per register tile

// Weight converters: Load() gives the kVecs fp32 vectors of the kStep elements at kk.
struct F32W {
  static constexpr int kStep = 16, kVecs = 1;
  static constexpr bool kBlocked = false;
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    out[0] = _mm512_loadu_ps(reinterpret_cast<const float*>(row) + kk);
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, __mmask16 m, __m512* out) {
    out[0] = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + kk);
  }
};

struct F16W {
  static constexpr int kStep = 16, kVecs = 1;
  static constexpr bool kBlocked = false;
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    out[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * kk)));
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, __mmask16 m, __m512* out) {
    out[0] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * kk));
  }
};

struct BF16W {
  static constexpr int kStep = 16, kVecs = 1;
  static constexpr bool kBlocked = false;
  static __m512 Widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    out[0] = Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * kk)));
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, __mmask16 m, __m512* out) {
    out[0] = Widen(_mm256_maskz_loadu_epi16(m, row + 2 * kk));
  }
};

__m512 BlockScale(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block, sizeof(d));
  return _mm512_set1_ps(_cvtsh_ss(d));
}

struct Q8W {  // 34-byte blocks: fp16 d, 32 x int8
  static constexpr int kStep = 32, kVecs = 2;
  static constexpr bool kBlocked = true;
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    const uint8_t* block = row + kk / 32 * 34;
    const __m512 d = BlockScale(block);
    // Two 16-byte loads folded into vpmovsxbd (no cross-lane extract on the shuffle port).
    const __m512i lo =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
    const __m512i hi =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18)));
    out[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d);
    out[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d);
  }
  static void LoadMasked(const uint8_t*, int64_t, __mmask16, __m512*) {}
};

struct Q4W {  // 18-byte blocks: fp16 d, 16 bytes; element j low nibble of byte j, j+16 high
  static constexpr int kStep = 32, kVecs = 2;
  static constexpr bool kBlocked = true;
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    const uint8_t* block = row + kk / 32 * 18;
    const __m512 d = BlockScale(block);
    const __m512i bytes =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
    const __m512i eight = _mm512_set1_epi32(8);
    const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(bytes, _mm512_set1_epi32(15)), eight);
    const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(bytes, 4), eight);
    out[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d);
    out[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d);
  }
  static void LoadMasked(const uint8_t*, int64_t, __mmask16, __m512*) {}
};

// Fixed-order horizontal sum: halves added pairwise, 16 -> 8 -> 4 -> 2 -> 1. (Through memory:
// g++ 12 warns falsely about _mm512_extractf64x4_pd's undefined operand under -Werror.)
float HorizontalSum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  for (int width = 8; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
  }
  return t[0];
}

// One R x C register tile: rows row0.., weight rows col0...
template <class W, int R, int C>
void Tile(const MatmulArgs& a, const MatmulPlan& plan, int64_t row0, int64_t col0) {
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = a.x + (row0 + r) * a.x_stride;
  const uint8_t* w[C];
  for (int c = 0; c < C; ++c) {
    w[c] = static_cast<const uint8_t*>(a.w) + (col0 + c) * plan.w_row_bytes;
  }
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + W::kStep <= a.k; kk += W::kStep) {
    __m512 wv[C][W::kVecs];
    for (int c = 0; c < C; ++c) W::Load(w[c], kk, wv[c]);
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < W::kVecs; ++v) {
        const __m512 xv = _mm512_loadu_ps(x[r] + kk + v * kLanes);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c][v], acc[r][c]);
      }
    }
  }
  if constexpr (!W::kBlocked) {
    if (kk < a.k) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (a.k - kk)) - 1u);
      __m512 wv[C][1];
      for (int c = 0; c < C; ++c) W::LoadMasked(w[c], kk, mask, wv[c]);
      for (int r = 0; r < R; ++r) {
        const __m512 xv = _mm512_maskz_loadu_ps(mask, x[r] + kk);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c][0], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float* y = a.y + (row0 + r) * a.y_stride + col0;
    for (int c = 0; c < C; ++c) {
      float s = HorizontalSum(acc[r][c]);
      if (a.bias != nullptr) s += a.bias[col0 + c];
      y[c] = s;
    }
  }
}

template <class W, int C>
void RowRange(const MatmulArgs& a, const MatmulPlan& plan, int64_t row_begin, int64_t row_end,
              int64_t col0) {
  int64_t r = row_begin;
  for (; r + kMaxRows <= row_end; r += kMaxRows) Tile<W, kMaxRows, C>(a, plan, r, col0);
  switch (row_end - r) {
    case 3:
      Tile<W, 3, C>(a, plan, r, col0);
      break;
    case 2:
      Tile<W, 2, C>(a, plan, r, col0);
      break;
    case 1:
      Tile<W, 1, C>(a, plan, r, col0);
      break;
    default:
      break;
  }
}

template <class W>
void Columns(const MatmulArgs& a, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  for (int64_t row_begin = 0; row_begin < a.m; row_begin += plan.row_block) {
    const int64_t row_end = a.m - row_begin < plan.row_block ? a.m : row_begin + plan.row_block;
    int64_t col = n_begin;
    if (row_end - row_begin < kMaxRows) {  // decode-like: more weight rows in flight instead
      for (; col + kColsFewRows <= n_end; col += kColsFewRows) {
        RowRange<W, kColsFewRows>(a, plan, row_begin, row_end, col);
      }
    }
    for (; col + kCols <= n_end; col += kCols) RowRange<W, kCols>(a, plan, row_begin, row_end, col);
    for (; col < n_end; ++col) RowRange<W, 1>(a, plan, row_begin, row_end, col);
  }
}

}  // namespace

void MatmulColumnsAvx512(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                         int64_t n_end) {
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
    case DType::kQ8_0:
      Columns<Q8W>(args, plan, n_begin, n_end);
      break;
    case DType::kQ4_0:
      Columns<Q4W>(args, plan, n_begin, n_end);
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
