#ifndef KVSERVE_WORKER_MODEL_MODEL_CONFIG_H_
#define KVSERVE_WORKER_MODEL_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/token.h"

namespace kvserve {

/// Which pairs of a head's dimensions RoPE rotates together.
enum class RopeStyle {
  /// Meta / GGUF `llama` layout: pairs (2i, 2i+1) rotate with frequency i.
  kInterleaved,
  /// Hugging Face `rotate_half` layout (q/k rows permuted at conversion): pairs (i, i + d/2).
  kHalfSplit,
};

/// RoPE frequency scaling (Hugging Face `rope_scaling`).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kYarn };
  Type type = Type::kNone;
  float factor = 1.0f;
  /// llama3 only.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  /// llama3 and yarn.
  int original_max_position_embeddings = 8192;
  /// yarn only (DeepSeek's form): rotations bounding the band that is interpolated between
  /// extrapolated (fast) and interpolated (slow) frequencies, and the attention temperature
  /// terms. The softmax scale is multiplied by YarnMscale(factor, mscale_all_dim)^2; cos and sin
  /// would be multiplied by YarnMscale(factor, mscale) / YarnMscale(factor, mscale_all_dim),
  /// which the loaders require to be 1 (mscale == mscale_all_dim, as every released DeepSeek
  /// model has).
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;
};

/// yarn's attention temperature: 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
float YarnMscale(float scale, float mscale);

/// How a mixture-of-experts router scores and picks experts.
enum class MoeScoring {
  /// Softmax over all router logits (Mixtral, Qwen3-MoE, DeepSeek-V2).
  kSoftmax,
  /// Per-expert sigmoid; selection adds the per-expert correction bias (DeepSeek-V3).
  kSigmoid,
};

/// How the experts a token runs are picked from the scores.
enum class MoeTopk {
  /// The k best scores (ties to the lower expert index).
  kGreedy,
  /// DeepSeek-V2 `group_limited_greedy`: experts form n_group equal groups scored by their best
  /// expert; the k best experts are taken from the topk_group best groups.
  kGroupLimited,
  /// DeepSeek-V3 `noaux_tc`: scores plus the correction bias; groups scored by the sum of their
  /// two best biased scores; the k best biased scores of the topk_group best groups are taken,
  /// and weighted by their unbiased scores.
  kNoAuxTc,
};

/// Architecture hyper-parameters of a Llama-family decoder, whatever file format it came from.
struct ModelConfig {
  /// "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v2" or
  /// "deepseek_v3" (TinyLlama and SmolLM are "llama").
  std::string architecture = "llama";
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  /// Width of one q/k/v head. Llama-family configs derive it as hidden_size / num_heads; Qwen3
  /// states it (`head_dim`, GGUF `<arch>.attention.key_length`) and it may differ. MLA: the
  /// width of one query head, qk_nope_head_dim + qk_rope_head_dim.
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::kInterleaved;
  /// Attention window in tokens (Mistral `sliding_window`); 0 means full attention.
  int sliding_window = 0;
  /// Qwen2 (and Qwen3 with `attention_bias`): q/k/v projections carry a bias.
  bool qkv_bias = false;
  /// Qwen3 with `attention_bias`: the attention output projection carries a bias too.
  bool o_bias = false;
  /// Qwen3: after the q/k projections and before RoPE, every head of q and of k is RMS-normed
  /// with one [head_dim] weight per layer (q_norm, k_norm) shared by all heads.
  bool qk_norm = false;
  /// Mixture of experts (Mixtral, Qwen3-MoE): every layer's MLP is `num_experts` SwiGLU experts
  /// of width moe_intermediate_size behind a linear router; 0 means a dense MLP of width
  /// intermediate_size. Each token runs its num_experts_per_tok best experts (softmax over all
  /// router logits, top-k, ties to the lower expert index) and sums their outputs weighted by
  /// those probabilities, renormalized to sum 1 when norm_topk_prob.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  /// Mixtral always renormalizes; Qwen3-MoE and DeepSeek when their config's `norm_topk_prob`
  /// is true.
  bool norm_topk_prob = true;
  /// DeepSeek routing: scores, selection method, expert groups, and the factor every routed
  /// weight is multiplied by (after the renormalization, if any). DeepSeek-V2 applies
  /// `routed_scaling_factor` only when it does not renormalize; its loader stores 1 otherwise.
  MoeScoring moe_scoring = MoeScoring::kSoftmax;
  MoeTopk moe_topk = MoeTopk::kGreedy;
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling_factor = 1.0f;
  /// DeepSeek: always-active experts, run as one SwiGLU MLP of width n_shared_experts *
  /// moe_intermediate_size whose output is added to the routed experts'.
  int n_shared_experts = 0;
  /// DeepSeek: layers below first_k_dense_replace, and those whose index is not a multiple of
  /// moe_layer_freq, keep a dense MLP of width intermediate_size.
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  /// A pipeline stage's weights (worker/pp/stage_weights.h) hold decoder layers
  /// [layer_offset, layer_offset + num_layers) of the whole model; per-layer rules
  /// (is_moe_layer) take the absolute index. 0 for a whole model.
  int layer_offset = 0;
  /// The whole model's decoder layers when these weights are a pipeline stage's; 0 for a whole
  /// model.
  int total_layers = 0;

  /// Multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 means standard attention.
  /// The cache holds, per token and layer, one row of kv_lora_rank latent values (the
  /// RMS-normed compressed KV) followed by qk_rope_head_dim rotated key values, shared by every
  /// head. Queries are q_lora_rank-compressed (0: projected straight from the hidden state),
  /// heads are qk_nope_head_dim + qk_rope_head_dim wide for q/k and v_head_dim for v.
  int kv_lora_rank = 0;
  int q_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  /// The output projection is the token embedding.
  bool tie_word_embeddings = false;
  TokenId bos_token_id = kNoToken;
  /// Generation stops at any of these (model EOS and generation_config extras).
  std::vector<TokenId> eos_token_ids;

  bool is_moe() const { return num_experts > 0; }
  /// Whether these weights start the model (embed the tokens) and end it (compute the logits):
  /// both for a whole model, one or neither for a pipeline stage.
  bool first_stage() const { return layer_offset == 0; }
  bool last_stage() const { return total_layers == 0 || layer_offset + num_layers == total_layers; }
  bool is_mla() const { return kv_lora_rank > 0; }
  /// Whether decoder layer `layer` has a mixture-of-experts MLP (else a dense one).
  bool is_moe_layer(int layer) const {
    const int absolute = layer + layer_offset;
    return is_moe() && absolute >= first_k_dense_replace && absolute % moe_layer_freq == 0;
  }
  /// Vectors the KV cache holds per token and layer (MLA: 1, the latent row), their width, and
  /// whether there is a separate V buffer (MLA: no, V is the latent part of the row).
  int kv_cache_heads() const { return is_mla() ? 1 : num_kv_heads; }
  int kv_cache_dim() const { return is_mla() ? kv_lora_rank + qk_rope_head_dim : head_dim; }
  bool kv_cache_has_v() const { return !is_mla(); }
  /// Elements of a head that RoPE rotates (the last ones of the head): head_dim, MLA the rope
  /// part.
  int rotary_dim() const { return is_mla() ? qk_rope_head_dim : head_dim; }
  /// The attention softmax scale: 1 / sqrt(head_dim), times yarn's mscale^2 when it has one.
  float attention_scale() const;

  /// Checks the numbers are positive and consistent (heads divide, head_dim even, ...).
  absl::Status Validate() const;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_MODEL_CONFIG_H_
