#include "worker/planner/capacity_planner.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/planner/byte_size.h"

namespace kvserve {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one f32 element (the residual stream, router logits, hand-over buffers, logits).
constexpr int64_t kF32Bytes = 4;

absl::Status CheckTp(const ModelSpec& spec, int tp) {
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("tp must be >= 1 (got ", tp, ")"));
  if (spec.num_heads % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.source, ": tp ", tp, " does not divide num_attention_heads (",
                     spec.num_heads, "): attention heads cannot be split evenly"));
  }
  return KvHeadsPerGpu(spec, tp).status();
}

StageLayers WholeModel(const ModelSpec& spec) { return {0, spec.num_layers}; }

bool IsLastStage(const ModelSpec& spec, StageLayers stage) {
  return stage.end() >= spec.num_layers;
}

}  // namespace

absl::Status PlanOptions::Validate() const {
  auto bad = [](absl::string_view option, auto value, absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, " must be ", rule, " (got ", value, ")"));
  };
  if (gpu_memory_bytes <= 0) return bad("gpu_memory", gpu_memory_bytes, "positive");
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    return bad("gpu_memory_utilization", gpu_memory_utilization, "in (0, 1]");
  }
  if (tp < 1) return bad("tp", tp, ">= 1");
  if (pp < 1) return bad("pp", pp, ">= 1");
  if (max_model_len < 0) return bad("max_model_len", max_model_len, ">= 0");
  if (block_size < 1) return bad("block_size", block_size, ">= 1");
  if (shared_prefix_len < 0) return bad("shared_prefix_len", shared_prefix_len, ">= 0");
  if (max_num_batched_tokens < 1) {
    return bad("max_num_batched_tokens", max_num_batched_tokens, ">= 1");
  }
  if (max_num_seqs < 1) return bad("max_num_seqs", max_num_seqs, ">= 1");
  if (workspace_bytes < 0) return bad("workspace_bytes", workspace_bytes, ">= 0");
  if (activation_bytes != 2 && activation_bytes != 4) {
    return bad("activation_bytes", activation_bytes, "2 (bf16) or 4 (f32)");
  }
  return absl::OkStatus();
}

const KvDTypePlan& Plan::chosen() const {
  for (const KvDTypePlan& entry : by_kv_dtype) {
    if (entry.dtype == kv_dtype) return entry;
  }
  return by_kv_dtype.front();
}

const KvDTypePlan& Plan::chosen(const StagePlan& stage) const {
  for (const KvDTypePlan& entry : stage.by_kv_dtype) {
    if (entry.dtype == kv_dtype) return entry;
  }
  return stage.by_kv_dtype.front();
}

absl::StatusOr<int> KvHeadsPerGpu(const ModelSpec& spec, int tp) {
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("tp must be >= 1 (got ", tp, ")"));
  if (spec.IsMla()) return 1;
  const int kv = spec.num_kv_heads;
  if (kv <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.source, ": num_key_value_heads must be positive"));
  }
  if (kv % tp == 0) return kv / tp;
  if (tp % kv == 0) return 1;
  return absl::InvalidArgumentError(absl::StrCat(spec.source, ": tp ", tp,
                                                 " must divide num_key_value_heads (", kv,
                                                 ") or be a multiple of it"));
}

absl::StatusOr<int64_t> KvBytesPerTokenPerLayer(const ModelSpec& spec, KvCacheDType dtype, int tp) {
  absl::StatusOr<int> heads = KvHeadsPerGpu(spec, tp);
  if (!heads.ok()) return heads.status();
  if (spec.IsMla()) {
    return KvBytesPerHeadVector(dtype, spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim);
  }
  return 2 * int64_t{*heads} * KvBytesPerHeadVector(dtype, spec.head_dim);
}

absl::StatusOr<int64_t> KvBytesPerToken(const ModelSpec& spec, KvCacheDType dtype, int tp) {
  absl::StatusOr<int64_t> per_layer = KvBytesPerTokenPerLayer(spec, dtype, tp);
  if (!per_layer.ok()) return per_layer.status();
  return int64_t{spec.num_layers} * *per_layer;
}

absl::StatusOr<int64_t> KvBytesPerBlock(const ModelSpec& spec, KvCacheDType dtype, int tp,
                                        int block_size) {
  if (block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be >= 1 (got ", block_size, ")"));
  }
  absl::StatusOr<int64_t> per_token = KvBytesPerToken(spec, dtype, tp);
  if (!per_token.ok()) return per_token.status();
  return *per_token * block_size;
}

