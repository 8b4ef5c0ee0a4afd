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
constexpr int kMaxRows = 4;  // x rows per register tile
// Weight rows per tile when fewer than kMaxRows x rows remain (decode): more independent FMA
// chains. Tile shapes never change any element's reduction order.
constexpr int kColsFewRows = 8;
constexpr int kCols = 4;  // weight rows per register tile
// Decode tiles stride over rows that share a 4 KiB page (see Columns), at most this many apart.
constexpr int64_t kPageBytes = 4096;
constexpr int64_t kMaxPageStep = 4;

// Software prefetch distance along each weight row in the register tiles: the hardware
// prefetchers alone left batch-1 decode at 0.67-0.77 of the triad for 16-bit weights; 512 bytes
// ahead measured best of 256, 512 and 1024 (decode_bench, 1 and 2 threads, both ISA paths).
constexpr int64_t kPrefetchBytes = 512;

// Weight converters: Load() gives the kVecs fp32 vectors of the kStep elements at kk.
struct F32W {
  static constexpr int kStep = 16, kVecs = 1, kElemBytes = 4;
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    out[0] = _mm512_loadu_ps(reinterpret_cast<const float*>(row) + kk);
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, __mmask16 m, __m512* out) {
    out[0] = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + kk);
  }
};

struct F16W {
  static constexpr int kStep = 16, kVecs = 1, kElemBytes = 2;
  static void Load(const uint8_t* row, int64_t kk, __m512* out) {
    out[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * kk)));
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, __mmask16 m, __m512* out) {
    out[0] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * kk));
  }
};

struct BF16W {
  static constexpr int kStep = 16, kVecs = 1, kElemBytes = 2;
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

#include "kernels/cpu/matmul_int8.inc"

// Fixed-order horizontal sum: halves added pairwise, 16 -> 8 -> 4 -> 2 -> 1, i.e. lane i + lane
// i + 8, then i + 4, i + 2, i + 1 (the order matmul_impl.h documents), with in-register shuffles.
float HorizontalSum(__m512 v) {
  const __m512 s8 = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xee));  // lanes 0..7
  const __m256 h8 = _mm512_castps512_ps256(s8);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 0x55));
  return _mm_cvtss_f32(s1);
}

// One R x C register tile: rows row0.., weight rows col0...
template <class W, int R, int C>
// Weight rows col0, col0 + col_step, ..., col0 + (C - 1) * col_step.
void Tile(const MatmulArgs& a, const MatmulPlan& plan, int64_t row0, int64_t col0,
          int64_t col_step) {
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
    __m512 wv[C][W::kVecs];
    for (int c = 0; c < C; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(w[c]) + kk * W::kElemBytes + kPrefetchBytes,
                   _MM_HINT_T0);
      W::Load(w[c], kk, wv[c]);
    }
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < W::kVecs; ++v) {
        const __m512 xv = _mm512_loadu_ps(x[r] + kk + v * kLanes);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c][v], acc[r][c]);
      }
    }
  }
  if (kk < a.k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (a.k - kk)) - 1u);
    __m512 wv[C][1];
    for (int c = 0; c < C; ++c) W::LoadMasked(w[c], kk, mask, wv[c]);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x[r] + kk);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c][0], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* y = a.y + (row0 + r) * a.y_stride + col0;
    for (int c = 0; c < C; ++c) {
      float s = HorizontalSum(acc[r][c]);
      if (a.bias != nullptr) s += a.bias[col0 + c * col_step];
      y[c * col_step] = s;
    }
  }
}

template <class W, int C>
void RowRange(const MatmulArgs& a, const MatmulPlan& plan, int64_t row_begin, int64_t row_end,
              int64_t col0, int64_t col_step = 1) {
  int64_t r = row_begin;
  for (; r + kMaxRows <= row_end; r += kMaxRows) {
    Tile<W, kMaxRows, C>(a, plan, r, col0, col_step);
  }
  switch (row_end - r) {
    case 3:
      Tile<W, 3, C>(a, plan, r, col0, col_step);
      break;
    case 2:
      Tile<W, 2, C>(a, plan, r, col0, col_step);
      break;
    case 1:
      Tile<W, 1, C>(a, plan, r, col0, col_step);
      break;
    default:
      break;
  }
}

