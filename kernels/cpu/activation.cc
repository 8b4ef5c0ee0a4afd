#include "kernels/cpu/activation.h"

#include <algorithm>
#include <cmath>

namespace kvserve::cpu {

void SiluMul(const float* gate, const float* up, float* out, int64_t rows, int64_t dim,
             int64_t gate_stride, int64_t up_stride, int64_t out_stride, ThreadPool* pool) {
  if (rows <= 0 || dim <= 0) return;
  // Work items are (row, column chunk) so a single decode row still spreads over threads.
  constexpr int64_t kChunk = 1024;
  const int64_t chunks_per_row = (dim + kChunk - 1) / kChunk;
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / chunks_per_row;
      const int64_t c0 = item % chunks_per_row * kChunk;
      const int64_t c1 = std::min(dim, c0 + kChunk);
      const float* g = gate + r * gate_stride;
      const float* u = up + r * up_stride;
      float* o = out + r * out_stride;
      for (int64_t i = c0; i < c1; ++i) {
        const float x = g[i];
        o[i] = x / (1.0f + std::exp(-x)) * u[i];
      }
    }
  };
  const int64_t items = rows * chunks_per_row;
  constexpr int64_t kMinItems = 4;  // ~4096 exps per chunk
  if (pool == nullptr || items < 2 * kMinItems) {
    run(0, items);
  } else {
    pool->ParallelFor(items, kMinItems, run);
  }
}

}  // namespace kvserve::cpu
