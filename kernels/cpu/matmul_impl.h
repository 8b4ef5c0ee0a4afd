#ifndef KVSERVE_KERNELS_CPU_MATMUL_IMPL_H_
#define KVSERVE_KERNELS_CPU_MATMUL_IMPL_H_

// Internal to kernels/cpu: the per-ISA matmul bodies behind Matmul().
//
// Each computes y[:, n_begin:n_end) for all m rows. Sizes come precomputed in MatmulPlan: the
// ISA files are compiled with their own -m flags and must not call (and so emit) any inline
// function or template shared with baseline code, or the linker could keep the AVX-512 copy for
// everyone. They use intrinsics and file-local helpers only.
//
// Reduction order per output element, identical for every m, row tile and column tile:
//   scalar: 8 lane sums (element e into lane e % 8), tail elements into lanes 0.., then
//           ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
//   avx2:   one 8-lane FMA accumulator over k (zero-padded tail step), fixed horizontal sum.
//   avx512: one 16-lane FMA accumulator over k (masked tail step), fixed horizontal sum.
//   avx512 with AVX512_BF16, bf16 weights (its own path, RoundsXToBf16): each x row rounded to
//           bf16 (round to nearest even), then per 32 elements one vdpbf16ps into a 16-lane
//           accumulator (lane i takes the exact products of elements 2i and 2i + 1; masked tail
//           step), fixed horizontal sum; packed bf16 weights (packed_weights.h, MatmulArgs::
//           w_packed) one fp32 lane per output instead, one vdpbf16ps per pair of elements in
//           order (no horizontal sum); with AMX (CpuAmxBf16Enabled) one TDPBF16PS per 32 elements
//           in order into each output's fp32 element of a C tile, which sums the step's 32
//           products its own way (no horizontal sum). Other paths unpack packed bf16 rows
//           (scalar order).
//   avx512, packed f32 weights (packed_weights.h): one fp32 lane per output, one FMA per element
//           in order (no horizontal sum); other paths unpack packed f32 rows (their own order).
// then + bias. Quantized weights (UsesInt8Activations) are not converted: each x row is quantized
// to int8 once per call (QuantizeActivationRow; one scale per 32 elements, per 256 for the
// K-quants), and every weight block's integer dot product sum(qw * qx) (exact in int32) is scaled
// by d_w * d_x in fp32 (K-quants: the super-block's sub-block dot products times their integer
// sub-block scales are summed in int32 first, and the mins term is added per super-block):
//   scalar: weight rows decoded to fp32, per 32 elements d_x * sum(w * float(q_x)), added to one
//           running sum in order.
//   avx2/avx512: 8 int32 lanes per block (pairs of products summed, then pairs of pairs), each
//           lane converted and FMA'd into an 8-lane accumulator with d_w * d_x; fixed horizontal
//           sum. avx512 with VNNI (its own path): q8_0/q4_0 take two blocks per 16-lane
//           vpdpbusd step (lanes 0..7 the even block, 8..15 the odd one) into a 16-lane
//           accumulator, summed lane i + lane i + 8 and then as above.
// Packed weights (MatmulArgs::w_packed, matmul_packed.inc): q4_0 / q8_0 per block the exact S,
// then acc = fma(float(S), d_w * d_x, acc) in block order, the same on every path (scalar
// included); packed K-quants take the stored K-quant tiles' arithmetic above.
// The avx2 and avx512 paths for m >= 4 (matmul_panel.inc) read the weight rows in place or from
// panels converted once into a per-thread buffer, and walk k in slices, storing the lane
// accumulators between slices: the same sequence of steps per element as m < 4, so results stay
// bit-identical.

#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_weights.h"

