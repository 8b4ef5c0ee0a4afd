// The AVX-512 path's bf16 weights with AVX512_BF16: every x row is rounded to bf16 (vcvtne2ps2bf16,
// round to nearest even) and each step of 32 elements is one vdpbf16ps, which adds the two exact
// products of each lane's pair of bf16 values into that lane's fp32 accumulator: twice the
// multiply-adds per instruction of widening the weights to fp32 (matmul_avx512.cc's BF16W).
// Selected by Matmul() when CpuAvx512Bf16Enabled(); the decode tiles and the batched panels are
// matmul_avx512_tiles.inc's, so every output element sees the same sequence of steps whatever the
// batch (the determinism contract in matmul.h). Packed bf16 weights take matmul_packed_float.inc's
// tiles, or the AMX tiles below where the CPU has AMX (MatmulPlan::amx).

#include "kernels/cpu/matmul_impl.h"

#if defined(__AVX512BF16__)

#include <cstring>
#include <new>
#include <type_traits>

#include "kernels/cpu/avx512_intrinsics.h"

namespace kvserve::cpu::internal {
namespace {

#include "kernels/cpu/matmul_avx512_tiles.inc"

// 32 bf16 weights per step, one 64-byte load, multiplied as they lie; x rounded to bf16 in the
// same element order (vcvtne2ps2bf16 puts its second operand in the low half).
struct BF16DotW {
  static constexpr int kStep = 32, kVecs = 1, kElemBytes = 2;
  using In = __m512bh;
  static void Load(const uint8_t* row, int64_t kk, In* out) {
    out[0] = reinterpret_cast<In>(_mm512_loadu_si512(row + 2 * kk));
  }
  static void LoadMasked(const uint8_t* row, int64_t kk, int rest, In* out) {
    out[0] = reinterpret_cast<In>(
        _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << rest) - 1), row + 2 * kk));
  }
  static void LoadX(const float* x, In* out) {
    out[0] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
  }
  static void LoadXMasked(const float* x, int rest, In* out) {
    out[0] = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(Mask16(rest > 16 ? rest - 16 : 0), x + 16),
                                 _mm512_maskz_loadu_ps(Mask16(rest < 16 ? rest : 16), x));
  }
  static __m512 Dot(__m512 acc, In x, In w) { return _mm512_dpbf16_ps(acc, x, w); }
};

// matmul_panel.inc's panel format for BF16DotW: x rows held as bf16 (rounded once, by LoadX), the
// weights read in place or copied with their k tail zero-filled to a whole step.
template <class W, bool kInPlaceFormat>
struct Bf16DotPanel {
  static_assert(W::kStep == 32 && W::kVecs == 1, "one vector of 32 bf16 per step");
  using Elem = uint16_t;  // bf16 bits
  using In = typename W::In;
  static constexpr int kStep = W::kStep;
  static constexpr int kPad = W::kStep;
  static constexpr int kVecs = 1;
  static constexpr bool kInPlace = kInPlaceFormat;
  static In Load(const uint16_t* p) { return reinterpret_cast<In>(_mm512_load_si512(p)); }
  static In LoadW(const uint8_t* row, int64_t kk, int /*v*/) {
    In out[1];
    W::Load(row, kk, out);
    return out[0];
  }
  static __m512 Dot(__m512 acc, In x, In w) { return W::Dot(acc, x, w); }
  static void ConvertWeights(const uint8_t* row, int64_t k, uint16_t* dst) {
    const int64_t padded = (k + kPad - 1) / kPad * kPad;
    std::memcpy(dst, row, static_cast<size_t>(k) * sizeof(uint16_t));
    std::memset(dst + k, 0, static_cast<size_t>(padded - k) * sizeof(uint16_t));
  }
  static void ConvertX(const float* src, int64_t k, uint16_t* dst) {
    In v[1];
    int64_t i = 0;
    for (; i + kPad <= k; i += kPad) {
      W::LoadX(src + i, v);
      _mm512_store_si512(dst + i, reinterpret_cast<__m512i>(v[0]));
    }
    if (i < k) {
      W::LoadXMasked(src + i, static_cast<int>(k - i), v);
      _mm512_store_si512(dst + i, reinterpret_cast<__m512i>(v[0]));
    }
  }
};

#include "kernels/cpu/matmul_packed_float.inc"