absl::StatusOr<int64_t> KvBlocksForBudget(const ModelSpec& spec, KvCacheDType dtype, int tp,
                                          int block_size, int64_t kv_budget_bytes) {
  if (kv_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV budget must not be negative (got ", kv_budget_bytes, " bytes)"));
  }
  absl::StatusOr<int64_t> per_block = KvBytesPerBlock(spec, dtype, tp, block_size);
  if (!per_block.ok()) return per_block.status();
  return kv_budget_bytes / *per_block;
}

absl::StatusOr<int64_t> WeightBytesPerGpu(const ModelSpec& spec,
                                          std::optional<WeightDType> dtype_override, int tp) {
  return StageWeightBytesPerGpu(spec, dtype_override, tp, WholeModel(spec));
}

absl::StatusOr<int64_t> StageWeightBytesPerGpu(const ModelSpec& spec,
                                               std::optional<WeightDType> dtype_override, int tp,
                                               StageLayers stage) {
  if (absl::Status s = CheckTp(spec, tp); !s.ok()) return s;
  const ShardedAmounts bytes = StageWeightBytes(spec, dtype_override, stage);
  int64_t per_gpu = CeilDiv(bytes.split, tp) + bytes.replicated + CeilDiv(bytes.vocab_parallel, tp);
  if (bytes.kv_heads > 0) {
    // k/v projections: each rank holds the rows of the heads it caches.
    const int heads = *KvHeadsPerGpu(spec, tp);
    per_gpu += CeilDiv(bytes.kv_heads * heads, spec.num_kv_heads);
  }
  return per_gpu;
}

absl::StatusOr<ActivationEstimate> EstimateActivations(const ModelSpec& spec,
                                                       const PlanOptions& options) {
  return EstimateStageActivations(spec, options, WholeModel(spec));
}

// Activation peak of one step, per GPU. With T = max_num_batched_tokens, H = hidden, the
// buffers live at the same time in one layer are, in elements per token:
//   residual H (f32) + normed H
//   standard attention: q (nh/tp)·d, k and v kv_heads_per_gpu·d each, attn_out (nh/tp)·d
//   MLA: q and expanded k (nh/tp)·(nope + rope) each, v and attn_out (nh/tp)·v_head each,
//        the compressed latent kv_lora + rope and, with a q LoRA, its q_lora latent
//   MLP, the larger of the layer kinds present in the stage:
//        dense  gate + up 2·ceil(I/tp)
//        MoE    router logits E (f32) + gate + up for the top-k routed and the shared experts of
//               each token, 2·(top_k + shared)·ceil(Ie/tp)
// buffers = (f32 elements × 4 + the others × activation_bytes) × T bytes (the CUDA backend keeps
// activations between ops in bf16, docs/gpu.md "Activations in bf16"); logits = max_num_seqs ×
// vocab × 4 (the full vocabulary, as
// gathered for sampling) on the last pipeline stage, the only one that computes them; every other
// stage instead keeps two T × H f32 hidden-state buffers, so that the send of one step's output
// to the next stage (and the receive of the next input) can be in flight while it computes; the
// last stage receives into its residual buffer. Plus the fixed workspace_bytes.
absl::StatusOr<ActivationEstimate> EstimateStageActivations(const ModelSpec& spec,
                                                            const PlanOptions& options,
                                                            StageLayers stage) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (absl::Status s = CheckTp(spec, options.tp); !s.ok()) return s;
  const int64_t tp = options.tp;
  const int64_t heads = spec.num_heads / tp;
  int64_t elements = 2 * int64_t{spec.hidden_size};
  if (spec.IsMla()) {
    const MlaSpec& m = spec.mla;
    elements += 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim);
    elements += 2 * heads * m.v_head_dim;
    elements += m.kv_lora_rank + m.qk_rope_head_dim + m.q_lora_rank;
  } else {
    const int64_t kv_heads = *KvHeadsPerGpu(spec, options.tp);
    elements += 2 * heads * spec.head_dim + 2 * kv_heads * spec.head_dim;
  }
  int64_t f32_elements = spec.hidden_size;  // the residual stream
  int64_t mlp = 0;
  int64_t mlp_f32 = 0;
  int moe_layers = 0;
  for (int layer = stage.first; layer < stage.end(); ++layer) {
    moe_layers += spec.IsMoeLayer(layer) ? 1 : 0;
  }
  if (moe_layers < stage.count) mlp = 2 * CeilDiv(spec.intermediate_size, tp);
  if (moe_layers > 0) {
    const MoeSpec& moe = spec.moe;
    const int64_t moe_mlp =
        moe.num_routed_experts + 2 * int64_t{moe.num_experts_per_tok + moe.num_shared_experts} *
                                     CeilDiv(moe.moe_intermediate_size, tp);
    if (moe_mlp > mlp) {
      mlp = moe_mlp;
      mlp_f32 = moe.num_routed_experts;
    }
  }
  elements += mlp;
  f32_elements += mlp_f32;

  ActivationEstimate estimate;
  estimate.elements_per_token = elements;
  estimate.f32_elements_per_token = f32_elements;
  estimate.buffer_bytes =
      (f32_elements * kF32Bytes + (elements - f32_elements) * options.activation_bytes) *
      options.max_num_batched_tokens;
  if (IsLastStage(spec, stage)) {
    estimate.logits_bytes = int64_t{options.max_num_seqs} * spec.vocab_size * kF32Bytes;
  } else {
    estimate.pipeline_bytes =
        2 * int64_t{options.max_num_batched_tokens} * spec.hidden_size * kF32Bytes;
  }
  estimate.workspace_bytes = options.workspace_bytes;
  return estimate;
}