namespace kvserve::cpu::internal {

/// Whether `w_dtype` runs as integer dot products against int8-quantized activations.
constexpr bool UsesInt8Activations(DType w_dtype) {
  return w_dtype == DType::kQ8_0 || w_dtype == DType::kQ4_0 || w_dtype == DType::kQ4_K ||
         w_dtype == DType::kQ5_K || w_dtype == DType::kQ6_K;
}

/// Elements sharing one scale in the int8 form of the activations: 32 (one q8_0/q4_0 block), or
/// 256 for the K-quants, whose super-blocks then sum their sub-blocks' scaled integer dot products
/// in int32 and convert once per super-block.
constexpr int64_t ActivationScaleBlock(DType w_dtype) {
  return DTypeBlockElems(w_dtype) == 256 ? 256 : 32;
}

/// Elements per activation sum (MatmulPlan::xs): always 32.
constexpr int64_t kActBlock = 32;

/// Sizes the dispatcher computes once per call (in baseline code, see above).
struct MatmulPlan {
  int64_t w_row_bytes;  // DTypeRowBytes(w_dtype, k)
  // Int8 activations (UsesInt8Activations(w_dtype), else null), made once per call by
  // QuantizeActivationRow with scale blocks of ActivationScaleBlock(w_dtype) elements: row i's
  // int8 values are xq[i * xq_stride ..], scale block b's d (x ~ d * q) is xd[i * xd_stride + b]
  // and the sum of the q of elements 32 s .. 32 s + 31 is xs[i * xs_stride + s].
  const int8_t* xq = nullptr;
  const float* xd = nullptr;
  const int32_t* xs = nullptr;
  int64_t xq_stride = 0;  // bytes (k rounded up to 64)
  int64_t xd_stride = 0;  // elements
  int64_t xs_stride = 0;  // elements
  // Packed q6_k only (else null): per 16 elements s, 32 times the sums of row i's q over the
  // chunk pairs — word 0 of xo[i * xo_stride + s] sums elements 16 s + 4 t and 16 s + 4 t + 1,
  // word 1 elements 16 s + 4 t + 2 and + 3 (t < 4), each within int16 — the -32 offset of the
  // sixteen quants, taken off the pair sums of a sub-block (Q6KPackedTile).
  const int32_t* xo = nullptr;
  int64_t xo_stride = 0;  // elements
  // Packed-weight streams a decode tile reads side by side (matmul_packed.inc, PackedDecode): two
  // when the whole call runs on one thread, one when threads share it.
  int weight_streams = 1;
  // Unique to this Matmul() call (never 0): a thread that runs several pieces of one call keeps
  // the x rows it converted for the first (matmul_panel.inc) instead of converting them again.
  uint64_t call_id = 0;
  // Packed bf16 on MatmulColumnsAvx512Bf16 with CpuAmxBf16Enabled(): the AMX tiles instead of
  // vdpbf16ps (matmul_avx512_bf16.cc).
  bool amx = false;
};

/// MatmulPlan::xo of one row of `k` int8 activations (k % 16 == 0).
void Q6OffsetRow(const int8_t* q, int64_t k, int32_t* offsets);

/// Quantizes one activation row of `k` elements (k % scale_block == 0, scale_block % 32 == 0) to
/// int8 with one scale per `scale_block` elements: d = max|x| / 127, q = x / d rounded to
/// nearest (ties to even), so |q| <= 127; an all-zero block gets d = 0 and q = 0. sums[s] is the
/// sum of q over elements 32 s .. 32 s + 31. Plain IEEE arithmetic in baseline code: the same
/// bits for every ISA path, every batch position and every thread (the determinism contract in
/// matmul.h).
void QuantizeActivationRow(const float* x, int64_t k, int64_t scale_block, int8_t* q, float* d,
                           int32_t* sums);
/// The same bits in AVX2 (used by the AVX2 and AVX-512 paths).
void QuantizeActivationRowAvx2(const float* x, int64_t k, int64_t scale_block, int8_t* q, float* d,
                               int32_t* sums);

using MatmulColumnsFn = void (*)(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                                 int64_t n_end);

/// Portable path (no SIMD intrinsics).
void MatmulColumnsScalar(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                         int64_t n_end);
/// AVX2 + FMA + F16C path (matmul_avx2.cc).
void MatmulColumnsAvx2(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                       int64_t n_end);
/// AVX-512 F/BW/VL path (matmul_avx512.cc).
void MatmulColumnsAvx512(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                         int64_t n_end);
/// The AVX-512 path's bf16 weights with AVX512_BF16 (vdpbf16ps on x rounded to bf16),
/// matmul_avx512_bf16.cc; other formats go to MatmulColumnsAvx512.
void MatmulColumnsAvx512Bf16(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                             int64_t n_end);
/// Whether Matmul() with `w_dtype` weights on the active path rounds the x rows to bf16 first
/// (MatmulColumnsAvx512Bf16: bf16 weights, the avx512 path, CpuAvx512Bf16Enabled()).
bool RoundsXToBf16(DType w_dtype);
/// Whether Matmul() runs `w_dtype` (bf16 or f32; false for the others) on the path its packed
/// layout (packed_weights.h) is laid out for: bf16 on MatmulColumnsAvx512Bf16 (as
/// RoundsXToBf16), f32 on MatmulColumnsAvx512. Every other path unpacks the rows.
bool RunsPackedFloat(DType w_dtype);
/// The AVX-512 path's int8 formats with VNNI (vpdpbusd), matmul_avx512_vnni.cc. A path of its own
/// for q8_0/q4_0 (a different summation order from MatmulColumnsAvx512's 256-bit kernels); the
/// K-quants give the same bits either way.
void MatmulColumnsAvx512Vnni(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                             int64_t n_end);

}  // namespace kvserve::cpu::internal

#endif  // KVSERVE_KERNELS_CPU_MATMUL_IMPL_H_
