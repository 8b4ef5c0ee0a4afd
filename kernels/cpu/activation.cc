#include "kernels/cpu/activation.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/logits.h"

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
      const float* g = gate + r * gate_stride + c0;
      const float* u = up + r * up_stride + c0;
      float* o = out + r * out_stride + c0;
      const int64_t n = c1 - c0;
      // e = exp(-|g|) <= 1, ExpShifted's domain (SIMD on every ISA path, the same bits on each);
      // then silu(g) = g / (1 + e) for g >= 0 and g e / (1 + e) below: g / (1 + exp(-g)) either
      // way, without an overflowing exp. The results replace e in this local buffer before they
      // are copied out: `out` may alias `gate` or `up`, and with loads and stores that may
      // overlap the compiler kept the loop scalar.
      alignas(64) float e[kChunk];
      for (int64_t i = 0; i < n; ++i) e[i] = -std::fabs(g[i]);
      ExpShifted(e, n, 0.0f, 1.0f, e);
      // The factor is e where g's sign bit is set (g < 0, or -0 where e = 1) and 1 elsewhere, x * 1
      // being x exactly. Chosen with integer masks: a float comparison may trap on NaN, and under
      // -ftrapping-math GCC then keeps the loop scalar.
      for (int64_t i = 0; i < n; ++i) {
        const float x = g[i];
        const uint32_t negative = 0u - (std::bit_cast<uint32_t>(x) >> 31);
        const float factor = std::bit_cast<float>((std::bit_cast<uint32_t>(e[i]) & negative) |
                                                  (std::bit_cast<uint32_t>(1.0f) & ~negative));
        e[i] = x * factor / (1.0f + e[i]) * u[i];
      }
      std::memcpy(o, e, static_cast<size_t>(n) * sizeof(float));
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
