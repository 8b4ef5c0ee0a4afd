#include "kernels/cpu/membw.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>

#include "common/io/anonymous_memory.h"

namespace kvserve::cpu {

double MeasureTriadBandwidth(ThreadPool* pool, size_t bytes_per_array, int reps) {
  const int64_t n = std::max<int64_t>(1024, static_cast<int64_t>(bytes_per_array / sizeof(float)));
  // On huge pages, as the engine maps weights and KV (common/io/anonymous_memory.h), so that the
  // bandwidth kernels are scaled by is the machine's best, not one cut by 4 KiB page walks. The
  // arrays start 64 and 128 bytes past each other's offset, as STREAM offsets its arrays against
  // 4 KiB aliasing of the store to a[i] with the loads of b[i] and c[i] (on the Zen 4 VM of
  // docs/benchmarks.md it measured the same either way).
  AnonymousMemory buffers[3];
  for (AnonymousMemory& m : buffers) {
    if (!m.Map(static_cast<size_t>(n) * sizeof(float) + 256)) return 0.0;
  }
  float* pa = reinterpret_cast<float*>(buffers[0].data());
  float* pb = reinterpret_cast<float*>(buffers[1].data() + 64);
  float* pc = reinterpret_cast<float*>(buffers[2].data() + 128);
  const auto for_all = [&](const std::function<void(int64_t, int64_t)>& fn) {
    if (pool == nullptr) {
      fn(0, n);
    } else {
      pool->ParallelFor(n, 1 << 14, fn);
    }
  };
  // First touch from the threads that later stream each range.
  for_all([&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pa[i] = 0.0f;
      pb[i] = 1.0f;
      pc[i] = 2.0f;
    }
  });
  const float s = 3.0f;
  const auto triad = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) pa[i] = pb[i] + s * pc[i];
  };
  for_all(triad);  // warm-up
  double best = 1e30;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for_all(triad);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  best = std::max(best, 1e-9);
  return 3.0 * static_cast<double>(n) * sizeof(float) / best;
}

}  // namespace kvserve::cpu
