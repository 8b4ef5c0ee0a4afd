// ModelSpec from GGUF metadata (llama.cpp key names: "<arch>.block_count", ...).

#include <climits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/planner/model_spec_loader.h"
#include "worker/planner/tensor_sharding.h"

namespace kvserve {
namespace {

// Reads "<arch>.<key>" as a non-negative int; nullopt when absent.
class GgufKeys {
 public:
  GgufKeys(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  absl::StatusOr<std::optional<int>> Opt(absl::string_view key) const {
    const std::string full = absl::StrCat(arch_, ".", key);
    const GgufValue* value = file_.Find(full);
    if (value == nullptr) return std::nullopt;
    const std::optional<int64_t> v = value->AsInt64();
    if (!v.has_value() || *v < 0 || *v > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(file_.path(), ": metadata \"", full,
                                                     "\" must be a non-negative integer, got ",
                                                     value->DebugString()));
    }
    return static_cast<int>(*v);
  }

  // Assigns the key to `out`; a missing key keeps `fallback`, or is an error without one.
  absl::Status Read(absl::string_view key, int& out, std::optional<int> fallback = {}) const {
    absl::StatusOr<std::optional<int>> v = Opt(key);
    if (!v.ok()) return v.status();
    if (v->has_value()) {
      out = **v;
    } else if (fallback.has_value()) {
      out = *fallback;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(file_.path(), ": missing metadata \"", arch_, ".", key, "\""));
    }
    return absl::OkStatus();
  }

