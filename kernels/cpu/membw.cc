#include "kernels/cpu/membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

#include "common/io/anonymous_memory.h"

namespace kvserve::cpu {
namespace {

// fn(begin, end) over [0, n), split over `pool` (nullptr: the caller alone).
void ForAll(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr) {
    fn(0, n);
  } else {
    pool->ParallelFor(n, 1 << 14, fn);
  }
}

// The best of `reps` timed ForAll(fn) runs after one warm-up, in seconds (never 0).
double BestSeconds(ThreadPool* pool, int64_t n, int reps,
                   const std::function<void(int64_t, int64_t)>& fn) {
  ForAll(pool, n, fn);  // warm-up
  double best = 1e30;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ForAll(pool, n, fn);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return std::max(best, 1e-9);
}

// The sum of p[begin, end) in sixteen independent lanes (kept in vector registers): a read stream
// whose adds never wait on each other.
[[gnu::always_inline]] inline uint64_t SumRange(const uint64_t* p, int64_t begin, int64_t end) {
  uint64_t lanes[16] = {};
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    for (int l = 0; l < 16; ++l) lanes[l] += p[i + l];
  }
  for (; i < end; ++i) lanes[0] += p[i];
  uint64_t total = 0;
  for (uint64_t v : lanes) total += v;
  return total;
}

uint64_t SumRangeBaseline(const uint64_t* p, int64_t begin, int64_t end) {
  return SumRange(p, begin, end);
}

#if defined(__x86_64__)
// With 256-bit loads where the CPU has them: one Zen 4 thread read about 10 % faster than with the
// baseline's 128-bit ones.
__attribute__((target("avx2"))) uint64_t SumRangeAvx2(const uint64_t* p, int64_t begin,
                                                      int64_t end) {
  return SumRange(p, begin, end);
}
#endif

}  // namespace

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
  // First touch from the threads that later stream each range.
  ForAll(pool, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pa[i] = 0.0f;
      pb[i] = 1.0f;
      pc[i] = 2.0f;
    }
  });
  const float s = 3.0f;
  const double seconds = BestSeconds(pool, n, reps, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) pa[i] = pb[i] + s * pc[i];
  });
  return 3.0 * static_cast<double>(n) * sizeof(float) / seconds;
}

double MeasureReadBandwidth(ThreadPool* pool, size_t bytes, int reps) {
  const int64_t n = std::max<int64_t>(1024, static_cast<int64_t>(bytes / sizeof(uint64_t)));
  AnonymousMemory buffer;
  if (!buffer.Map(static_cast<size_t>(n) * sizeof(uint64_t))) return 0.0;
  auto* p = reinterpret_cast<uint64_t*>(buffer.data());
  ForAll(pool, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = static_cast<uint64_t>(i);
  });
  uint64_t (*sum)(const uint64_t*, int64_t, int64_t) = &SumRangeBaseline;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) sum = &SumRangeAvx2;
#endif
  // The totals go to `sink` so that the reads cannot be dropped.
  std::atomic<uint64_t> sink{0};
  const double seconds = BestSeconds(pool, n, reps, [&](int64_t begin, int64_t end) {
    sink.fetch_add(sum(p, begin, end), std::memory_order_relaxed);
  });
  return static_cast<double>(n) * sizeof(uint64_t) / seconds;
}

}  // namespace kvserve::cpu