// Packed bf16 (packed_weights.h): a pair per row per line; x rounded to bf16 pairs by BF16DotW's
// rounding; blocks of rows go to the AMX tiles where MatmulPlan::amx says so.
struct PackedBf16 {
  static constexpr int64_t kStepElems = 2;
  using W = __m512bh;
  static W LoadLine(const uint8_t* p) { return reinterpret_cast<W>(_mm512_loadu_si512(p)); }
  static W Broadcast(uint32_t bits) {
    return reinterpret_cast<W>(_mm512_set1_epi32(static_cast<int>(bits)));
  }
  static __m512 Step(__m512 acc, W w, W x) { return _mm512_dpbf16_ps(acc, w, x); }
  static void ConvertX(const float* src, int64_t k, uint32_t* dst) {
    Bf16DotPanel<BF16DotW, true>::ConvertX(src, k, reinterpret_cast<uint16_t*>(dst));
  }
  static bool Special(const MatmulArgs& a, const MatmulPlan& plan, const uint32_t* xbuf,
                      int64_t x_stride, int64_t rows, float* y, int64_t n_begin, int64_t n_end);
};

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// ---- Packed bf16 weights on AMX (MatmulPlan::amx). ----
//
// TDPBF16PS C += A B multiplies tiles: A holds up to 16 x rows of 16 bf16 pairs (64 bytes each),
// B 16 rows of 64 bytes where row p holds pair p of 16 outputs, and C (fp32) gets, per x row and
// output, the 32 products of the step. Lines p0 .. p0 + 15 of a packed group are such a B tile as
// they lie (64 bytes apart), and the x buffer's rows at pair p0 the A tile. The C tiles stay in
// their registers for the whole k, so each output is one chain of TDPBF16PS over k in order,
// whatever the batch, tile shape or thread: results are bit-identical across batches (matmul.h).
// One TDPBF16PS does 16 x 16 x 32 multiply-adds, 256 vdpbf16ps' worth, in ~18 cycles on the
// Xeon measured, and costs the same for one x row as for sixteen, so decode is bound by the
// weights' stream and a batch reads each weight once per step (docs/benchmarks.md, "AMX and
// packed f32").
constexpr int64_t kAmxStepPairs = 16;                                // pairs per TDPBF16PS
constexpr int64_t kAmxStepBytes = kAmxStepPairs * kPackedLineBytes;  // one B tile: 1 KiB
constexpr int kAmxTileRows = 16;

// The tile configuration (palette 1): per tile, rows and bytes per row.
struct alignas(64) AmxConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles for a block of `rows` x rows. Up to 16 rows: tile 0 is A, tiles 1-3 three groups' B and
// tiles 4-6 their C. 17 to 32 rows: tiles 0 and 1 are A (rows 0-15 and the rest), 2 and 3 two
// groups' B, 4 and 5 the first A's C with them, 6 and 7 the second's.
void AmxConfigure(int rows) {
  AmxConfig c{};
  c.palette = 1;
  const auto set = [&](int tile, int tile_rows) {
    c.rows[tile] = static_cast<uint8_t>(tile_rows);
    c.colsb[tile] = static_cast<uint16_t>(kPackedLineBytes);
  };
  if (rows <= kAmxTileRows) {
    set(0, rows);
    for (int t = 1; t <= 3; ++t) set(t, kAmxTileRows);
    for (int t = 4; t <= 6; ++t) set(t, rows);
  } else {
    set(0, kAmxTileRows);
    set(1, rows - kAmxTileRows);
    set(2, kAmxTileRows);
    set(3, kAmxTileRows);
    set(4, kAmxTileRows);
    set(5, kAmxTileRows);
    set(6, rows - kAmxTileRows);
    set(7, rows - kAmxTileRows);
  }
  _tile_loadconfig(&c);
}

// Where a unit of groups works: the block's x rows (x at the step's pair, stride in bytes), the
// first group's first line, its first output (col, relative to y and bias) and the piece's end.
struct AmxUnitAt {
  const uint32_t* x;
  int64_t x_stride_bytes;
  const uint8_t* w;
  int64_t group_bytes;
  int64_t pairs;
  float* y;  // the block's first row
  int64_t y_stride;
  const float* bias;  // or null
  int64_t col, col_end;
  int rows;
  uint8_t* tail;  // kAmxStepBytes per group, for the k tail
  float* c_out;   // 16 x 16 floats
};

// The last step's B tiles when k / 2 is not a multiple of 16: the group's remaining lines, then
// zeros (the A rows are zero there too: ConvertX fills the x rows' last step with zeros; lines
// past the group are the next group's, or past the buffer).
const uint8_t* AmxTail(const AmxUnitAt& u, int g, int64_t p0) {
  uint8_t* const t = u.tail + g * kAmxStepBytes;
  const int64_t bytes = (u.pairs - p0) * kPackedLineBytes;
  std::memcpy(t, u.w + g * u.group_bytes + p0 * kPackedLineBytes, static_cast<size_t>(bytes));
  std::memset(t + bytes, 0, static_cast<size_t>(kAmxStepBytes - bytes));
  return t;
}

