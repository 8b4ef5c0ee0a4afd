#ifndef KVSERVE_KERNELS_CUDA_DECODE_ATTENTION_H_
#define KVSERVE_KERNELS_CUDA_DECODE_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/paged_attention.h"
#include "kernels/op_args.h"

namespace kvserve::cuda {

/// The work partition of a decode batch along the context.
struct DecodeSplits {
  int32_t num_splits = 1;
  int64_t split_len = 0;  // keys per split; 0: each sequence's keys / num_splits
};

/// With shape.context_capacity set (the model does): a fixed split length from the capacity
/// alone (at least 256 keys, a multiple of the 64-key tile, at most 64 splits at the capacity),
/// and as many splits as the longest context needs. A sequence's keys are then cut at the same
/// places whatever max_context_len or num_seqs the plan saw, so graph replays (planned for the
/// capacity and a padded batch) and eager steps give identical bits. Without it: enough
/// (sequence, kv head, split) blocks to fill `num_sms` SMs twice, each split at least 128 keys,
/// at most 64 splits.
DecodeSplits PlanDecodeSplits(const AttentionShape& shape, int num_sms);

/// Bytes of scratch DecodeAttention needs for `plan` (0 when num_splits == 1).
size_t DecodeWorkspaceBytes(const AttentionPlan& plan);

/// GPU twin of cpu::PagedAttention for batches where every q_len is 1, flash-decoding style.
/// Grid (kv head, sequence, split): each block walks its share of the sequence's keys
/// [window start, context_len) in tiles through the block table; each K row and V row is
/// loaded once and serves all num_heads / num_kv_heads query heads of its group (GQA). With
/// more than one split, blocks write a normalised partial output and its log-sum-exp to
/// `workspace` and a merge kernel combines them. The split count comes from the plan and the
/// key ranges from context_len on the device, so a run is safe to capture in a CUDA graph.
/// Reads every KV dtype (f32, f16, bf16, int8, fp8). Rows of a power-of-two number (<= 32) of
/// 16-byte chunks (head dims 64-256 in every dtype; 8 in f32 and 16-bit) from 16-byte-aligned caches
/// take the bandwidth kernel (cp.async pipeline, q and accumulators in registers: see
/// PagedDecodeKernel); others (MLA's 576-wide latent rows) a general one.
cudaError_t DecodeAttention(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                            void* workspace, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_DECODE_ATTENTION_H_
