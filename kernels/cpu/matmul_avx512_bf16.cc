// The AVX-512 path's bf16 weights with AVX512_BF16: every x row is rounded to bf16 (vcvtne2ps2bf16,
// round to nearest even) and each step of 32 elements is one vdpbf16ps, which adds the two exact
// products of each lane's pair of bf16 values into that lane's fp32 accumulator: twice the
// multiply-adds per instruction of widening the weights to fp32 (matmul_avx512.cc's BF16W).
// Selected by Matmul() when CpuAvx512Bf16Enabled(); the decode tiles and the batched panels are
// matmul_avx512_tiles.inc's, so every output element sees the same sequence of steps whatever the
// batch (the determinism contract in matmul.h).

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

}  // namespace

void MatmulColumnsAvx512Bf16(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                             int64_t n_end) {
  if (args.w_dtype == DType::kBF16) {
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
