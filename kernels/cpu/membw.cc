#include "kernels/cpu/membw.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace kvserve::cpu {

double MeasureTriadBandwidth(ThreadPool* pool, size_t bytes_per_array, int reps) {
  const int64_t n = std::max<int64_t>(1024, static_cast<int64_t>(bytes_per_array / sizeof(float)));
  std::unique_ptr<float[]> a(new float[n]);
  std::unique_ptr<float[]> b(new float[n]);
  std::unique_ptr<float[]> c(new float[n]);
  float* pa = a.get();
  float* pb = b.get();
  float* pc = c.get();
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
