// The machine's practical arithmetic peak: a register-only FMA loop (no memory traffic) on every
// thread of a pool, so benchmarks can report achieved GFLOP/s as a fraction of it measured in the
// same run (under the same load from the rest of the machine).
#ifndef KVSERVE_BENCH_PEAK_FMA_H_
#define KVSERVE_BENCH_PEAK_FMA_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "kernels/cpu/avx512_intrinsics.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/thread_pool.h"

namespace kvserve::bench {

// Independent accumulator chains cover the FMA latency on both FMA units of a core; the result is
// the machine's practical peak under the same load as the other benchmarks here. AVX-512 has 32
// vector registers and runs 16 chains; AVX2 has 16, so it runs 12: with 16 chains plus the two
// operands GCC kept three chains on the stack, and their store-to-load round trips held the loop
// to ~0.6 of the 256-bit units' rate (the AVX2 peak then read ~0.57 of the AVX-512 one on a
// Zen 4 core, whose 512-bit FMAs run on the same two 256-bit units).
inline constexpr int64_t kPeakIters = int64_t{1} << 20;

// The chains are named variables (an array would be kept in memory by the compiler).
#define KVSERVE_PEAK_FMA_12(FMA)                                                  \
  c0 = FMA(c0, a, b), c1 = FMA(c1, a, b), c2 = FMA(c2, a, b), c3 = FMA(c3, a, b); \
  c4 = FMA(c4, a, b), c5 = FMA(c5, a, b), c6 = FMA(c6, a, b), c7 = FMA(c7, a, b); \
  c8 = FMA(c8, a, b), c9 = FMA(c9, a, b), c10 = FMA(c10, a, b), c11 = FMA(c11, a, b)

__attribute__((target("avx512f"))) inline float PeakFmaAvx512(float seed) {
  // Distinct starting values: identical chains would be merged into one by the compiler.
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 c0 = _mm512_set1_ps(seed), c1 = _mm512_add_ps(c0, one), c2 = _mm512_add_ps(c1, one),
         c3 = _mm512_add_ps(c2, one), c4 = _mm512_add_ps(c3, one), c5 = _mm512_add_ps(c4, one),
         c6 = _mm512_add_ps(c5, one), c7 = _mm512_add_ps(c6, one), c8 = _mm512_add_ps(c7, one),
         c9 = _mm512_add_ps(c8, one), c10 = _mm512_add_ps(c9, one), c11 = _mm512_add_ps(c10, one),
         c12 = _mm512_add_ps(c11, one), c13 = _mm512_add_ps(c12, one),
         c14 = _mm512_add_ps(c13, one), c15 = _mm512_add_ps(c14, one);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < kPeakIters; ++it) {
    KVSERVE_PEAK_FMA_12(_mm512_fmadd_ps);
    c12 = _mm512_fmadd_ps(c12, a, b), c13 = _mm512_fmadd_ps(c13, a, b);
    c14 = _mm512_fmadd_ps(c14, a, b), c15 = _mm512_fmadd_ps(c15, a, b);
  }
  const __m512 s = _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                    _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7))),
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                    _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))));
  alignas(64) float t[16];
  _mm512_store_ps(t, s);
  return t[0] + t[15];
}

__attribute__((target("avx2,fma"))) inline float PeakFmaAvx2(float seed) {
  // Distinct starting values: identical chains would be merged into one by the compiler.
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 c0 = _mm256_set1_ps(seed), c1 = _mm256_add_ps(c0, one), c2 = _mm256_add_ps(c1, one),
         c3 = _mm256_add_ps(c2, one), c4 = _mm256_add_ps(c3, one), c5 = _mm256_add_ps(c4, one),
         c6 = _mm256_add_ps(c5, one), c7 = _mm256_add_ps(c6, one), c8 = _mm256_add_ps(c7, one),
         c9 = _mm256_add_ps(c8, one), c10 = _mm256_add_ps(c9, one), c11 = _mm256_add_ps(c10, one);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < kPeakIters; ++it) {
    KVSERVE_PEAK_FMA_12(_mm256_fmadd_ps);
  }
  const __m256 s =
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                                  _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7))),
                    _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  alignas(32) float t[8];
  _mm256_store_ps(t, s);
  return t[0] + t[7];
}
#undef KVSERVE_PEAK_FMA_12

/// Runs the FMA loop once on every thread of `pool` (nullptr: the calling thread only) and
/// returns the floating-point operations done (2 per lane per FMA); 0 without AVX2/AVX-512.
inline double RunPeakFma(cpu::ThreadPool* pool) {
  const cpu::CpuIsa isa = cpu::ActiveCpuIsa();
  if (isa == cpu::CpuIsa::kScalar) return 0;
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  std::vector<float> sink(static_cast<size_t>(threads));
  const auto body = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      sink[t] = isa == cpu::CpuIsa::kAvx512 ? PeakFmaAvx512(static_cast<float>(t))
                                             : PeakFmaAvx2(static_cast<float>(t));
    }
  };
  if (pool == nullptr) {
    body(0, 1);
  } else {
    pool->ParallelFor(threads, 1, body);
  }
  volatile float keep = sink[0];
  (void)keep;
  const double lanes_x_chains = isa == cpu::CpuIsa::kAvx512 ? 16 * 16 : 8 * 12;
  return 2.0 * lanes_x_chains * static_cast<double>(kPeakIters) * threads;
}

/// Best FLOP/s of runs of RunPeakFma on `pool`: at least `reps` runs, and more until
/// `min_seconds` have passed (at most 200). A VM may run both threads of a pool on one vCPU for
/// a few tens of milliseconds; five runs back to back (~25 ms) then all read one thread's peak,
/// and ratios against it read twice too high.
inline double PeakFlopsPerSecond(cpu::ThreadPool* pool, int reps = 5, double min_seconds = 0.3) {
  double best = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 200; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double flops = RunPeakFma(pool);
    const auto t1 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count();
    if (s > 0 && flops / s > best) best = flops / s;
    if (r + 1 >= reps && std::chrono::duration<double>(t1 - start).count() >= min_seconds) break;
  }
  return best;
}

}  // namespace kvserve::bench

#endif  // KVSERVE_BENCH_PEAK_FMA_H_