// C tile `rows` x 16 (in c_out, 16 floats a row) into y at output `col` (+ bias), the outputs that
// exist only.
void AmxStoreC(const AmxUnitAt& u, int rows, int64_t col, float* y) {
  const int64_t left = u.col_end - col;
  const __mmask16 mask =
      left >= 16 ? static_cast<__mmask16>(0xffff) : Mask16(static_cast<int>(left));
  const __m512 bias =
      u.bias != nullptr ? _mm512_maskz_loadu_ps(mask, u.bias + col) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    __m512 v = _mm512_load_ps(u.c_out + 16 * r);
    if (u.bias != nullptr) v = _mm512_add_ps(v, bias);
    _mm512_mask_storeu_ps(y + r * u.y_stride + col, mask, v);
  }
}

// Up to 16 x rows by G (<= 3) groups.
template <int G>
void AmxUnit16(const AmxUnitAt& u) {
  _tile_zero(4);
  if constexpr (G > 1) _tile_zero(5);
  if constexpr (G > 2) _tile_zero(6);
  const int64_t full = u.pairs / kAmxStepPairs * kAmxStepPairs;
  const uint8_t* const w = u.w;
  const int64_t gb = u.group_bytes;
  for (int64_t p = 0; p < full; p += kAmxStepPairs) {
    _tile_loadd(0, u.x + p, u.x_stride_bytes);
    const uint8_t* const at = w + p * kPackedLineBytes;
    _tile_loadd(1, at, kPackedLineBytes);
    if constexpr (G > 1) _tile_loadd(2, at + gb, kPackedLineBytes);
    if constexpr (G > 2) _tile_loadd(3, at + 2 * gb, kPackedLineBytes);
    _tile_dpbf16ps(4, 0, 1);
    if constexpr (G > 1) _tile_dpbf16ps(5, 0, 2);
    if constexpr (G > 2) _tile_dpbf16ps(6, 0, 3);
  }
  if (full < u.pairs) {
    _tile_loadd(0, u.x + full, u.x_stride_bytes);
    _tile_loadd(1, AmxTail(u, 0, full), kPackedLineBytes);
    if constexpr (G > 1) _tile_loadd(2, AmxTail(u, 1, full), kPackedLineBytes);
    if constexpr (G > 2) _tile_loadd(3, AmxTail(u, 2, full), kPackedLineBytes);
    _tile_dpbf16ps(4, 0, 1);
    if constexpr (G > 1) _tile_dpbf16ps(5, 0, 2);
    if constexpr (G > 2) _tile_dpbf16ps(6, 0, 3);
  }
  _tile_stored(4, u.c_out, 64);
  AmxStoreC(u, u.rows, u.col, u.y);
  if constexpr (G > 1) {
    _tile_stored(5, u.c_out, 64);
    AmxStoreC(u, u.rows, u.col + 16, u.y);
  }
  if constexpr (G > 2) {
    _tile_stored(6, u.c_out, 64);
    AmxStoreC(u, u.rows, u.col + 32, u.y);
  }
}

// 17 to 32 x rows by G (<= 2) groups.
template <int G>
void AmxUnit32(const AmxUnitAt& u) {
  _tile_zero(4);
  _tile_zero(6);
  if constexpr (G > 1) {
    _tile_zero(5);
    _tile_zero(7);
  }
  const int64_t full = u.pairs / kAmxStepPairs * kAmxStepPairs;
  const uint32_t* const x1 = u.x + kAmxTileRows * (u.x_stride_bytes / 4);
  const int64_t gb = u.group_bytes;
  for (int64_t p = 0; p < full; p += kAmxStepPairs) {
    const uint8_t* const at = u.w + p * kPackedLineBytes;
    _tile_loadd(2, at, kPackedLineBytes);
    _tile_loadd(0, u.x + p, u.x_stride_bytes);
    _tile_dpbf16ps(4, 0, 2);
    _tile_loadd(1, x1 + p, u.x_stride_bytes);
    _tile_dpbf16ps(6, 1, 2);
    if constexpr (G > 1) {
      _tile_loadd(3, at + gb, kPackedLineBytes);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(7, 1, 3);
    }
  }
  if (full < u.pairs) {
    _tile_loadd(2, AmxTail(u, 0, full), kPackedLineBytes);
    _tile_loadd(0, u.x + full, u.x_stride_bytes);
    _tile_dpbf16ps(4, 0, 2);
    _tile_loadd(1, x1 + full, u.x_stride_bytes);
    _tile_dpbf16ps(6, 1, 2);
    if constexpr (G > 1) {
      _tile_loadd(3, AmxTail(u, 1, full), kPackedLineBytes);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(7, 1, 3);
    }
  }
  float* const y1 = u.y + kAmxTileRows * u.y_stride;
  const int rows1 = u.rows - kAmxTileRows;
  _tile_stored(4, u.c_out, 64);
  AmxStoreC(u, kAmxTileRows, u.col, u.y);
  _tile_stored(6, u.c_out, 64);
  AmxStoreC(u, rows1, u.col, y1);
  if constexpr (G > 1) {
    _tile_stored(5, u.c_out, 64);
    AmxStoreC(u, kAmxTileRows, u.col + 16, u.y);
    _tile_stored(7, u.c_out, 64);
    AmxStoreC(u, rows1, u.col + 16, y1);
  }
}

