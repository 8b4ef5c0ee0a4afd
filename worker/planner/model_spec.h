#ifndef KVSERVE_WORKER_PLANNER_MODEL_SPEC_H_
#define KVSERVE_WORKER_PLANNER_MODEL_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/planner/pipeline_layout.h"

namespace kvserve {

/// Storage type assumed for model weights when the source has no tensors to measure (or when the
/// caller overrides it).
enum class WeightDType { kF32, kF16, kBF16, kInt8, kFp8, kInt4 };

/// Parses "f32", "f16", "bf16", "int8", "fp8" or "int4" (also "float32", "float16", "bfloat16").
absl::StatusOr<WeightDType> ParseWeightDType(std::string_view name);

/// The canonical short name ("f32", ..., "int4").
std::string_view WeightDTypeName(WeightDType dtype);

/// int4 weights carry one f16 scale per group of this many consecutive weights.
inline constexpr int64_t kInt4GroupSize = 128;

/// Bytes of `params` weights stored as `dtype`: f32 4, f16/bf16 2, int8/fp8 1 (their per-channel
/// or per-tensor scales are under 0.1% and left out), int4 half a byte plus a 2-byte f16 scale
/// per group of kInt4GroupSize weights (≈ 0.516 bytes per weight, as GPTQ/AWQ with group 128).
int64_t WeightBytesForParams(WeightDType dtype, int64_t params);

/// An amount (parameters or bytes) split by how tensor parallelism lays it out across ranks.
struct ShardedAmounts {
  /// Matmul weights divided evenly between ranks: q/o projections, MLP and expert matrices
  /// (column- or row-parallel), MLA's up-projections.
  int64_t split = 0;
  /// Held whole on every rank: norms, MoE routers, MLA's down-projections (q_a, kv_a).
  int64_t replicated = 0;
  /// Token embedding and output head: rows split by vocabulary (ceil(vocab / tp) per rank).
  int64_t vocab_parallel = 0;
  /// k/v projections: split by KV head, replicated when tp exceeds the KV head count.
  int64_t kv_heads = 0;

  int64_t total() const { return split + replicated + vocab_parallel + kv_heads; }
  /// Adds `other` kind by kind.
  ShardedAmounts& operator+=(const ShardedAmounts& other);
};

/// A whole model's ShardedAmounts (the inherited fields are the totals), and where they sit when
/// that is known: pipeline parallelism gives each stage the part of its own decoder layers, the
/// token embedding to the first stage and the final norm and output head to the last (see
/// StageWeightBytes). CountParameters fills the parts, and so does AddShardedBytes from tensor
/// names; a spec built from totals alone has none (`layers` empty).
struct ShardedSizes : ShardedAmounts {
  /// layers[i]: decoder layer i.
  std::vector<ShardedAmounts> layers;
  /// The token embedding.
  ShardedAmounts embedding;
  /// The final norm and the output head (no head when it is tied to the embedding).
  ShardedAmounts output;
  /// Other weights outside the decoder layers, which every stage holds (GGUF rope_freqs).
  ShardedAmounts other;

  bool has_placement() const { return !layers.empty(); }
};

/// Mixture-of-experts shape. num_routed_experts == 0 means a dense model.
struct MoeSpec {
  int num_routed_experts = 0;
  /// Always-active experts (DeepSeek `n_shared_experts`); 0 for Mixtral.
  int num_shared_experts = 0;
  /// Hidden width of one expert (Mixtral: `intermediate_size`).
  int moe_intermediate_size = 0;
  int num_experts_per_tok = 0;
  /// The first k layers keep a dense MLP (DeepSeek `first_k_dense_replace`).
  int first_k_dense_replace = 0;
  /// Of the remaining layers, every n-th is MoE (DeepSeek `moe_layer_freq`).
  int moe_layer_freq = 1;
  /// DeepSeek-V3's router carries a per-expert score-correction bias.
  bool router_bias = false;
};

/// Multi-head latent attention (DeepSeek-V2/V3). kv_lora_rank == 0 means standard attention.
struct MlaSpec {
  int kv_lora_rank = 0;
  /// 0 means q is projected directly from the hidden state (DeepSeek-V2-Lite).
  int q_lora_rank = 0;
  int qk_rope_head_dim = 0;
  int qk_nope_head_dim = 0;
  int v_head_dim = 0;
};

/// What the capacity planner needs to know about a model, whatever file it was read from.
struct ModelSpec {
  /// Hugging Face model_type ("llama", "mistral", "qwen2", "qwen3", "mixtral", "deepseek_v2",
  /// ...).
  std::string model_type;
  /// Where the spec came from (a directory, config.json or GGUF path), for messages.
  std::string source;
  /// True when model_type was not one the planner knows and the llama formula was assumed.
  bool assumed_llama_like = false;

