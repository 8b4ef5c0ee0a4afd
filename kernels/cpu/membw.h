#ifndef KVSERVE_KERNELS_CPU_MEMBW_H_
#define KVSERVE_KERNELS_CPU_MEMBW_H_

#include <cstddef>

#include "kernels/cpu/thread_pool.h"

namespace kvserve::cpu {

/// STREAM-style triad a = b + s * c over three float arrays of `bytes_per_array` bytes each,
/// split over `pool` (nullptr = one thread); best of `reps` (>= 1) timed runs after one warm-up.
/// Returns bytes/s counting 3 arrays moved per run — the machine's memory bandwidth when the
/// arrays are well beyond the last-level cache (use >= 4x its size). Benchmarks compare to it.
/// The arrays are on huge pages where the kernel offers them, as weights and KV are; 0 when
/// they cannot be mapped.
double MeasureTriadBandwidth(ThreadPool* pool, size_t bytes_per_array, int reps);

/// A plain read of one array of `bytes` bytes (summed into vector lanes), split over `pool`
/// (nullptr = one thread) in contiguous ranges; best of `reps` (>= 1) timed runs after one
/// warm-up. Returns bytes read per second: the ceiling of a kernel that only streams its weights
/// in (a triad also writes, and its stores' line fills are not counted). On huge pages where
/// the kernel offers them; 0 when the array cannot be mapped.
double MeasureReadBandwidth(ThreadPool* pool, size_t bytes, int reps);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_MEMBW_H_
