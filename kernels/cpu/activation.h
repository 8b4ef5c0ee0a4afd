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

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_ACTIVATION_H_
