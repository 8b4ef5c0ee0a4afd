#ifndef KVSERVE_WORKER_MODEL_SYNTHETIC_MODEL_H_
#define KVSERVE_WORKER_MODEL_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "worker/model/weights.h"

namespace kvserve {

/// How the matrices' dtypes are chosen from SyntheticModelOptions::dtype.
enum class WeightMix {
  /// Every matrix and the embedding in `dtype`.
  kUniform,
  /// llama.cpp's "_M" K-quant mixes in spirit (q4_k_m, q5_k_m; `dtype` is kQ4_K or kQ5_K): `dtype`
  /// for most matrices, kQ6_K for the output projection and for attn_v and ffn_down in the first
  /// and last eighth of the layers and every third layer between.
  kKQuantMedium,
};

/// Shape and storage of a random-weight Llama model, for benchmarks and tests at realistic sizes.
/// A matrix whose row length is not a multiple of its dtype's block (a K-quant's 256-element
/// super-block) is stored as kQ8_0 instead, so quantized dtypes need sizes that are multiples of
/// 32 only.
struct SyntheticModelOptions {
  /// "llama", "qwen3", "mixtral", "qwen3_moe", "deepseek_v2" or "deepseek_v3". A qwen3 or
  /// qwen3_moe model has per-head q/k norms (weights drawn from [0.5, 1.5]); qwen3, mixtral and
  /// qwen3_moe keep their q/k rows in rotate_half order (RopeStyle::kHalfSplit), as those
  /// checkpoints have. mixtral and qwen3_moe replace each layer's MLP by `num_experts` experts
  /// behind a router. deepseek_v2 / deepseek_v3 have multi-head latent attention (the mla_*
  /// fields; num_kv_heads and head_dim are unused) and DeepSeek's experts: softmax routing for
  /// v2, sigmoid with a random correction bias and noaux_tc group selection for v3, shared
  /// experts, and dense first layers.
  std::string architecture = "llama";
  int num_layers = 2;
  int hidden_size = 256;
  int num_heads = 4;
  int num_kv_heads = 4;
  /// Width of one attention head; 0 means hidden_size / num_heads.
  int head_dim = 0;
  int intermediate_size = 688;
  /// Mixture of experts (mixtral, qwen3_moe): experts per layer, experts run per token, and the
  /// width of one expert (0: intermediate_size). Mixtral renormalizes the top-k weights always,
  /// qwen3_moe when norm_topk_prob.
  int num_experts = 4;
  int num_experts_per_tok = 2;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  /// DeepSeek only: shared experts, dense first layers, expert groups (v2 uses
  /// group_limited_greedy when n_group > 1), and the routed weights' factor.
  int n_shared_experts = 1;
  int first_k_dense_replace = 1;
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling_factor = 1.0f;
  /// DeepSeek only: multi-head latent attention shape (q_lora_rank 0: q projected directly).
  int kv_lora_rank = 64;
  int q_lora_rank = 0;
  int qk_nope_head_dim = 32;
  int qk_rope_head_dim = 16;
  int v_head_dim = 32;
  int vocab_size = 1024;
  int max_position_embeddings = 2048;
  /// dtype of the matmul weights and the embedding (norms are always F32).
  DType dtype = DType::kF32;
  WeightMix mix = WeightMix::kUniform;
  bool tie_word_embeddings = false;
  uint64_t seed = 1;
};

/// Builds a model in memory with weights drawn uniformly from [-a, a], a = 1/sqrt(fan_in) (so
/// activations stay O(1) through the layers), norm weights 1 (qwen3's q/k norms excepted).
/// Deterministic for a given seed; a llama model's weights do not depend on the new options.
absl::StatusOr<std::unique_ptr<ModelWeights>> MakeSyntheticModel(const SyntheticModelOptions& options);

/// A copy of `weights` with every matrix and the embedding converted to F32 (quantized blocks
/// decoded with cpu::ConvertRowToF32, so the values are exactly those the quantized model
/// computes with); norms and config shared by value. Its buffers are owned by the copy.
absl::StatusOr<std::unique_ptr<ModelWeights>> DequantizedTwin(const ModelWeights& weights);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_SYNTHETIC_MODEL_H_
