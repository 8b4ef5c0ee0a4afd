#include "worker/planner/model_spec.h"

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::Status FieldError(const ModelSpec& spec, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(spec.source, ": ", field, " ", what));
}

absl::Status RequirePositive(const ModelSpec& spec, absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return FieldError(spec, field, absl::StrCat("must be positive (got ", value, ")"));
}

}  // namespace

absl::StatusOr<WeightDType> ParseWeightDType(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  if (lower == "f32" || lower == "float32") return WeightDType::kF32;
  if (lower == "f16" || lower == "float16") return WeightDType::kF16;
  if (lower == "bf16" || lower == "bfloat16") return WeightDType::kBF16;
  if (lower == "int8") return WeightDType::kInt8;
  if (lower == "fp8" || lower == "fp8_e4m3") return WeightDType::kFp8;
  if (lower == "int4") return WeightDType::kInt4;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown weight dtype \"", lower, "\" (expected f32, f16, bf16, int8, fp8 or int4)"));
}

std::string_view WeightDTypeName(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kF32:
      return "f32";
    case WeightDType::kF16:
      return "f16";
    case WeightDType::kBF16:
      return "bf16";
    case WeightDType::kInt8:
      return "int8";
    case WeightDType::kFp8:
      return "fp8";
    case WeightDType::kInt4:
      return "int4";
  }
  return "unknown";
}

int64_t WeightBytesForParams(WeightDType dtype, int64_t params) {
  switch (dtype) {
    case WeightDType::kF32:
      return 4 * params;
    case WeightDType::kF16:
    case WeightDType::kBF16:
      return 2 * params;
    case WeightDType::kInt8:
    case WeightDType::kFp8:
      return params;
    case WeightDType::kInt4:
      return CeilDiv(params, 2) + 2 * CeilDiv(params, kInt4GroupSize);
  }
  return 0;
}

bool ModelSpec::IsMoeLayer(int layer) const {
  if (!IsMoe() || layer < moe.first_k_dense_replace) return false;
  const int freq = moe.moe_layer_freq > 0 ? moe.moe_layer_freq : 1;
  return layer % freq == 0;
}

int ModelSpec::NumMoeLayers() const {
  int n = 0;
  for (int layer = 0; layer < num_layers; ++layer) n += IsMoeLayer(layer) ? 1 : 0;
  return n;
}

absl::Status ModelSpec::Validate() const {
  for (const auto& [field, value] :
       {std::pair<absl::string_view, int64_t>{"num_hidden_layers", num_layers},
        {"hidden_size", hidden_size},
        {"num_attention_heads", num_heads},
        {"vocab_size", vocab_size}}) {
    if (absl::Status s = RequirePositive(*this, field, value); !s.ok()) return s;
  }
  if (max_position_embeddings < 0) {
    return FieldError(*this, "max_position_embeddings", "must not be negative");
  }
  if (sliding_window < 0) return FieldError(*this, "sliding_window", "must not be negative");
  if (NumMoeLayers() < num_layers) {
    if (absl::Status s = RequirePositive(*this, "intermediate_size", intermediate_size); !s.ok()) {
      return s;
    }
  }
  if (IsMoe()) {
    if (absl::Status s = RequirePositive(*this, "moe_intermediate_size", moe.moe_intermediate_size);
        !s.ok()) {
      return s;
    }
    if (moe.num_experts_per_tok <= 0 || moe.num_experts_per_tok > moe.num_routed_experts) {
      return FieldError(*this, "num_experts_per_tok",
                        absl::StrCat("must be in [1, ", moe.num_routed_experts, "] (got ",
                                     moe.num_experts_per_tok, ")"));
    }
    if (moe.num_shared_experts < 0 || moe.first_k_dense_replace < 0 || moe.moe_layer_freq <= 0) {
      return FieldError(*this, "n_shared_experts/first_k_dense_replace/moe_layer_freq",
                        "out of range");
    }
  }
  if (IsMla()) {
    for (const auto& [field, value] :
         {std::pair<absl::string_view, int64_t>{"qk_rope_head_dim", mla.qk_rope_head_dim},
          {"qk_nope_head_dim", mla.qk_nope_head_dim},
          {"v_head_dim", mla.v_head_dim}}) {
      if (absl::Status s = RequirePositive(*this, field, value); !s.ok()) return s;
    }
    if (mla.q_lora_rank < 0) return FieldError(*this, "q_lora_rank", "must not be negative");
    return absl::OkStatus();
  }
  if (absl::Status s = RequirePositive(*this, "num_key_value_heads", num_kv_heads); !s.ok()) {
    return s;
  }
  if (absl::Status s = RequirePositive(*this, "head_dim", head_dim); !s.ok()) return s;
  if (num_heads % num_kv_heads != 0) {
    return FieldError(
        *this, "num_key_value_heads",
        absl::StrCat("(", num_kv_heads, ") must divide num_attention_heads (", num_heads, ")"));
  }
  return absl::OkStatus();
}

