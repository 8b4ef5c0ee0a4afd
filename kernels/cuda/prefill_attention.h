#ifndef KVSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_
#define KVSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_

#include <cuda_runtime_api.h>

#include "kernels/cpu/paged_attention.h"
#include "kernels/op_args.h"

namespace kvserve::cuda {

/// GPU twin of cpu::PagedAttention for any q_len (prefill, chunked prefill, mixed batches).
/// Grid (query tile of 16 tokens, query head, sequence): each block keeps its query tile in
/// shared memory and streams key/value tiles of 32 through the block table — the cached prefix
/// and the new chunk alike, since the chunk's K/V were written first — with an online softmax
/// and the causal (and sliding-window) mask. `plan.shape.max_q_len` bounds the grid.
cudaError_t PrefillAttention(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                             cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_