// ---- Batched path (m >= kMaxRows): prefill and batched decode. ----
//
// Each panel of kPanelCols weight rows (adjacent in memory: one sequential stream, which the
// hardware prefetchers follow at full speed) is converted once to f32 into a per-thread buffer
// that stays in L2, then reused by every x row of the row block: each weight byte is read from
// memory and converted once per kRowBlock rows, not once per row tile. The k dimension is walked
// in kKBlock slices (a 16 KiB panel slice stays in L1 across the row tiles); partial sums carry
// over in the per-lane accumulators (stored between slices), so each output element still sees
// exactly the decode path's FMA sequence and horizontal sum.
constexpr int kPanelCols = 8;      // weight rows per panel (two kCols tiles)
constexpr int64_t kKBlock = 1024;  // k elements per slice
constexpr int64_t kRowBlock = 64;  // x rows per pass over the weights

// Per-thread scratch: the converted panel (grown on demand) and the accumulators. Both live on
// the heap: a 32 KiB array inside a thread_local would enlarge the process's static TLS block,
// and pthread_create then fails for libraries that start threads with small stacks (civetweb,
// behind the Prometheus exposer).
struct BatchScratch {
  float* panel = nullptr;  // [kPanelCols][panel_stride], 64-byte aligned
  int64_t panel_floats = 0;
  float* acc = static_cast<float*>(::operator new[](
      kRowBlock * kPanelCols * kLanes * sizeof(float), std::align_val_t{64}));  // [row][col][lane]

  float* Panel(int64_t floats) {
    if (floats > panel_floats) {
      ::operator delete[](panel, std::align_val_t{64});
      panel = static_cast<float*>(::operator new[](floats * sizeof(float), std::align_val_t{64}));
      panel_floats = floats;
    }
    return panel;
  }
  ~BatchScratch() {
    ::operator delete[](panel, std::align_val_t{64});
    ::operator delete[](acc, std::align_val_t{64});
  }
};

// Converts weight rows col0 .. col0 + cols - 1 (all k) into panel rows of `stride` floats; the
// k tail is padded with zeros, as the decode path's masked load.
template <class W>
void ConvertPanel(const MatmulArgs& a, const MatmulPlan& plan, int64_t col0, int cols,
                  int64_t stride, float* panel) {
  for (int c = 0; c < cols; ++c) {
    const uint8_t* row = static_cast<const uint8_t*>(a.w) + (col0 + c) * plan.w_row_bytes;
    float* dst = panel + c * stride;
    int64_t i = 0;
    __m512 v[W::kVecs];
    for (; i + W::kStep <= a.k; i += W::kStep) {
      W::Load(row, i, v);
      for (int j = 0; j < W::kVecs; ++j) _mm512_store_ps(dst + i + j * kLanes, v[j]);
    }
    if (i < a.k) {
      W::LoadMasked(row, i, static_cast<__mmask16>((1u << (a.k - i)) - 1u), v);
      _mm512_store_ps(dst + i, v[0]);
    }
  }
}

// One R x C tile over the k slice [k0, k0 + kl): rows row0.. (accumulator row row0 - row_base),
// panel columns pc0.. (weight rows col0 + pc0..), panel rows `stride` floats apart.
template <int R, int C>
void PanelTile(const MatmulArgs& a, int64_t row0, int64_t row_base, int64_t col0, int pc0,
               const float* panel, int64_t stride, int64_t k0, int64_t kl, float* acc_store) {
  const bool first = k0 == 0;
  const bool last = k0 + kl == a.k;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      const float* slot = acc_store + ((row0 - row_base + r) * kPanelCols + pc0 + c) * kLanes;
      acc[r][c] = first ? _mm512_setzero_ps() : _mm512_load_ps(slot);
    }
  }
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = a.x + (row0 + r) * a.x_stride + k0;
  const float* w[C];
  for (int c = 0; c < C; ++c) w[c] = panel + (pc0 + c) * stride + k0;
  int64_t i = 0;
  for (; i + kLanes <= kl; i += kLanes) {
    __m512 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_load_ps(w[c] + i);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x[r] + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (i < kl) {  // k tail (last slice only): zero-padded panel, masked x
    const __mmask16 mask = static_cast<__mmask16>((1u << (kl - i)) - 1u);
    __m512 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_load_ps(w[c] + i);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x[r] + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (last) {
      float* y = a.y + (row0 + r) * a.y_stride + col0 + pc0;
      for (int c = 0; c < C; ++c) {
        float s = HorizontalSum(acc[r][c]);
        if (a.bias != nullptr) s += a.bias[col0 + pc0 + c];
        y[c] = s;
      }
    } else {
      for (int c = 0; c < C; ++c) {
        _mm512_store_ps(acc_store + ((row0 - row_base + r) * kPanelCols + pc0 + c) * kLanes,
                        acc[r][c]);
      }
    }
  }
}

