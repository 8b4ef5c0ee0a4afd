#ifndef KVSERVE_KERNELS_CPU_EMBEDDING_H_
#define KVSERVE_KERNELS_CPU_EMBEDDING_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace kvserve::cpu {

/// out[i, :] = float(table[ids[i], :]) for i in [0, n).
/// `table` is [vocab, dim] in `dtype` (quantized: dim % 32 == 0); `out` is [n, dim] contiguous.
/// Ids must be in [0, vocab): the caller validates them (this kernel does not know vocab).
void EmbeddingGather(const void* table, DType dtype, int64_t dim, const int32_t* ids, int64_t n,
                     float* out);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_EMBEDDING_H_