// Columns [n_begin, n_end) (whole groups but the call's last) for `rows` x rows converted in
// xbuf: blocks of at most 32 rows, as equal as they can be (one tile configuration for all but
// the last); per block, units of groups across the piece, each over the whole k.
void AmxBf16Columns(const MatmulArgs& a, const uint32_t* xbuf, int64_t x_stride, int64_t rows,
                    float* y, int64_t n_begin, int64_t n_end) {
  // The units' scratch, one C tile's store and the k tail's B tiles, in the thread's panel
  // accumulator buffer (unused on the packed paths; on the heap, PanelScratch says why).
  constexpr int64_t kCFloats = kAmxTileRows * 16;
  float* const scratch = ThreadPanelScratch().Acc(kCFloats + 3 * kAmxStepBytes / 4);
  AmxUnitAt u{};
  u.x_stride_bytes = x_stride * 4;
  u.group_bytes = a.k / 2 * kPackedLineBytes;
  u.pairs = a.k / 2;
  u.y_stride = a.y_stride;
  u.bias = a.bias;
  u.col_end = n_end;
  u.c_out = scratch;
  u.tail = reinterpret_cast<uint8_t*>(scratch + kCFloats);
  const int64_t max_block = 2 * kAmxTileRows;
  const int64_t blocks = (rows + max_block - 1) / max_block;
  const int64_t block_rows = (rows + blocks - 1) / blocks;
  int configured = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    u.rows = static_cast<int>(rows - r0 < block_rows ? rows - r0 : block_rows);
    if (u.rows != configured) {
      AmxConfigure(u.rows);
      configured = u.rows;
    }
    u.x = xbuf + r0 * x_stride;
    u.y = y + r0 * a.y_stride;
    const int groups_per_unit = u.rows <= kAmxTileRows ? 3 : 2;
    for (u.col = n_begin; u.col < n_end; u.col += 16 * groups_per_unit) {
      u.w = static_cast<const uint8_t*>(a.w) + u.col / 16 * u.group_bytes;
      const int64_t groups = (n_end - u.col + 15) / 16;
      const int g = static_cast<int>(groups < groups_per_unit ? groups : groups_per_unit);
      if (u.rows <= kAmxTileRows) {
        if (g == 3) AmxUnit16<3>(u);
        if (g == 2) AmxUnit16<2>(u);
        if (g == 1) AmxUnit16<1>(u);
      } else {
        if (g == 2) AmxUnit32<2>(u);
        if (g == 1) AmxUnit32<1>(u);
      }
    }
  }
  _tile_release();  // the tile state back to its initial (unsaved) form until the next call
}
#endif  // AMX

bool PackedBf16::Special(const MatmulArgs& a, const MatmulPlan& plan, const uint32_t* xbuf,
                         int64_t x_stride, int64_t rows, float* y, int64_t n_begin, int64_t n_end) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (plan.amx) {
    AmxBf16Columns(a, xbuf, x_stride, rows, y, n_begin, n_end);
    return true;
  }
#else
  (void)a, (void)plan, (void)xbuf, (void)x_stride, (void)rows, (void)y, (void)n_begin, (void)n_end;
#endif
  return false;
}

}  // namespace

void MatmulColumnsAvx512Bf16(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                             int64_t n_end) {
  if (args.w_dtype == DType::kBF16 && args.w_packed) {
    PackedFloatColumns<PackedBf16>(args, plan, n_begin, n_end);
  } else if (args.w_dtype == DType::kBF16) {
    Columns<BF16DotW, Bf16DotPanel>(args, plan, n_begin, n_end);
  } else {
    MatmulColumnsAvx512(args, plan, n_begin, n_end);
  }
}

}  // namespace kvserve::cpu::internal

#else  // not built with the target flags (non-x86): never selected, forwards to scalar

namespace kvserve::cpu::internal {

void MatmulColumnsAvx512Bf16(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                             int64_t n_end) {
  MatmulColumnsScalar(args, plan, n_begin, n_end);
}

}  // namespace kvserve::cpu::internal

#endif