template <int C>
void PanelRows(const MatmulArgs& a, int64_t row0, int rows, int64_t row_base, int64_t col0,
               int pc0, const float* panel, int64_t stride, int64_t k0, int64_t kl,
               float* acc_store) {
  switch (rows) {
    case 4:
      PanelTile<4, C>(a, row0, row_base, col0, pc0, panel, stride, k0, kl, acc_store);
      break;
    case 3:
      PanelTile<3, C>(a, row0, row_base, col0, pc0, panel, stride, k0, kl, acc_store);
      break;
    case 2:
      PanelTile<2, C>(a, row0, row_base, col0, pc0, panel, stride, k0, kl, acc_store);
      break;
    default:
      PanelTile<1, C>(a, row0, row_base, col0, pc0, panel, stride, k0, kl, acc_store);
      break;
  }
}

template <class W>
void BatchedColumns(const MatmulArgs& a, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  thread_local BatchScratch scratch;
  const int64_t stride = (a.k + kLanes - 1) / kLanes * kLanes;
  float* panel = scratch.Panel(kPanelCols * stride);
  for (int64_t row_base = 0; row_base < a.m; row_base += kRowBlock) {
    const int64_t row_end = a.m - row_base < kRowBlock ? a.m : row_base + kRowBlock;
    for (int64_t col0 = n_begin; col0 < n_end; col0 += kPanelCols) {
      const int cols = static_cast<int>(n_end - col0 < kPanelCols ? n_end - col0 : kPanelCols);
      ConvertPanel<W>(a, plan, col0, cols, stride, panel);
      for (int64_t k0 = 0; k0 < a.k; k0 += kKBlock) {
        const int64_t kl = a.k - k0 < kKBlock ? a.k - k0 : kKBlock;
        for (int64_t r = row_base; r < row_end; r += kMaxRows) {
          const int rows = static_cast<int>(row_end - r < kMaxRows ? row_end - r : kMaxRows);
          int pc = 0;
          for (; pc + kCols <= cols; pc += kCols) {
            PanelRows<kCols>(a, r, rows, row_base, col0, pc, panel, stride, k0, kl, scratch.acc);
          }
          for (; pc < cols; ++pc) {
            PanelRows<1>(a, r, rows, row_base, col0, pc, panel, stride, k0, kl, scratch.acc);
          }
        }
      }
    }
  }
}

template <class W>
void Columns(const MatmulArgs& a, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  if (a.m >= kMaxRows) {
    BatchedColumns<W>(a, plan, n_begin, n_end);
    return;
  }
  // Decode-like (fewer rows than a register tile): weights straight from memory, converted in
  // registers, more weight rows in flight. Rows shorter than a 4 KiB page share pages; a tile of
  // adjacent rows would walk each page as interleaved streams (row j at offset 0, row j + 1 at
  // row_bytes, ...), which the hardware prefetchers follow poorly. So such rows are tiled with a
  // stride of `step` rows: each tile reads one row per page, and the next tile (rows + 1) the
  // continuation of the same pages — every page is walked as one ascending stream.
  const int64_t rows_per_page = kPageBytes / plan.w_row_bytes;
  const int64_t step = rows_per_page < 1 ? 1 : (rows_per_page > kMaxPageStep ? kMaxPageStep
                                                                              : rows_per_page);
  int64_t col = n_begin;
  if (step > 1) {
    for (; col + kColsFewRows * step <= n_end; col += kColsFewRows * step) {
      for (int64_t j = 0; j < step; ++j) {
        RowRange<W, kColsFewRows>(a, plan, 0, a.m, col + j, step);
      }
    }
  }
  for (; col + kColsFewRows <= n_end; col += kColsFewRows) {
    RowRange<W, kColsFewRows>(a, plan, 0, a.m, col);
  }
  for (; col + kCols <= n_end; col += kCols) RowRange<W, kCols>(a, plan, 0, a.m, col);
  for (; col < n_end; ++col) RowRange<W, 1>(a, plan, 0, a.m, col);
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
