#ifndef KVSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_
#define KVSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_

#include <cuda_runtime_api.h>

#include "kernels/cpu/paged_attention.h"
#include "kernels/op_args.h"

namespace kvserve::cuda {

/// GPU twin of cpu::PagedAttention for any q_len (prefill, chunked prefill, mixed batches): each
/// sequence's queries are the last q_len positions of its context and attend keys from 0 (or
/// the sliding window's start) to their own position, through the block table; the new chunk's
/// K/V must already be in the cache. `plan.shape.max_q_len` bounds the grid.
///
/// f16, bf16, int8 and fp8 KV with head_dim 64, 128 or 256 run on tensor cores
/// (PrefillMmaKernel, FlashAttention-2 style: mma.sync m16n8k16 with f32 accumulation, ldmatrix,
/// an online softmax in registers). A block takes 64 (query token, head) rows of one kv head's
/// group of query heads, 4 warps of 16 rows, and streams K/V tiles of 64 keys (32 at
/// head_dim 256) through double-buffered shared memory, once for all of the group's heads;
/// tiles past a warp's queries (or before its window) are skipped and only tiles the causal or
/// window limit crosses are masked. Q (times scale · log2 e) and the softmax weights P are
/// rounded to bf16 (to f16 for f16 KV) for the products; K/V are used as stored (int8 / fp8
/// codes converted to bf16 exactly, their row scales applied to the scores and to P in f32).
/// The result therefore differs from the CPU's f32 arithmetic by the rounding of Q and P
/// (about 2^-9 relative for bf16), not bit for bit.
///
/// f32 KV (kept exact) and other head dims run the scalar kernel: query tiles of 16 tokens per
/// query head in f32, key tiles of 32.
cudaError_t PrefillAttention(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                             cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_