int64_t MaxConcurrentSeqs(int64_t num_blocks, int64_t seq_len, int64_t block_size) {
  if (num_blocks <= 0 || seq_len <= 0 || block_size <= 0) return 0;
  return num_blocks / CeilDiv(seq_len, block_size);
}

int64_t MaxConcurrentSeqsSharedPrefix(int64_t num_blocks, int64_t seq_len, int64_t prefix_len,
                                      int64_t block_size) {
  if (num_blocks <= 0 || seq_len <= 0 || block_size <= 0) return 0;
  const int64_t shared = std::clamp<int64_t>(prefix_len, 0, seq_len - 1) / block_size;
  if (num_blocks < shared) return 0;
  return (num_blocks - shared) / (CeilDiv(seq_len, block_size) - shared);
}

namespace {

// "stage 1 (layers 31-60)".
std::string StageName(int index, StageLayers layers) {
  return absl::StrCat("stage ", index, " (layers ", layers.first, "-", layers.end() - 1, ")");
}

// Sets the figures of `entry` that follow from its num_kv_blocks.
void FillBlockFigures(const Plan& plan, KvDTypePlan& entry) {
  entry.kv_tokens = entry.num_kv_blocks * plan.block_size;
  entry.max_concurrent_seqs =
      MaxConcurrentSeqs(entry.num_kv_blocks, plan.max_model_len, plan.block_size);
  entry.max_concurrent_seqs_shared_prefix = MaxConcurrentSeqsSharedPrefix(
      entry.num_kv_blocks, plan.max_model_len, plan.shared_prefix_len, plan.block_size);
}

// The figures of one GPU of stage `index`, which holds `layers`. `plan` has the usable bytes and
// the sequence figures filled in.
absl::StatusOr<StagePlan> PlanStage(const ModelSpec& spec, const PlanOptions& options,
                                    const Plan& plan, int index, StageLayers layers) {
  StagePlan stage;
  stage.layers = layers;
  absl::StatusOr<int64_t> weights =
      StageWeightBytesPerGpu(spec, options.weight_dtype, options.tp, layers);
  if (!weights.ok()) return weights.status();
  stage.weight_bytes = *weights;
  absl::StatusOr<ActivationEstimate> activations = EstimateStageActivations(spec, options, layers);
  if (!activations.ok()) return activations.status();
  stage.activations = *activations;

  const std::string budget_text =
      absl::StrCat(FormatBytes(plan.usable_bytes), " (", FormatBytes(options.gpu_memory_bytes),
                   " x ", options.gpu_memory_utilization, ")");
  // With pp 1 the messages name no stage.
  const std::string where = options.pp > 1 ? absl::StrCat(StageName(index, layers), " of pp ",
                                                          options.pp, " x tp ", options.tp)
                                           : absl::StrCat("tp ", options.tp);
  const std::string what = options.pp > 1 ? absl::StrCat(StageName(index, layers), ": ") : "";
  if (stage.weight_bytes > plan.usable_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        spec.source, ": the weights need ", FormatBytes(stage.weight_bytes), " per GPU at ", where,
        " but only ", budget_text, " is usable; raise --tp", options.pp > 1 ? " / --pp" : "",
        " or --gpu-memory, or pick a smaller --weight-dtype"));
  }
  stage.kv_budget_bytes = plan.usable_bytes - stage.weight_bytes - stage.activations.total();
  if (stage.kv_budget_bytes <= 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        spec.source, ": ", what, "no memory left for the KV cache: weights ",
        FormatBytes(stage.weight_bytes), " + activations ", FormatBytes(stage.activations.total()),
        " per GPU exceed ", budget_text, "; lower --max-num-batched-tokens or raise --tp",
        options.pp > 1 ? " / --pp" : "", " / --gpu-memory"));
  }

  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    KvDTypePlan entry;
    entry.dtype = dtype;
    entry.kv_bytes_per_token =
        int64_t{layers.count} * *KvBytesPerTokenPerLayer(spec, dtype, options.tp);
    entry.bytes_per_block = entry.kv_bytes_per_token * options.block_size;
    entry.num_kv_blocks = stage.kv_budget_bytes / entry.bytes_per_block;
    FillBlockFigures(plan, entry);
    stage.by_kv_dtype.push_back(entry);
  }
  return stage;
}

}  // namespace