  int num_layers = 0;
  int hidden_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  /// Per-head width of q and k (MLA: qk_nope_head_dim + qk_rope_head_dim).
  int head_dim = 0;
  /// Dense MLP hidden width.
  int intermediate_size = 0;
  int vocab_size = 0;
  bool tie_word_embeddings = false;
  /// q/k/v projections carry a bias (Qwen2, or Llama `attention_bias`).
  bool qkv_bias = false;
  /// The o projection carries a bias too (Llama and Qwen3 `attention_bias`).
  bool o_bias = false;
  /// Per-head q/k RMSNorm weights, head_dim each per layer (Qwen3).
  bool qk_norm = false;
  /// 0 when the source does not say.
  int max_position_embeddings = 0;
  /// Attention window in tokens; 0 means full attention.
  int sliding_window = 0;

  MoeSpec moe;
  MlaSpec mla;

  /// The checkpoint's declared dtype (config.json `torch_dtype`), if any.
  std::optional<WeightDType> checkpoint_dtype;
  /// Exact weight bytes by sharding kind, when the source has tensors (safetensors headers or
  /// GGUF tensor infos). Absent for a bare config.json.
  std::optional<ShardedSizes> tensor_bytes;

  bool IsMla() const { return mla.kv_lora_rank > 0; }
  bool IsMoe() const { return moe.num_routed_experts > 0; }
  /// Whether decoder layer `layer` (0-based) has an MoE block rather than a dense MLP.
  bool IsMoeLayer(int layer) const;
  /// Number of layers with an MoE block.
  int NumMoeLayers() const;

  /// Checks that the numbers are positive and consistent; errors name the source and field.
  absl::Status Validate() const;
};

/// Parameter count by sharding kind, from the architecture alone (formulas in model_spec.cc),
/// with the part of every decoder layer, the embedding and the output end.
ShardedSizes CountParameters(const ModelSpec& spec);

/// Weight bytes by sharding kind: the exact tensor bytes when the spec has them and no dtype is
/// forced; otherwise parameters × bytes of `dtype_override`, else of the checkpoint dtype,
/// else bf16 (each part converted on its own, so with int4 the parts' group rounding can add a
/// few bytes over the totals).
ShardedSizes ModelWeightBytes(const ModelSpec& spec, std::optional<WeightDType> dtype_override);

/// Weight bytes by sharding kind that the pipeline stage holding `stage`'s decoder layers
/// stores: those layers, plus the token embedding on the first stage (stage.first == 0), the
/// final norm and output head on the last (stage.end() == num_layers) — a tied embedding on both
/// the first and the last stage when they differ — and the weights every stage needs. A stage of
/// every layer gets ModelWeightBytes' totals. When the exact tensor bytes have no placement
/// (StageWeightBytesExact is false), a partial stage is counted from the parameters instead.
ShardedAmounts StageWeightBytes(const ModelSpec& spec, std::optional<WeightDType> dtype_override,
                                StageLayers stage);

/// Whether StageWeightBytes measures `stage` from the tensors rather than from parameters × dtype.
bool StageWeightBytesExact(const ModelSpec& spec, std::optional<WeightDType> dtype_override,
                           StageLayers stage);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_MODEL_SPEC_H_
