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

#include "kernels/cpu/matmul_avx512_tiles.inc"

// Weight converters: Load() gives the kVecs fp32 vectors of the kStep elements at kk, and LoadX()
// the x vectors they multiply, in the same element order; the Masked forms read only the first
// `rest` (< kStep) elements and give zeros for the others.
struct F32W : Fp32Dot {
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
struct F16W : Fp32Dot {
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
struct BF16W : Fp32Dot {
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
#include "kernels/cpu/matmul_packed_float.inc"

// Packed f32 (packed_weights.h): one element per row per line, x copied as it is.
struct PackedF32 {
  static constexpr int64_t kStepElems = 1;
  using W = __m512;
  static W LoadLine(const uint8_t* p) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p)); }
  static W Broadcast(uint32_t bits) {
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(bits)));
  }
  static __m512 Step(__m512 acc, W w, W x) { return _mm512_fmadd_ps(w, x, acc); }
  static void ConvertX(const float* src, int64_t k, uint32_t* dst) {
    std::memcpy(dst, src, static_cast<size_t>(k) * sizeof(float));
    const int64_t line_end = (k + 15) / 16 * 16;
    std::memset(dst + k, 0, static_cast<size_t>(line_end - k) * sizeof(float));
  }
  static bool Special(const MatmulArgs&, const MatmulPlan&, const uint32_t*, int64_t, int64_t,
                      float*, int64_t, int64_t) {
    return false;
  }
};

}  // namespace

void MatmulColumnsAvx512(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                         int64_t n_end) {
  if (args.w_packed && args.w_dtype == DType::kF32) {
    PackedFloatColumns<PackedF32>(args, plan, n_begin, n_end);
    return;
  }
  if (Int8Matmul(args, plan, n_begin, n_end)) return;
  switch (args.w_dtype) {
    case DType::kF32:
      Columns<F32W, FloatPanel>(args, plan, n_begin, n_end);
      break;
    case DType::kF16:
      Columns<F16W, FloatPanel>(args, plan, n_begin, n_end);
      break;
    case DType::kBF16:
      Columns<BF16W, FloatPanel>(args, plan, n_begin, n_end);
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