// Parameter formulas. H = hidden, V = vocab, nh/nkv = heads, d = head_dim, I = intermediate.
//
// Whole model: embedding V·H (vocab-parallel), output head V·H unless tied (vocab-parallel),
// final norm H (replicated), plus per layer:
//   norms                      2H                                    replicated
//   standard attention (Llama, Mistral, Qwen2, Qwen3, Mixtral):
//     q, o                     2·H·nh·d                              split
//     k, v                     2·H·nkv·d                             kv_heads
//     q/k/v bias (Qwen2)       nh·d split + 2·nkv·d kv_heads; Llama attention_bias adds an
//                              o bias H (replicated: added once after the all-reduce)
//     q/k norms (Qwen3)        2d                                    replicated
//   MLA (DeepSeek-V2/V3; r = qk_rope_head_dim, n = qk_nope_head_dim, v = v_head_dim):
//     q_a_proj + q_a_layernorm H·q_lora + q_lora                      replicated
//     q_b_proj                 q_lora·nh·(n + r)  (no q_lora: q_proj H·nh·(n + r))  split
//     kv_a_proj_with_mqa       H·(kv_lora + r)                       replicated
//     kv_a_layernorm           kv_lora                               replicated
//     kv_b_proj                kv_lora·nh·(n + v)                    split
//     o_proj                   nh·v·H                                split
//   dense MLP                  3·H·I (gate, up, down)                split
//   MoE MLP (E experts of width Ie, s shared):
//     router                   H·E (+ E score-correction bias for DeepSeek-V3)  replicated
//     experts                  (E + s)·3·H·Ie                        split
// DeepSeek-V3's multi-token-prediction layer is not counted: inference does not load it.
namespace {

// The parameters of decoder layer `layer` (the per-layer formulas above).
ShardedAmounts LayerParameters(const ModelSpec& spec, int layer) {
  const int64_t h = spec.hidden_size;
  const int64_t nh = spec.num_heads;
  ShardedAmounts p;
  p.replicated += 2 * h;
  if (spec.IsMla()) {
    const MlaSpec& m = spec.mla;
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    if (m.q_lora_rank > 0) {
      p.replicated += h * m.q_lora_rank + m.q_lora_rank;
      p.split += int64_t{m.q_lora_rank} * nh * qk;
    } else {
      p.split += h * nh * qk;
    }
    p.replicated += h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank;
    p.split += int64_t{m.kv_lora_rank} * nh * (m.qk_nope_head_dim + m.v_head_dim);
    p.split += nh * m.v_head_dim * h;
  } else {
    const int64_t q_width = nh * spec.head_dim;
    const int64_t kv_width = int64_t{spec.num_kv_heads} * spec.head_dim;
    p.split += 2 * h * q_width;
    p.kv_heads += 2 * h * kv_width;
    if (spec.qkv_bias) {
      p.split += q_width;
      p.kv_heads += 2 * kv_width;
    }
    if (spec.o_bias) p.replicated += h;
    if (spec.qk_norm) p.replicated += 2 * int64_t{spec.head_dim};
  }
  if (spec.IsMoeLayer(layer)) {
    const MoeSpec& moe = spec.moe;
    p.replicated += h * moe.num_routed_experts + (moe.router_bias ? moe.num_routed_experts : 0);
    p.split += int64_t{moe.num_routed_experts + moe.num_shared_experts} * 3 * h *
               moe.moe_intermediate_size;
  } else {
    p.split += 3 * h * spec.intermediate_size;
  }
  return p;
}

ShardedAmounts AmountBytes(WeightDType dtype, const ShardedAmounts& params) {
  ShardedAmounts bytes;
  bytes.split = WeightBytesForParams(dtype, params.split);
  bytes.replicated = WeightBytesForParams(dtype, params.replicated);
  bytes.vocab_parallel = WeightBytesForParams(dtype, params.vocab_parallel);
  bytes.kv_heads = WeightBytesForParams(dtype, params.kv_heads);
  return bytes;
}

bool IsWholeModel(const ModelSpec& spec, StageLayers stage) {
  return stage.first <= 0 && stage.end() >= spec.num_layers;
}

}  // namespace

