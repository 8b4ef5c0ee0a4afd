#ifndef KVSERVE_KERNELS_CPU_ATTENTION_KERNELS_H_
#define KVSERVE_KERNELS_CPU_ATTENTION_KERNELS_H_

// Internal to kernels/cpu: per-ISA inner loops of PagedAttention over a run of keys that are
// contiguous in one cache block (rows head_dim floats apart). Same rules as matmul_impl.h: the
// ISA files use only intrinsics and file-local code.
//
// Orders (fixed per ISA, independent of how a context is cut into runs):
//   scores: per key one dot product — scalar 8 lane sums + fixed combine; avx2 one 8-lane FMA
//           accumulator, fixed horizontal sum, then the d % 8 tail in order; avx512 one 16-lane
//           FMA accumulator with a masked tail, fixed horizontal sum; then * scale.
//   accumulate: per output element d, acc[d] += p_i * v_i[d] for keys i in order (FMA on SIMD
//           paths), so carrying acc across runs changes nothing.

#include <cstdint>

namespace kvserve::cpu::internal {

/// scores[i] = dot(q, k + i * head_dim) * scale for i in [0, count).
using AttentionScoresFn = void (*)(const float* q, const float* k, int64_t count, int64_t head_dim,
                                   float scale, float* scores);
/// acc[d] += probs[i] * v[i * head_dim + d] for i in [0, count), in order of i.
using AttentionAccumulateFn = void (*)(const float* probs, const float* v, int64_t count,
                                       int64_t head_dim, float* acc);

/// One ISA's pair of inner loops.
struct AttentionKernels {
  AttentionScoresFn scores;
  AttentionAccumulateFn accumulate;
};

/// Portable loops.
AttentionKernels AttentionKernelsScalar();
/// AVX2 + FMA loops (attention_kernels_avx2.cc).
AttentionKernels AttentionKernelsAvx2();
/// AVX-512 F loops (attention_kernels_avx512.cc).
AttentionKernels AttentionKernelsAvx512();

}  // namespace kvserve::cpu::internal

#endif  // KVSERVE_KERNELS_CPU_ATTENTION_KERNELS_H_
