#include "kernels/cpu/embedding.h"

#include "kernels/cpu/convert.h"

namespace kvserve::cpu {

void EmbeddingGather(const void* table, DType dtype, int64_t dim, const int32_t* ids, int64_t n,
                     float* out) {
  const int64_t row_bytes = DTypeRowBytes(dtype, dim);
  const auto* base = static_cast<const uint8_t*>(table);
  for (int64_t i = 0; i < n; ++i) {
    ConvertRowToF32(base + static_cast<int64_t>(ids[i]) * row_bytes, dtype, dim, out + i * dim);
  }
}

}  // namespace kvserve::cpu
