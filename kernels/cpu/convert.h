#ifndef KVSERVE_KERNELS_CPU_CONVERT_H_
#define KVSERVE_KERNELS_CPU_CONVERT_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace kvserve::cpu {

/// dst[i] = float(src[i]) for one row of `n` elements stored in `dtype` (layouts in
/// kernels/dtype.h; quantized rows are whole blocks, n % DTypeBlockElems(dtype) == 0). Quantized
/// elements decode in the order kernels/cpu/block_quant.h documents: the same values every
/// matmul path and the CUDA LoadWeight use. kF8E4M3 gives the codes' values, without the row
/// scale its matrix keeps apart.
void ConvertRowToF32(const void* src, DType dtype, int64_t n, float* dst);

/// Stores a row of `n` floats in `dtype`: f16/bf16 round to nearest even, quantized types go
/// through cpu::QuantizeRow (n % DTypeBlockElems(dtype) == 0), kF8E4M3 to unscaled codes
/// (FloatToFp8E4M3). For writers and tests.
void ConvertRowFromF32(const float* src, int64_t n, DType dtype, void* dst);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_CONVERT_H_
