#ifndef KVSERVE_KERNELS_CPU_ACTIVATION_H_
#define KVSERVE_KERNELS_CPU_ACTIVATION_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace kvserve::cpu {

/// out[r, i] = silu(gate[r, i]) * up[r, i], silu(g) = g / (1 + exp(-g)), fp32, computed as
/// g / (1 + e) (g >= 0) or g e / (1 + e) with e = exp(-|g|) from ExpShifted (logits.h): the same
/// bits on every ISA path.
/// Rows are at the given element strides; `out` may alias `gate` or `up` exactly (same stride)
/// but not overlap them otherwise. Parallel over rows on `pool` (nullptr = inline).
void SiluMul(const float* gate, const float* up, float* out, int64_t rows, int64_t dim,
             int64_t gate_stride, int64_t up_stride, int64_t out_stride, ThreadPool* pool);

namespace internal {
// One row piece of SiluMul (o may alias g or u exactly): the portable loop, and the AVX2 and
// AVX-512 loops (activation_avx2.cc, activation_avx512.cc: the same float operations, sixteen or
// eight at a time, so the same bits), which SiluMul picks by ActiveCpuIsa().
void SiluMulRowBase(const float* g, const float* u, float* o, int64_t n);
void SiluMulRowAvx2(const float* g, const float* u, float* o, int64_t n);
void SiluMulRowAvx512(const float* g, const float* u, float* o, int64_t n);
}  // namespace internal

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_ACTIVATION_H_
