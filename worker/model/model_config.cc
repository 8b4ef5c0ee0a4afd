#include "worker/model/model_config.h"

#include "absl/strings/str_cat.h"

namespace kvserve {

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
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads ", num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   num_kv_heads));
  }
  if (head_dim % 2 != 0) {
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
