#include "worker/planner/tensor_sharding.h"

#include <charconv>

namespace kvserve {
namespace {

// Reads the layer number after `prefix` ("model.layers." / "blk."); -1 when `name` has none.
// On success `rest` is the part after the number and its dot ("self_attn.k_proj.weight").
int LayerIndex(std::string_view name, std::string_view prefix, std::string_view& rest) {
  const size_t at = name.find(prefix);
  if (at == std::string_view::npos) return -1;
  const std::string_view tail = name.substr(at + prefix.size());
  int layer = 0;
  const auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), layer);
  if (ec != std::errc() || end == tail.data()) return -1;
  rest = tail.substr(static_cast<size_t>(end - tail.data()));
  if (!rest.empty() && rest.front() == '.') rest.remove_prefix(1);
  return layer;
}

bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The sharding of a Hugging Face tensor; `rest` is the name past its layer number, or the whole
// name outside the layers.
TensorSharding HfSharding(std::string_view name, std::string_view rest) {
  if (Contains(name, "rotary_emb")) return TensorSharding::kSkip;
  if (Contains(name, "embed_tokens") || name.starts_with("lm_head")) {
    return TensorSharding::kVocabParallel;
  }
  if (Contains(rest, "norm")) return TensorSharding::kReplicated;
  if (Contains(rest, "k_proj.") || Contains(rest, "v_proj.")) {
    // MLA's kv_a_proj_with_mqa / kv_b_proj do not match: their names end "kv_a_proj_with_mqa."
    // and "kv_b_proj.".
    return TensorSharding::kKvHeads;
  }
  // MLA down-projections and MoE routers (DeepSeek `mlp.gate`, Mixtral `block_sparse_moe.gate`)
  // are small and replicated.
  if (Contains(rest, "q_a_proj") || Contains(rest, "kv_a_proj_with_mqa") ||
      rest.ends_with("mlp.gate.weight") || rest.ends_with("moe.gate.weight") ||
      Contains(rest, "e_score_correction_bias")) {
    return TensorSharding::kReplicated;
  }
  return TensorSharding::kSplit;
}

// The sharding of a GGUF tensor other than token_embd / output; `rest` as for HfSharding.
TensorSharding GgufSharding(std::string_view rest) {
  if (Contains(rest, "norm")) return TensorSharding::kReplicated;
  // The component is what precedes ".weight" / ".bias": "attn_k", "attn_kv_a_mqa", ...
  const std::string_view component = rest.substr(0, rest.rfind('.'));
  if (component == "attn_k" || component == "attn_v") return TensorSharding::kKvHeads;
  if (component == "attn_q_a" || component == "attn_kv_a_mqa" || component == "ffn_gate_inp" ||
      component == "exp_probs_b") {
    return TensorSharding::kReplicated;
  }
  if (component == "rope_freqs") return TensorSharding::kReplicated;
  return TensorSharding::kSplit;
}

}  // namespace

TensorClass ClassifyHfTensor(std::string_view name, int num_layers) {
  std::string_view rest = name;
  const int layer = LayerIndex(name, "layers.", rest);
  const TensorSharding sharding = HfSharding(name, rest);
  if (layer >= num_layers || sharding == TensorSharding::kSkip) return {};
  if (layer >= 0) return {sharding, ModelPart::kLayer, layer};
  if (Contains(name, "embed_tokens")) return {sharding, ModelPart::kEmbedding};
  // lm_head and the final norm ("model.norm.weight").
  if (name.starts_with("lm_head") || Contains(name, "norm")) {
    return {sharding, ModelPart::kOutput};
  }
  return {sharding, ModelPart::kOther};
}

TensorClass ClassifyGgufTensor(std::string_view name, int num_layers) {
  if (name == "token_embd.weight") {
    return {TensorSharding::kVocabParallel, ModelPart::kEmbedding};
  }
  if (name == "output.weight") return {TensorSharding::kVocabParallel, ModelPart::kOutput};
  std::string_view rest = name;
  const int layer = LayerIndex(name, "blk.", rest);
  if (layer >= num_layers) return {};
  const TensorSharding sharding = GgufSharding(rest);
  if (layer >= 0) return {sharding, ModelPart::kLayer, layer};
  if (name.starts_with("output_norm")) return {sharding, ModelPart::kOutput};
  return {sharding, ModelPart::kOther};
}

void AddShardedBytes(TensorSharding sharding, int64_t bytes, ShardedAmounts& sizes) {
  switch (sharding) {
    case TensorSharding::kSplit:
      sizes.split += bytes;
      return;
    case TensorSharding::kReplicated:
      sizes.replicated += bytes;
      return;
    case TensorSharding::kVocabParallel:
      sizes.vocab_parallel += bytes;
      return;
    case TensorSharding::kKvHeads:
      sizes.kv_heads += bytes;
      return;
    case TensorSharding::kSkip:
      return;
  }
}

void AddShardedBytes(const TensorClass& tensor, int64_t bytes, ShardedSizes& sizes) {
  if (tensor.sharding == TensorSharding::kSkip) return;
  AddShardedBytes(tensor.sharding, bytes, static_cast<ShardedAmounts&>(sizes));
  switch (tensor.part) {
    case ModelPart::kLayer:
      if (tensor.layer < 0) break;
      if (sizes.layers.size() <= static_cast<size_t>(tensor.layer)) {
        sizes.layers.resize(static_cast<size_t>(tensor.layer) + 1);
      }
      AddShardedBytes(tensor.sharding, bytes, sizes.layers[static_cast<size_t>(tensor.layer)]);
      return;
    case ModelPart::kEmbedding:
      AddShardedBytes(tensor.sharding, bytes, sizes.embedding);
      return;
    case ModelPart::kOutput:
      AddShardedBytes(tensor.sharding, bytes, sizes.output);
      return;
    case ModelPart::kOther:
      break;
  }
  AddShardedBytes(tensor.sharding, bytes, sizes.other);
}

}  // namespace kvserve
