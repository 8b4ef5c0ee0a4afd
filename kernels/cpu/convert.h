#ifndef KVSERVE_KERNELS_CPU_CONVERT_H_
#define KVSERVE_KERNELS_CPU_CONVERT_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace kvserve::cpu {

/// dst[i] = float(src[i]) for one row of `n` elements stored in `dtype` (layouts in
/// kernels/dtype.h; quantized rows are whole blocks, n % 32 == 0). Quantized elements convert as
/// float(q) * d, which is exact in fp32 — the same values every matmul path uses.
void ConvertRowToF32(const void* src, DType dtype, int64_t n, float* dst);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_CONVERT_H_