 private:
  const GgufFile& file_;
  std::string arch_;
};

absl::Status ReadVocabSize(const GgufFile& file, const GgufKeys& keys, ModelSpec& spec) {
  if (absl::Status s = keys.Read("vocab_size", spec.vocab_size, 0); !s.ok()) return s;
  if (spec.vocab_size > 0) return absl::OkStatus();
  if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
      embd != nullptr && embd->dims.size() == 2 && embd->dims[1] <= INT_MAX) {
    spec.vocab_size = static_cast<int>(embd->dims[1]);
    return absl::OkStatus();
  }
  if (const GgufValue* tokens = file.Find("tokenizer.ggml.tokens"); tokens != nullptr) {
    if (const GgufArray* array = tokens->AsArray(); array != nullptr) {
      spec.vocab_size = static_cast<int>(array->elements.size());
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(file.path(),
                   ": cannot tell the vocabulary size (no vocab_size, "
                   "token_embd.weight or tokenizer.ggml.tokens)"));
}

absl::Status ReadDeepseek2(const GgufKeys& keys, ModelSpec& spec) {
  MlaSpec& mla = spec.mla;
  MoeSpec& moe = spec.moe;
  absl::Status s;
  if (s = keys.Read("attention.kv_lora_rank", mla.kv_lora_rank); !s.ok()) return s;
  if (s = keys.Read("attention.q_lora_rank", mla.q_lora_rank, 0); !s.ok()) return s;
  if (s = keys.Read("rope.dimension_count", mla.qk_rope_head_dim); !s.ok()) return s;
  // Newer converters store the MLA head sizes under *_mla and the absorbed sizes in key_length.
  int key_length = 0;
  absl::StatusOr<std::optional<int>> key_mla = keys.Opt("attention.key_length_mla");
  if (!key_mla.ok()) return key_mla.status();
  const bool has_mla_keys = key_mla->has_value();
  if (s = keys.Read(has_mla_keys ? "attention.key_length_mla" : "attention.key_length", key_length);
      !s.ok()) {
    return s;
  }
  if (s = keys.Read(has_mla_keys ? "attention.value_length_mla" : "attention.value_length",
                    mla.v_head_dim);
      !s.ok()) {
    return s;
  }
  mla.qk_nope_head_dim = key_length - mla.qk_rope_head_dim;
  spec.head_dim = key_length;
  spec.num_kv_heads = spec.num_heads;
  if (s = keys.Read("expert_count", moe.num_routed_experts, 0); !s.ok()) return s;
  if (s = keys.Read("expert_shared_count", moe.num_shared_experts, 0); !s.ok()) return s;
  if (s = keys.Read("expert_feed_forward_length", moe.moe_intermediate_size, 0); !s.ok()) {
    return s;
  }
  if (s = keys.Read("expert_used_count", moe.num_experts_per_tok, 0); !s.ok()) return s;
  if (s = keys.Read("leading_dense_block_count", moe.first_k_dense_replace, 0); !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromGguf(const GgufFile& file) {
  absl::StatusOr<std::string> arch = file.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (*arch != "llama" && *arch != "qwen2" && *arch != "qwen3" && *arch != "qwen3moe" &&
      *arch != "deepseek2") {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": unsupported general.architecture \"", *arch,
                     "\" (supported: llama, qwen2, qwen3, qwen3moe, deepseek2)"));
  }
  ModelSpec spec;
  spec.source = file.path();
  spec.model_type = *arch == "deepseek2" ? "deepseek_v2" : *arch;
  const GgufKeys keys(file, *arch);
  absl::Status s;
  if (s = keys.Read("block_count", spec.num_layers); !s.ok()) return s;
  if (s = keys.Read("embedding_length", spec.hidden_size); !s.ok()) return s;
  if (s = keys.Read("attention.head_count", spec.num_heads); !s.ok()) return s;
  if (s = keys.Read("attention.head_count_kv", spec.num_kv_heads, spec.num_heads); !s.ok()) {
    return s;
  }
  if (s = keys.Read("feed_forward_length", spec.intermediate_size, 0); !s.ok()) return s;
  if (s = keys.Read("context_length", spec.max_position_embeddings, 0); !s.ok()) return s;
  if (s = keys.Read("attention.sliding_window", spec.sliding_window, 0); !s.ok()) return s;
  if (spec.num_heads > 0) {
    if (s = keys.Read("attention.key_length", spec.head_dim, spec.hidden_size / spec.num_heads);
        !s.ok()) {
      return s;
    }
  }
  if (s = ReadVocabSize(file, keys, spec); !s.ok()) return s;
  spec.tie_word_embeddings = file.FindTensor("output.weight") == nullptr;
  spec.qkv_bias = file.FindTensor("blk.0.attn_q.bias") != nullptr;
  spec.o_bias = file.FindTensor("blk.0.attn_output.bias") != nullptr;
  spec.qk_norm = file.FindTensor("blk.0.attn_q_norm.weight") != nullptr;

  if (*arch == "deepseek2") {
    if (s = ReadDeepseek2(keys, spec); !s.ok()) return s;
    // DeepSeek-V3 differs from V2 (for planning) only by its router's score-correction bias.
    for (const GgufTensorInfo& tensor : file.tensors()) {
      if (tensor.name.find("exp_probs_b") != std::string::npos) {
        spec.moe.router_bias = true;
        spec.model_type = "deepseek_v3";
        break;
      }
    }
  } else {
    if (s = keys.Read("expert_count", spec.moe.num_routed_experts, 0); !s.ok()) return s;
    if (spec.moe.num_routed_experts > 0) {
      if (*arch == "llama") spec.model_type = "mixtral";
      if (*arch == "qwen3moe") spec.model_type = "qwen3_moe";
      if (s = keys.Read("expert_feed_forward_length", spec.moe.moe_intermediate_size,
                        spec.intermediate_size);
          !s.ok()) {
        return s;
      }
      if (s = keys.Read("expert_used_count", spec.moe.num_experts_per_tok); !s.ok()) return s;
    }
  }
  if (s = spec.Validate(); !s.ok()) return s;

  ShardedSizes bytes;
  for (const GgufTensorInfo& tensor : file.tensors()) {
    AddShardedBytes(ClassifyGgufTensor(tensor.name, spec.num_layers),
                    static_cast<int64_t>(tensor.nbytes), bytes);
  }
  spec.tensor_bytes = bytes;
  return spec;
}

}  // namespace kvserve
