#ifndef KVSERVE_KERNELS_CPU_ATTENTION_KERNELS_H_
#define KVSERVE_KERNELS_CPU_ATTENTION_KERNELS_H_

// Internal to kernels/cpu: per-ISA, per-KV-dtype inner loops of PagedAttention over a run of keys
// that are contiguous in one cache block (rows head_dim elements apart). Same rules as
// matmul_impl.h: the ISA files use only intrinsics and file-local code.
//
// Elements are decoded to f32 exactly (f16 / bf16 / int8 / fp8 values are all exact in f32):
// scalar fp8 through kv_quant.h's 256-entry table, SIMD fp8 by a bit move to f16 (see
// Fp8ToHalfBits); int8 / fp8 rows carry an f32 scale applied outside the element loops.
//
// Orders (fixed per ISA and dtype, independent of how a context is cut into runs and of the
// group size: the group's queries share row decodes, not arithmetic):
//   scores: per query and key one dot product of q with the decoded row — scalar 8 lane sums +
//           fixed combine; avx2 one 8-lane FMA accumulator over the 8-element chunks, the last
//           partial chunk zero-padded, fixed horizontal sum; avx512 the same with 16 lanes; then
//           * row scale (int8 / fp8 only), then * scale.
//   accumulate: per query and output element d, acc[d] += w_i * decoded v_i[d] for keys i in
//           order (FMA on SIMD paths), where w_i = probs[i] (times the row scale for int8 / fp8),
//           so carrying acc across runs changes nothing.

#include <cstdint>

#include "kernels/kv_dtype.h"

namespace kvserve::cpu::internal {

/// The first `rows` rows of another run (same dtype and head_dim) for a kernel to request into L1
/// while it reads its own: it issues the requests in address order at the pace of its loop
/// instead of in one burst (paged_attention.cc says which run). A hint only: `data` may be null.
struct RowPrefetch {
  const void* data = nullptr;
  int64_t rows = 0;
};

/// For the `group` query heads of one KV head at once (query g at q + g * head_dim), so each K or
/// V row is decoded once for the whole group:
/// scores[g * scores_stride + i] = dot(q_g, decoded row i) [* row_scales[i]] * scale for i in
/// [0, count); row i starts at element i * head_dim of `k` (a pointer to the run's first row, in
/// the dtype's storage). row_scales is read only for int8 / fp8.
using AttentionScoresFn = void (*)(const float* q, int64_t group, const void* k,
                                   const float* row_scales, int64_t count, int64_t head_dim,
                                   float scale, float* scores, int64_t scores_stride,
                                   RowPrefetch prefetch);
/// acc[g * head_dim + d] += probs[g * probs_stride + i] [* row_scales[i]] * decoded v row i [d]
/// for g in [0, group), i in [0, count), in order of i.
using AttentionAccumulateFn = void (*)(const float* probs, int64_t probs_stride, int64_t group,
                                       const void* v, const float* row_scales, int64_t count,
                                       int64_t head_dim, float* acc, RowPrefetch prefetch);

/// For each of `group` rows p = probs + g * keys (keys >= 1): p[i] = exp(p[i] - max of the row)
/// (logits.h's ExpShifted with scale 1: the same bits on every ISA), then inv_sum[g] = 1 / the
/// row's sum, added in eight lane sums (lane l adds p[i] for i = l mod 8 in order of i) combined
/// as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), on every ISA. The SIMD loops keep a row's
/// exps in registers for the sum and take the rows back to back, where one exp call per row
/// left short rows waiting on the exp's latency and on loads of what it had just stored.
using AttentionSoftmaxFn = void (*)(float* probs, int64_t group, int64_t keys, float* inv_sum);

/// One ISA's inner loops for one KV dtype (softmax does not depend on it).
struct AttentionKernels {
  AttentionScoresFn scores;
  AttentionAccumulateFn accumulate;
  AttentionSoftmaxFn softmax;
};

/// Returns make.template operator()<T>() for the runtime `dtype`: the one dtype switch each ISA's
/// file needs to hand out its loops (make is a lambda local to that file).
template <class Make>
AttentionKernels ForKvDType(KvCacheDType dtype, const Make& make) {
  switch (dtype) {
    case KvCacheDType::kF32:
      break;
    case KvCacheDType::kF16:
      return make.template operator()<KvCacheDType::kF16>();
    case KvCacheDType::kBF16:
      return make.template operator()<KvCacheDType::kBF16>();
    case KvCacheDType::kInt8:
      return make.template operator()<KvCacheDType::kInt8>();
    case KvCacheDType::kFp8E4M3:
      return make.template operator()<KvCacheDType::kFp8E4M3>();
  }
  return make.template operator()<KvCacheDType::kF32>();
}

/// Portable loops.
AttentionKernels AttentionKernelsScalar(KvCacheDType dtype);
/// AVX2 + FMA + F16C loops (attention_kernels_avx2.cc).
AttentionKernels AttentionKernelsAvx2(KvCacheDType dtype);
/// AVX-512 F/BW/VL loops (attention_kernels_avx512.cc).
AttentionKernels AttentionKernelsAvx512(KvCacheDType dtype);

}  // namespace kvserve::cpu::internal

#endif  // KVSERVE_KERNELS_CPU_ATTENTION_KERNELS_H_