ShardedAmounts& ShardedAmounts::operator+=(const ShardedAmounts& other) {
  split += other.split;
  replicated += other.replicated;
  vocab_parallel += other.vocab_parallel;
  kv_heads += other.kv_heads;
  return *this;
}

ShardedSizes CountParameters(const ModelSpec& spec) {
  const int64_t h = spec.hidden_size;
  const int64_t v = spec.vocab_size;
  ShardedSizes p;
  p.embedding.vocab_parallel = v * h;
  p.output.replicated = h;
  if (!spec.tie_word_embeddings) p.output.vocab_parallel = v * h;
  ShardedAmounts& totals = p;
  totals += p.embedding;
  totals += p.output;
  p.layers.reserve(static_cast<size_t>(std::max(spec.num_layers, 0)));
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    p.layers.push_back(LayerParameters(spec, layer));
    totals += p.layers.back();
  }
  return p;
}

ShardedSizes ModelWeightBytes(const ModelSpec& spec, std::optional<WeightDType> dtype_override) {
  if (!dtype_override.has_value() && spec.tensor_bytes.has_value()) return *spec.tensor_bytes;
  const WeightDType dtype =
      dtype_override.value_or(spec.checkpoint_dtype.value_or(WeightDType::kBF16));
  const ShardedSizes params = CountParameters(spec);
  ShardedSizes bytes;
  static_cast<ShardedAmounts&>(bytes) = AmountBytes(dtype, params);
  bytes.embedding = AmountBytes(dtype, params.embedding);
  bytes.output = AmountBytes(dtype, params.output);
  bytes.other = AmountBytes(dtype, params.other);
  bytes.layers.reserve(params.layers.size());
  for (const ShardedAmounts& layer : params.layers) {
    bytes.layers.push_back(AmountBytes(dtype, layer));
  }
  return bytes;
}

bool StageWeightBytesExact(const ModelSpec& spec, std::optional<WeightDType> dtype_override,
                           StageLayers stage) {
  return !dtype_override.has_value() && spec.tensor_bytes.has_value() &&
         (IsWholeModel(spec, stage) || spec.tensor_bytes->has_placement());
}

ShardedAmounts StageWeightBytes(const ModelSpec& spec, std::optional<WeightDType> dtype_override,
                                StageLayers stage) {
  ShardedSizes bytes = ModelWeightBytes(spec, dtype_override);
  if (IsWholeModel(spec, stage)) return static_cast<const ShardedAmounts&>(bytes);
  if (!bytes.has_placement()) {
    // Totals alone cannot be split by layer: count this stage from the parameters.
    ModelSpec counted = spec;
    counted.tensor_bytes.reset();
    bytes = ModelWeightBytes(counted, dtype_override);
  }
  ShardedAmounts out = bytes.other;
  const int end = std::min<int>(stage.end(), static_cast<int>(bytes.layers.size()));
  for (int layer = std::max(stage.first, 0); layer < end; ++layer) out += bytes.layers[layer];
  const bool first = stage.first <= 0;
  const bool last = stage.end() >= spec.num_layers;
  if (first) out += bytes.embedding;
  if (last) {
    out += bytes.output;
    // No output head of its own: it is the tied embedding matrix, which the last stage needs
    // too, for the logits.
    if (bytes.output.vocab_parallel == 0) out += bytes.embedding;
  }
  return out;
}

}  // namespace kvserve
