#include "worker/model/model_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {

float YarnMscale(float scale, float mscale) {
  if (scale <= 1.0f) return 1.0f;
  return static_cast<float>(0.1 * mscale * std::log(static_cast<double>(scale)) + 1.0);
}

float ModelConfig::attention_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (rope_scaling.type == RopeScaling::Type::kYarn && rope_scaling.mscale_all_dim != 0.0f) {
    const double m = YarnMscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

namespace {

absl::Status ValidateMla(const ModelConfig& c) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  for (auto [name, v] :
       {std::pair{"qk_nope_head_dim", c.qk_nope_head_dim},
        std::pair{"qk_rope_head_dim", c.qk_rope_head_dim}, std::pair{"v_head_dim", c.v_head_dim}}) {
    if (v <= 0) return bad(name, " must be positive for MLA (kv_lora_rank > 0), got ", v);
  }
  if (c.q_lora_rank < 0) return bad("q_lora_rank must be >= 0, got ", c.q_lora_rank);
  if (c.qk_rope_head_dim % 2 != 0) {
    return bad("qk_rope_head_dim ", c.qk_rope_head_dim, " must be even (RoPE rotates pairs)");
  }
  if (c.head_dim != c.qk_nope_head_dim + c.qk_rope_head_dim) {
    return bad("MLA head_dim ", c.head_dim, " must be qk_nope_head_dim + qk_rope_head_dim = ",
               c.qk_nope_head_dim + c.qk_rope_head_dim);
  }
  if (c.sliding_window != 0) return bad("MLA models take no sliding_window");
  return absl::OkStatus();
}

absl::Status ValidateRouting(const ModelConfig& c) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (c.n_group < 1 || c.num_experts % c.n_group != 0) {
    return bad("n_group ", c.n_group, " must divide the ", c.num_experts, " routed experts");
  }
  if (c.topk_group < 1 || c.topk_group > c.n_group) {
    return bad("topk_group ", c.topk_group, " must be in [1, n_group ", c.n_group, "]");
  }
  const int per_group = c.num_experts / c.n_group;
  if (c.moe_topk != MoeTopk::kGreedy && c.num_experts_per_tok > c.topk_group * per_group) {
    return bad("num_experts_per_tok ", c.num_experts_per_tok, " exceeds the ",
               c.topk_group * per_group, " experts of the topk_group ", c.topk_group,
               " groups a token may use");
  }
  if (c.moe_topk == MoeTopk::kNoAuxTc && per_group < 2) {
    return bad("noaux_tc routing scores a group by its two best experts: each of the n_group ",
               c.n_group, " groups needs at least 2 experts, has ", per_group);
  }
  if (!(c.routed_scaling_factor > 0.0f)) {
    return bad("routed_scaling_factor must be positive, got ", c.routed_scaling_factor);
  }
  if (c.n_shared_experts < 0) return bad("n_shared_experts must be >= 0, got ", c.n_shared_experts);
  if (c.first_k_dense_replace < 0) {
    return bad("first_k_dense_replace must be >= 0, got ", c.first_k_dense_replace);
  }
  if (c.moe_layer_freq < 1) return bad("moe_layer_freq must be >= 1, got ", c.moe_layer_freq);
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  auto positive = [](const char* name, int v) -> absl::Status {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat(name, " must be positive, got ", v));
    return absl::OkStatus();
  };
  for (auto [name, v] : {std::pair{"hidden_size", hidden_size},
                         std::pair{"intermediate_size", intermediate_size},
                         std::pair{"num_layers", num_layers}, std::pair{"num_heads", num_heads},
                         std::pair{"num_kv_heads", num_kv_heads}, std::pair{"head_dim", head_dim},
                         std::pair{"vocab_size", vocab_size},
                         std::pair{"max_position_embeddings", max_position_embeddings}}) {
    if (absl::Status s = positive(name, v); !s.ok()) return s;
  }
  if (layer_offset < 0 || (total_layers != 0 && layer_offset + num_layers > total_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stage layers [", layer_offset, ", ",
                                                   layer_offset + num_layers,
                                                   ") fall outside the model's ", total_layers));
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads ", num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   num_kv_heads));
  }
  if (!is_mla() && head_dim % 2 != 0) {  // MLA: only the rope part must be (ValidateMla)
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", head_dim, " must be even"));
  }
  if (!(rms_norm_eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("rms_norm_eps must be positive, got ",
                                                   rms_norm_eps));
  }
  if (!(rope_theta > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("rope_theta must be positive, got ", rope_theta));
  }
  if (!(rope_scaling.factor > 0.0f)) {
    return absl::InvalidArgumentError("rope_scaling.factor must be positive");
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3 &&
      !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
    return absl::InvalidArgumentError(
        "rope_scaling: high_freq_factor must exceed low_freq_factor for type llama3");
  }
  if (sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat("sliding_window must be >= 0, got ",
                                                   sliding_window));
  }
  if (num_experts < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_experts must be >= 0, got ", num_experts));
  }
  if (is_moe()) {
    if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("num_experts_per_tok ", num_experts_per_tok,
                                                     " must be in [1, ", num_experts,
                                                     "] (the number of experts)"));
    }
    if (moe_intermediate_size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("moe_intermediate_size (the expert width) must be positive, got ",
                       moe_intermediate_size));
    }
    if (absl::Status s = ValidateRouting(*this); !s.ok()) return s;
  }
  if (kv_lora_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_lora_rank must be >= 0, got ", kv_lora_rank));
  }
  if (is_mla()) {
    if (absl::Status s = ValidateMla(*this); !s.ok()) return s;
  }
  if (rope_scaling.type == RopeScaling::Type::kYarn &&
      !(rope_scaling.beta_fast > rope_scaling.beta_slow && rope_scaling.beta_slow > 0.0f)) {
    return absl::InvalidArgumentError("rope_scaling: yarn needs beta_fast > beta_slow > 0");
  }
  if (bos_token_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("bos_token_id ", bos_token_id,
                                                   " is outside the vocabulary of ", vocab_size));
  }
  for (TokenId eos : eos_token_ids) {
    if (eos < 0 || eos >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("eos_token_id ", eos,
                                                     " is outside the vocabulary of ", vocab_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve
