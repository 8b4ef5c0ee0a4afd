#ifndef KVSERVE_WORKER_PLANNER_CAPACITY_PLANNER_H_
#define KVSERVE_WORKER_PLANNER_CAPACITY_PLANNER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/planner/kv_dtype.h"
#include "worker/planner/model_spec.h"

namespace kvserve {

/// Fixed scratch reserved per GPU beside the activation buffers: cuBLAS workspace, attention
/// split-K scratch, CUDA graph pools and allocator slack.
inline constexpr int64_t kDefaultWorkspaceBytes = int64_t{256} << 20;

/// Inputs of a capacity plan. All figures are per GPU.
struct PlanOptions {
  /// Memory of one GPU.
  int64_t gpu_memory_bytes = int64_t{80} << 30;
  /// Fraction of gpu_memory_bytes the server may use, in (0, 1].
  double gpu_memory_utilization = 0.9;
  /// Tensor-parallel degree.
  int tp = 1;
  /// Forces the weight dtype (bytes = parameters × its size); unset uses the exact tensor bytes
  /// of the source, else its declared dtype, else bf16.
  std::optional<WeightDType> weight_dtype;
  /// The KV cache dtype the caller intends to use (every dtype is planned; this one is chosen).
  KvCacheDType kv_dtype = KvCacheDType::kBF16;
  /// Sequence length the concurrency figures assume; 0 means the model's maximum.
  int max_model_len = 0;
  /// Tokens per KV block.
  int block_size = 16;
  /// Length of a prompt prefix every sequence shares (system prompt), for the shared figure.
  int shared_prefix_len = 0;
  /// Token budget of one engine step: sizes the activation buffers.
  int max_num_batched_tokens = 8192;
  /// Sequences per step: sizes the logits buffer.
  int max_num_seqs = 256;
  /// See kDefaultWorkspaceBytes.
  int64_t workspace_bytes = kDefaultWorkspaceBytes;

  /// Checks ranges; errors name the option.
  absl::Status Validate() const;
};

/// Peak activation memory of one step, per GPU (formula in capacity_planner.cc).
struct ActivationEstimate {
  /// f32 elements each batched token needs across the step's live buffers.
  int64_t elements_per_token = 0;
  /// elements_per_token × max_num_batched_tokens × 4.
  int64_t buffer_bytes = 0;
  /// max_num_seqs × vocab × 4.
  int64_t logits_bytes = 0;
  int64_t workspace_bytes = 0;

  int64_t total() const { return buffer_bytes + logits_bytes + workspace_bytes; }
};

/// The KV figures for one KV cache dtype.
struct KvDTypePlan {
  KvCacheDType dtype = KvCacheDType::kBF16;
  /// KV bytes one token occupies on one GPU, all layers.
  int64_t kv_bytes_per_token = 0;
  int64_t bytes_per_block = 0;
  int64_t num_kv_blocks = 0;
  /// num_kv_blocks × block_size.
  int64_t kv_tokens = 0;
  /// Sequences of max_model_len tokens that fit at once, nothing shared.
  int64_t max_concurrent_seqs = 0;
  /// The same with shared_prefix_len tokens of prefix held once.
  int64_t max_concurrent_seqs_shared_prefix = 0;
};

/// A capacity plan: how one GPU's memory splits into weights, activations and KV cache.
struct Plan {
  int tp = 1;
  int max_model_len = 0;
  int block_size = 16;
  int shared_prefix_len = 0;
  /// KV heads each GPU caches (MLA: 1, the shared latent).
  int kv_heads_per_gpu = 0;
  /// True when tp exceeds the KV head count, so several GPUs cache copies of one head.
  bool kv_heads_replicated = false;
  /// Parameters of the whole model (architecture formula).
  int64_t num_params = 0;
  /// True when weight_bytes was measured from tensors rather than parameters × dtype size.
  bool weight_bytes_exact = false;
  /// gpu_memory × utilization.
  int64_t usable_bytes = 0;
  int64_t weight_bytes = 0;
  ActivationEstimate activations;
  /// usable − weights − activations.
  int64_t kv_budget_bytes = 0;
  /// The dtype PlanOptions::kv_dtype chose.
  KvCacheDType kv_dtype = KvCacheDType::kBF16;
  /// One entry per dtype, in kAllKvCacheDTypes order.
  std::vector<KvDTypePlan> by_kv_dtype;

  /// The entry for kv_dtype.
  const KvDTypePlan& chosen() const;
};

/// KV heads one GPU caches under `tp`: kv_heads / tp when tp divides kv_heads, 1 (replicated)
/// when kv_heads divides tp, error otherwise. MLA models cache one latent on every rank: 1.
absl::StatusOr<int> KvHeadsPerGpu(const ModelSpec& spec, int tp);

/// KV bytes one token occupies on one GPU, over all layers. Standard attention:
/// layers × 2 (K and V) × KvHeadsPerGpu × KvBytesPerHeadVector(dtype, head_dim). MLA: one
/// vector of kv_lora_rank + qk_rope_head_dim per layer, the same on every rank.
absl::StatusOr<int64_t> KvBytesPerToken(const ModelSpec& spec, KvCacheDType dtype, int tp);

/// KvBytesPerToken × block_size.
absl::StatusOr<int64_t> KvBytesPerBlock(const ModelSpec& spec, KvCacheDType dtype, int tp,
                                        int block_size);

/// Blocks a per-GPU KV budget holds: floor(kv_budget_bytes / KvBytesPerBlock). The engine sizes
/// its block pool with this from --kv-cache-memory or --gpu-memory-utilization.
absl::StatusOr<int64_t> KvBlocksForBudget(const ModelSpec& spec, KvCacheDType dtype, int tp,
                                          int block_size, int64_t kv_budget_bytes);

/// Weight bytes on one GPU: split weights / tp, replicated whole, vocab-parallel / tp, k/v
/// projections by KvHeadsPerGpu (see ShardedSizes). Requires tp to divide num_heads.
absl::StatusOr<int64_t> WeightBytesPerGpu(const ModelSpec& spec,
                                          std::optional<WeightDType> dtype_override, int tp);

/// Peak activation bytes of one step on one GPU.
absl::StatusOr<ActivationEstimate> EstimateActivations(const ModelSpec& spec,
                                                       const PlanOptions& options);

/// Sequences of `seq_len` tokens that `num_blocks` hold without sharing:
/// num_blocks / ceil(seq_len / block_size).
int64_t MaxConcurrentSeqs(int64_t num_blocks, int64_t seq_len, int64_t block_size);

/// The same when every sequence starts with one shared prefix of `prefix_len` < seq_len tokens
/// whose full blocks (floor(prefix_len / block_size)) are held once:
/// (num_blocks − shared) / (ceil(seq_len / block_size) − shared), 0 if the shared blocks alone
/// do not fit.
int64_t MaxConcurrentSeqsSharedPrefix(int64_t num_blocks, int64_t seq_len, int64_t prefix_len,
                                      int64_t block_size);

/// Plans one GPU's memory. Errors: invalid options, tp incompatible with the heads, a sequence
/// length the model does not know, and (RESOURCE_EXHAUSTED) a budget that cannot hold the
/// weights, or leaves nothing for the KV cache after the activations.
absl::StatusOr<Plan> PlanCapacity(const ModelSpec& spec, const PlanOptions& options);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_CAPACITY_PLANNER_H_
