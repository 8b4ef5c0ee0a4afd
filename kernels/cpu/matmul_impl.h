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
// then + bias. Quantized weights are converted to fp32 as float(q) * d (exact) before the FMA.
// The avx512 path for m >= 4 converts weight panels to fp32 once into a per-thread buffer and
// walks k in slices, storing the 16-lane accumulators between slices: the same FMA sequence per
// element as m < 4, so results stay bit-identical (matmul_avx512.cc).

#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace kvserve::cpu::internal {

/// Sizes the dispatcher computes once per call (in baseline code, see above).
struct MatmulPlan {
  int64_t w_row_bytes;  // DTypeRowBytes(w_dtype, k)
  int64_t row_block;    // avx2: x rows per pass over a column tile (kept in L2), % 4 == 0
};

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

}  // namespace kvserve::cpu::internal

#endif  // KVSERVE_KERNELS_CPU_MATMUL_IMPL_H_
