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
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  /// llama3 only.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

/// Architecture hyper-parameters of a Llama-family decoder, whatever file format it came from.
struct ModelConfig {
  /// "llama", "mistral", "qwen2", "qwen3", "mixtral" or "qwen3_moe" (TinyLlama and SmolLM are
  /// "llama").
  std::string architecture = "llama";
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  /// Width of one q/k/v head. Llama-family configs derive it as hidden_size / num_heads; Qwen3
  /// states it (`head_dim`, GGUF `<arch>.attention.key_length`) and it may differ.
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
  /// Mixtral always renormalizes; Qwen3-MoE when its config's `norm_topk_prob` is true.
  bool norm_topk_prob = true;
  /// The output projection is the token embedding.
  bool tie_word_embeddings = false;
  TokenId bos_token_id = kNoToken;
  /// Generation stops at any of these (model EOS and generation_config extras).
  std::vector<TokenId> eos_token_ids;

  bool is_moe() const { return num_experts > 0; }

  /// Checks the numbers are positive and consistent (heads divide, head_dim even, ...).
  absl::Status Validate() const;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_MODEL_CONFIG_H_
