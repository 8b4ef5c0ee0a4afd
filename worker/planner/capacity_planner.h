#ifndef KVSERVE_WORKER_PLANNER_CAPACITY_PLANNER_H_
#define KVSERVE_WORKER_PLANNER_CAPACITY_PLANNER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/planner/kv_dtype.h"
#include "worker/planner/model_spec.h"
#include "worker/planner/pipeline_layout.h"

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
  /// Tensor-parallel degree: GPUs each pipeline stage shards its layers over.
  int tp = 1;
  /// Pipeline-parallel degree: stages, each holding a contiguous slice of the decoder layers on
  /// its own tp GPUs (pp × tp GPUs in all).
  int pp = 1;
  /// Decoder layers of each stage (--pp-layers); empty splits them as evenly as possible, the
  /// earlier stages taking the extra ones (see SplitLayers).
  std::vector<int> pp_layers;
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
  /// Bytes of an activation element between ops: 2 (bf16, the CUDA backend's default) or 4 (f32:
  /// KVSERVE_CUDA_F32_ACTIVATIONS=1, and the CPU backend). The residual stream, the router logits,
  /// the pipeline hand-over buffers and the logits are f32 either way.
  int activation_bytes = 2;
  /// Sequences per step: sizes the logits buffer.
  int max_num_seqs = 256;
  /// See kDefaultWorkspaceBytes.
  int64_t workspace_bytes = kDefaultWorkspaceBytes;

  /// Checks ranges; errors name the option.
  absl::Status Validate() const;
};

/// Peak activation memory of one step, per GPU (formula in capacity_planner.cc).
struct ActivationEstimate {
  /// Elements each batched token needs across the step's live buffers.
  int64_t elements_per_token = 0;
  /// Of those, the ones kept in f32 whatever the activation dtype (the residual stream; MoE's
  /// router logits).
  int64_t f32_elements_per_token = 0;
  /// (f32_elements_per_token × 4 + the others × activation_bytes) × max_num_batched_tokens.
  int64_t buffer_bytes = 0;
  /// max_num_seqs × vocab × 4, on the stage that computes the logits (the last).
  int64_t logits_bytes = 0;
  /// Hidden-state send/receive buffers of a pipeline stage that hands its output to the next:
  /// 2 × max_num_batched_tokens × hidden × 4. 0 on the last stage (and so with pp 1).
  int64_t pipeline_bytes = 0;
  int64_t workspace_bytes = 0;

  int64_t total() const { return buffer_bytes + logits_bytes + pipeline_bytes + workspace_bytes; }
};

/// The KV figures for one KV cache dtype.
struct KvDTypePlan {
  KvCacheDType dtype = KvCacheDType::kBF16;
  /// KV bytes one token occupies on one GPU, over the layers that GPU holds (a group's figure:
  /// that of the stage with the most layers).
  int64_t kv_bytes_per_token = 0;
  int64_t bytes_per_block = 0;
  int64_t num_kv_blocks = 0;
  /// num_kv_blocks × block_size.
  int64_t kv_tokens = 0;
  /// Sequences of max_model_len tokens that fit at once, nothing shared.
  int64_t max_concurrent_seqs = 0;
  /// The same with shared_prefix_len tokens of prefix held once.
  int64_t max_concurrent_seqs_shared_prefix = 0;
  /// In a group's figures: the pipeline stage with the fewest KV blocks, which sets
  /// num_kv_blocks (the first of equals; 0 with pp 1).
  int limiting_stage = 0;
};

/// One pipeline stage of a plan: the figures of each of its tp GPUs.
struct StagePlan {
  /// The decoder layers the stage holds.
  StageLayers layers;
  int64_t weight_bytes = 0;
  ActivationEstimate activations;
  /// usable − weights − activations.
  int64_t kv_budget_bytes = 0;
  /// One entry per dtype, in kAllKvCacheDTypes order: the stage's own KV bytes per token and the
  /// blocks its budget holds.
  std::vector<KvDTypePlan> by_kv_dtype;
};