absl::StatusOr<Plan> PlanCapacity(const ModelSpec& spec, const PlanOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  if (absl::Status s = CheckTp(spec, options.tp); !s.ok()) return s;

  absl::StatusOr<std::vector<StageLayers>> layers =
      SplitLayers(spec.num_layers, options.pp, options.pp_layers);
  if (!layers.ok()) return layers.status();

  Plan plan;
  plan.tp = options.tp;
  plan.block_size = options.block_size;
  plan.shared_prefix_len = options.shared_prefix_len;
  plan.kv_dtype = options.kv_dtype;
  plan.max_model_len =
      options.max_model_len > 0 ? options.max_model_len : spec.max_position_embeddings;
  if (plan.max_model_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.source, ": the model does not state max_position_embeddings; give max_model_len"));
  }
  if (options.shared_prefix_len >= plan.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("shared_prefix_len (", options.shared_prefix_len,
                                                   ") must be smaller than max_model_len (",
                                                   plan.max_model_len, ")"));
  }
  plan.kv_heads_per_gpu = *KvHeadsPerGpu(spec, options.tp);
  plan.kv_heads_replicated = !spec.IsMla() && options.tp > spec.num_kv_heads;
  plan.num_params = CountParameters(spec).total();
  plan.pp = options.pp;

  // The small epsilon keeps e.g. 80 GiB × 0.9 from flooring one byte low.
  plan.usable_bytes = static_cast<int64_t>(std::floor(
      static_cast<long double>(options.gpu_memory_bytes) * options.gpu_memory_utilization + 1e-3L));
  plan.weight_bytes_exact = true;
  for (size_t s = 0; s < layers->size(); ++s) {
    plan.weight_bytes_exact &= StageWeightBytesExact(spec, options.weight_dtype, (*layers)[s]);
    absl::StatusOr<StagePlan> stage =
        PlanStage(spec, options, plan, static_cast<int>(s), (*layers)[s]);
    if (!stage.ok()) return stage.status();
    plan.stages.push_back(*std::move(stage));
  }

  // The group's figures: the worst stage for each.
  const StagePlan* most_weights = &plan.stages.front();
  const StagePlan* most_activations = &plan.stages.front();
  const StagePlan* least_kv_budget = &plan.stages.front();
  for (const StagePlan& stage : plan.stages) {
    if (stage.weight_bytes > most_weights->weight_bytes) most_weights = &stage;
    if (stage.activations.total() > most_activations->activations.total()) {
      most_activations = &stage;
    }
    if (stage.kv_budget_bytes < least_kv_budget->kv_budget_bytes) least_kv_budget = &stage;
  }
  plan.weight_bytes = most_weights->weight_bytes;
  plan.activations = most_activations->activations;
  plan.kv_budget_bytes = least_kv_budget->kv_budget_bytes;
  for (size_t d = 0; d < kAllKvCacheDTypes.size(); ++d) {
    KvDTypePlan group = plan.stages.front().by_kv_dtype[d];
    for (size_t s = 1; s < plan.stages.size(); ++s) {
      const KvDTypePlan& stage = plan.stages[s].by_kv_dtype[d];
      group.kv_bytes_per_token = std::max(group.kv_bytes_per_token, stage.kv_bytes_per_token);
      group.bytes_per_block = std::max(group.bytes_per_block, stage.bytes_per_block);
      if (stage.num_kv_blocks < group.num_kv_blocks) {
        group.num_kv_blocks = stage.num_kv_blocks;
        group.limiting_stage = static_cast<int>(s);
      }
    }
    FillBlockFigures(plan, group);
    plan.by_kv_dtype.push_back(group);
  }
  return plan;
}

}  // namespace kvserve
