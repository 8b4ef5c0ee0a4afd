#include "kernels/cpu/activation.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/logits.h"

namespace kvserve::cpu {

namespace internal {

void SiluMulRowBase(const float* g, const float* u, float* o, int64_t n) {
  constexpr int64_t kChunk = 1024;
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t m = std::min(kChunk, n - c0);
    // e = exp(-|g|) <= 1, ExpShifted's domain (SIMD on every ISA path, the same bits on each);
    // then silu(g) = g / (1 + e) for g >= 0 and g e / (1 + e) below: g / (1 + exp(-g)) either
    // way, without an overflowing exp. The results replace e in this local buffer before they
    // are copied out: `o` may alias `g` or `u`, and with loads and stores that may overlap the
    // compiler kept the loop scalar.
    alignas(64) float e[kChunk];
    for (int64_t i = 0; i < m; ++i) e[i] = -std::fabs(g[c0 + i]);
    ExpShifted(e, m, 0.0f, 1.0f, e);
    // The factor is e where g's sign bit is set (g < 0, or -0 where e = 1) and 1 elsewhere, x * 1
    // being x exactly. Chosen with integer masks: a float comparison may trap on NaN, and under
    // -ftrapping-math GCC then keeps the loop scalar.
    for (int64_t i = 0; i < m; ++i) {
      const float x = g[c0 + i];
      const uint32_t negative = 0u - (std::bit_cast<uint32_t>(x) >> 31);
      const float factor = std::bit_cast<float>((std::bit_cast<uint32_t>(e[i]) & negative) |
                                                (std::bit_cast<uint32_t>(1.0f) & ~negative));
      e[i] = x * factor / (1.0f + e[i]) * u[c0 + i];
    }
    std::memcpy(o + c0, e, static_cast<size_t>(m) * sizeof(float));
  }
}

}  // namespace internal

void SiluMul(const float* gate, const float* up, float* out, int64_t rows, int64_t dim,
             int64_t gate_stride, int64_t up_stride, int64_t out_stride, ThreadPool* pool) {
  if (rows <= 0 || dim <= 0) return;
  // Work items are (row, column chunk) so a single decode row still spreads over threads.
  constexpr int64_t kChunk = 1024;
  const int64_t chunks_per_row = (dim + kChunk - 1) / kChunk;
  const auto row_fn = ForActiveIsa(&internal::SiluMulRowBase, &internal::SiluMulRowAvx2,
                                   &internal::SiluMulRowAvx512);
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / chunks_per_row;
      const int64_t c0 = item % chunks_per_row * kChunk;
      const int64_t c1 = std::min(dim, c0 + kChunk);
      row_fn(gate + r * gate_stride + c0, up + r * up_stride + c0, out + r * out_stride + c0,
             c1 - c0);
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