/// A capacity plan: how one GPU's memory splits into weights, activations and KV cache.
///
/// With pipeline parallelism every stage holds the KV of the same block ids for its own layers,
/// so the group holds as many blocks as its smallest stage: by_kv_dtype[i].num_kv_blocks is the
/// minimum over stages and limiting_stage says which. The per-GPU figures outside `stages` are
/// then the worst over the stages: the most weights, the largest activation peak, the smallest
/// KV budget, the most KV bytes per token (the stage with the most layers). With pp 1 they are
/// the one stage's.
struct Plan {
  int tp = 1;
  int pp = 1;
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
  /// One entry per dtype, in kAllKvCacheDTypes order: the group's figures.
  std::vector<KvDTypePlan> by_kv_dtype;
  /// One entry per pipeline stage, in order (one with pp 1).
  std::vector<StagePlan> stages;

  /// The entry for kv_dtype.
  const KvDTypePlan& chosen() const;
  /// The entry of `stage` for kv_dtype.
  const KvDTypePlan& chosen(const StagePlan& stage) const;
};

/// KV heads one GPU caches under `tp`: kv_heads / tp when tp divides kv_heads, 1 (replicated)
/// when kv_heads divides tp, error otherwise. MLA models cache one latent on every rank: 1.
absl::StatusOr<int> KvHeadsPerGpu(const ModelSpec& spec, int tp);

/// KV bytes one token occupies on one GPU in one decoder layer. Standard attention:
/// 2 (K and V) × KvHeadsPerGpu × KvBytesPerHeadVector(dtype, head_dim). MLA: one vector of
/// kv_lora_rank + qk_rope_head_dim, the same on every rank.
absl::StatusOr<int64_t> KvBytesPerTokenPerLayer(const ModelSpec& spec, KvCacheDType dtype, int tp);

/// KV bytes one token occupies on one GPU, over all layers: layers × KvBytesPerTokenPerLayer.
/// (A pipeline stage holds its own layers' share: its layer count × KvBytesPerTokenPerLayer.)
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

/// The same for one GPU of the pipeline stage holding `stage` (see StageWeightBytes): its
/// layers, and the embedding / output end on the first / last stage, sharded tp ways.
absl::StatusOr<int64_t> StageWeightBytesPerGpu(const ModelSpec& spec,
                                               std::optional<WeightDType> dtype_override, int tp,
                                               StageLayers stage);

/// Peak activation bytes of one step on one GPU, for one stage holding every layer (pp 1;
/// options.pp is not looked at).
absl::StatusOr<ActivationEstimate> EstimateActivations(const ModelSpec& spec,
                                                       const PlanOptions& options);

/// The same for one GPU of the pipeline stage holding `stage`: the MLP buffers of the layer kinds
/// (dense, MoE) in that stage, the logits on the last stage and the hidden-state send/receive
/// buffers on the others.
absl::StatusOr<ActivationEstimate> EstimateStageActivations(const ModelSpec& spec,
                                                            const PlanOptions& options,
                                                            StageLayers stage);

/// Sequences of `seq_len` tokens that `num_blocks` hold without sharing:
/// num_blocks / ceil(seq_len / block_size).
int64_t MaxConcurrentSeqs(int64_t num_blocks, int64_t seq_len, int64_t block_size);

/// The same when every sequence starts with one shared prefix of `prefix_len` < seq_len tokens
/// whose full blocks (floor(prefix_len / block_size)) are held once:
/// (num_blocks − shared) / (ceil(seq_len / block_size) − shared), 0 if the shared blocks alone
/// do not fit.
int64_t MaxConcurrentSeqsSharedPrefix(int64_t num_blocks, int64_t seq_len, int64_t prefix_len,
                                      int64_t block_size);

/// Plans one GPU's memory, for each pipeline stage when options.pp > 1. Errors: invalid options,
/// tp incompatible with the heads, a layer split SplitLayers refuses, a sequence length the model
/// does not know, and (RESOURCE_EXHAUSTED, naming the stage) a budget that cannot hold a stage's
/// weights, or leaves it nothing for the KV cache after the activations.
absl::StatusOr<Plan> PlanCapacity(const ModelSpec& spec, const PlanOptions& options);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_CAPACITY_PLANNER_H_
