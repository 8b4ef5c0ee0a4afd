#include "worker/model/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/convert.h"

namespace kvserve {
namespace {

// llama.cpp's use_more_bits rule: the first and last eighth of the layers, and every third
// layer between, get more bits in the _M mixes.
bool UseMoreBits(int layer, int num_layers) {
  return layer < num_layers / 8 || layer >= 7 * num_layers / 8 || (layer - num_layers / 8) % 3 == 2;
}

// The stored dtype of a matrix with rows of `cols` elements; `role` is its GGUF name suffix.
DType MatrixDType(const SyntheticModelOptions& o, const std::string& role, int layer,
                  int64_t cols) {
  DType t = o.dtype;
  if (o.mix == WeightMix::kKQuantMedium) {
    const bool more = UseMoreBits(layer, o.num_layers);
    if (role == "output" || (more && (role == "attn_v" || role == "ffn_down"))) t = DType::kQ6_K;
  }
  // Rows that are not whole blocks (a 256-element super-block) fall back to q8_0.
  if (cols % DTypeBlockElems(t) != 0) t = DType::kQ8_0;
  return t;
}

class Builder {
 public:
  Builder(ModelWeights* weights, uint64_t seed) : weights_(weights), rng_(seed) {}

  absl::StatusOr<TensorView> Random(std::string name, DType dtype, int64_t rows, int64_t cols) {
    const float a = 1.0f / std::sqrt(static_cast<float>(cols));
    std::uniform_real_distribution<float> dist(-a, a);
    std::vector<float> row(cols);
    TensorView t{std::move(name), dtype, {rows, cols}, nullptr};
    uint8_t* data = Allocate(t.nbytes());
    if (data == nullptr) return absl::ResourceExhaustedError("synthetic model: out of memory");
    const int64_t row_bytes = t.row_bytes();
    for (int64_t r = 0; r < rows; ++r) {
      for (float& x : row) x = dist(rng_);
      cpu::ConvertRowFromF32(row.data(), cols, dtype, data + r * row_bytes);
    }
    t.data = data;
    return t;
  }

  /// A norm weight drawn from [0.5, 1.5], so a test sees whether it is applied.
  absl::StatusOr<TensorView> AroundOne(std::string name, int64_t n) {
    std::uniform_real_distribution<float> dist(0.5f, 1.5f);
    return Vector(std::move(name), n, [&] { return dist(rng_); });
  }

  /// An f32 vector drawn from [-a, a].
  absl::StatusOr<TensorView> Uniform(std::string name, int64_t n, float a) {
    std::uniform_real_distribution<float> dist(-a, a);
    return Vector(std::move(name), n, [&] { return dist(rng_); });
  }

  absl::StatusOr<TensorView> Ones(std::string name, int64_t n) {
    return Vector(std::move(name), n, [] { return 1.0f; });
  }

 private:
  /// An f32 vector of n values, each next().
  template <typename Next>
  absl::StatusOr<TensorView> Vector(std::string name, int64_t n, Next next) {
    TensorView t{std::move(name), DType::kF32, {n}, nullptr};
    auto* data = reinterpret_cast<float*>(Allocate(n * 4));
    if (data == nullptr) return absl::ResourceExhaustedError("synthetic model: out of memory");
    for (int64_t i = 0; i < n; ++i) data[i] = next();
    t.data = data;
    return t;
  }

  uint8_t* Allocate(int64_t bytes) { return weights_->Allocate(bytes); }

  ModelWeights* weights_;
  std::mt19937_64 rng_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> MakeSyntheticModel(const SyntheticModelOptions& o) {
  auto weights = std::make_unique<ModelWeights>();
  ModelConfig& c = weights->config;
  const bool deepseek = o.architecture == "deepseek_v2" || o.architecture == "deepseek_v3";
  if (o.architecture != "llama" && o.architecture != "qwen3" && o.architecture != "mixtral" &&
      o.architecture != "qwen3_moe" && !deepseek) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic model: architecture '", o.architecture,
                     "' is not llama, qwen3, mixtral, qwen3_moe, deepseek_v2 or deepseek_v3"));
  }
  const bool qwen3 = o.architecture == "qwen3" || o.architecture == "qwen3_moe";
  const bool moe = o.architecture == "mixtral" || o.architecture == "qwen3_moe" || deepseek;
  c.architecture = o.architecture;
  c.qk_norm = qwen3;
  // Llama and Mixtral are stored Meta-style (interleaved pairs; the Hugging Face copy is
  // permuted for rotate_half), DeepSeek's rope part interleaved in every format, Qwen's rows in
  // rotate_half order.
  c.rope_style = o.architecture == "llama" || o.architecture == "mixtral" || deepseek
                     ? RopeStyle::kInterleaved
                     : RopeStyle::kHalfSplit;
  if (moe) {
    c.num_experts = o.num_experts;
    c.num_experts_per_tok = o.num_experts_per_tok;
    c.moe_intermediate_size = o.moe_intermediate_size > 0 && (qwen3 || deepseek)
                                  ? o.moe_intermediate_size
                                  : o.intermediate_size;
    c.norm_topk_prob = qwen3 || deepseek ? o.norm_topk_prob : true;
  }
  if (deepseek) {
    const bool v3 = o.architecture == "deepseek_v3";
    c.kv_lora_rank = o.kv_lora_rank;
    c.q_lora_rank = o.q_lora_rank;
    c.qk_nope_head_dim = o.qk_nope_head_dim;
    c.qk_rope_head_dim = o.qk_rope_head_dim;
    c.v_head_dim = o.v_head_dim;
    c.n_shared_experts = o.n_shared_experts;
    c.first_k_dense_replace = o.first_k_dense_replace;
    c.n_group = o.n_group;
    c.topk_group = o.topk_group;
    c.routed_scaling_factor = o.routed_scaling_factor;
    c.moe_scoring = v3 ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
    c.moe_topk =
        v3 ? MoeTopk::kNoAuxTc : (o.n_group > 1 ? MoeTopk::kGroupLimited : MoeTopk::kGreedy);
    // DeepSeek renormalizes only more than one weight, and V2 scales only the weights it does
    // not renormalize (as the loader stores it).
    if (c.num_experts_per_tok == 1) c.norm_topk_prob = false;
    if (!v3 && c.norm_topk_prob) c.routed_scaling_factor = 1.0f;
  }
  c.hidden_size = o.hidden_size;
  c.intermediate_size = o.intermediate_size;
  c.num_layers = o.num_layers;
  c.num_heads = o.num_heads;
  c.num_kv_heads = deepseek ? o.num_heads : o.num_kv_heads;
  c.head_dim = deepseek         ? o.qk_nope_head_dim + o.qk_rope_head_dim
               : o.head_dim > 0 ? o.head_dim
                                : (o.num_heads > 0 ? o.hidden_size / o.num_heads : 0);
  c.vocab_size = o.vocab_size;
  c.max_position_embeddings = o.max_position_embeddings;
  c.tie_word_embeddings = o.tie_word_embeddings;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  // Quantized rows that are not whole K-quant super-blocks fall back to q8_0 (MatrixDType).
  const int64_t block = std::min<int64_t>(DTypeBlockElems(o.dtype), 32);
  if (o.mix == WeightMix::kKQuantMedium && o.dtype != DType::kQ4_K && o.dtype != DType::kQ5_K) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic model: the K-quant mix needs q4_k or q5_k, got ",
                     std::string(DTypeName(o.dtype))));
  }
  if (o.hidden_size % block != 0 || o.intermediate_size % block != 0 ||
      (c.num_heads * c.head_dim) % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic model: sizes must be multiples of ",
                                                   block, " for ", std::string(DTypeName(o.dtype))));
  }
  weights->format = "synthetic";
  Builder b(weights.get(), o.seed);
  auto dt = [&o](const char* role, int layer, int64_t cols) {
    return MatrixDType(o, role, layer, cols);
  };
  const int64_t h = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
#define KVSERVE_ASSIGN(lhs, expr)            \
  do {                                       \
    absl::StatusOr<TensorView> t_ = (expr);  \
    if (!t_.ok()) return t_.status();        \
    lhs = std::move(*t_);                    \
  } while (0)
  KVSERVE_ASSIGN(weights->token_embedding,
                 b.Random("token_embd", dt("token_embd", 0, h), c.vocab_size, h));
  weights->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = weights->layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    KVSERVE_ASSIGN(w.attn_norm, b.Ones(p + "attn_norm", h));
    if (deepseek) {
      const int64_t heads = c.num_heads;
      const int64_t rank = c.kv_lora_rank;
      if (c.q_lora_rank > 0) {
        KVSERVE_ASSIGN(w.wq_a, b.Random(p + "attn_q_a", dt("attn_q_a", l, h), c.q_lora_rank, h));
        KVSERVE_ASSIGN(w.q_a_norm, b.AroundOne(p + "attn_q_a_norm", c.q_lora_rank));
        KVSERVE_ASSIGN(w.wq_b, b.Random(p + "attn_q_b", dt("attn_q_b", l, c.q_lora_rank), q_dim,
                                        c.q_lora_rank));
      } else {
        KVSERVE_ASSIGN(w.wq, b.Random(p + "attn_q", dt("attn_q", l, h), q_dim, h));
      }
      KVSERVE_ASSIGN(w.wkv_a, b.Random(p + "attn_kv_a_mqa", dt("attn_kv_a_mqa", l, h),
                                       rank + c.qk_rope_head_dim, h));
      KVSERVE_ASSIGN(w.kv_a_norm, b.AroundOne(p + "attn_kv_a_norm", rank));
      KVSERVE_ASSIGN(w.wkv_b, b.Random(p + "attn_kv_b", dt("attn_kv_b", l, rank),
                                       heads * (c.qk_nope_head_dim + c.v_head_dim), rank));
      const int64_t v_cols = heads * c.v_head_dim;
      KVSERVE_ASSIGN(w.wo, b.Random(p + "attn_output", dt("attn_output", l, v_cols), h, v_cols));
    } else {
      KVSERVE_ASSIGN(w.wq, b.Random(p + "attn_q", dt("attn_q", l, h), q_dim, h));
      KVSERVE_ASSIGN(w.wk, b.Random(p + "attn_k", dt("attn_k", l, h), kv_dim, h));
      KVSERVE_ASSIGN(w.wv, b.Random(p + "attn_v", dt("attn_v", l, h), kv_dim, h));
      KVSERVE_ASSIGN(w.wo, b.Random(p + "attn_output", dt("attn_output", l, q_dim), h, q_dim));
    }
    if (qwen3) {
      KVSERVE_ASSIGN(w.q_norm, b.AroundOne(p + "attn_q_norm", c.head_dim));
      KVSERVE_ASSIGN(w.k_norm, b.AroundOne(p + "attn_k_norm", c.head_dim));
    }
    KVSERVE_ASSIGN(w.ffn_norm, b.Ones(p + "ffn_norm", h));
    if (c.is_moe_layer(l)) {
      const int64_t width = c.moe_intermediate_size;
      KVSERVE_ASSIGN(w.router,
                     b.Random(p + "ffn_gate_inp", dt("ffn_gate_inp", l, h), c.num_experts, h));
      if (c.moe_topk == MoeTopk::kNoAuxTc) {
        // Of the order of the score gaps, so the bias changes some choices.
        KVSERVE_ASSIGN(w.router_bias, b.Uniform(p + "exp_probs_b", c.num_experts, 0.1f));
      }
      if (c.n_shared_experts > 0) {
        const int64_t shared = int64_t{c.n_shared_experts} * width;
        KVSERVE_ASSIGN(w.shared.w_gate,
                       b.Random(p + "ffn_gate_shexp", dt("ffn_gate", l, h), shared, h));
        KVSERVE_ASSIGN(w.shared.w_up, b.Random(p + "ffn_up_shexp", dt("ffn_up", l, h), shared, h));
        KVSERVE_ASSIGN(w.shared.w_down,
                       b.Random(p + "ffn_down_shexp", dt("ffn_down", l, shared), h, shared));
      }
      w.experts.resize(c.num_experts);
      for (int e = 0; e < c.num_experts; ++e) {
        ExpertWeights& x = w.experts[e];
        const std::string q = absl::StrCat(p, "expert.", e, ".");
        KVSERVE_ASSIGN(x.w_gate, b.Random(q + "ffn_gate", dt("ffn_gate", l, h), width, h));
        KVSERVE_ASSIGN(x.w_up, b.Random(q + "ffn_up", dt("ffn_up", l, h), width, h));
        KVSERVE_ASSIGN(x.w_down, b.Random(q + "ffn_down", dt("ffn_down", l, width), h, width));
      }
      continue;
    }
    KVSERVE_ASSIGN(w.w_gate,
                   b.Random(p + "ffn_gate", dt("ffn_gate", l, h), c.intermediate_size, h));
    KVSERVE_ASSIGN(w.w_up, b.Random(p + "ffn_up", dt("ffn_up", l, h), c.intermediate_size, h));
    KVSERVE_ASSIGN(w.w_down, b.Random(p + "ffn_down", dt("ffn_down", l, c.intermediate_size), h,
                                      c.intermediate_size));
  }
  KVSERVE_ASSIGN(weights->final_norm, b.Ones("output_norm", h));
  if (o.tie_word_embeddings) {
    weights->output = weights->token_embedding;
  } else {
    KVSERVE_ASSIGN(weights->output, b.Random("output", dt("output", 0, h), c.vocab_size, h));
  }
#undef KVSERVE_ASSIGN
  return weights;
}

namespace {

// `t` as an F32 tensor in a buffer owned by `twin` (absent views stay absent).
absl::StatusOr<TensorView> ToF32(const TensorView& t, ModelWeights* twin) {
  if (!t.present()) return t;
  const int64_t cols = t.shape.back();
  const int64_t rows = t.numel() / cols;
  auto* data = reinterpret_cast<float*>(twin->Allocate(rows * cols * 4));
  if (data == nullptr) return absl::ResourceExhaustedError("dequantized twin: out of memory");
  const auto* src = static_cast<const uint8_t*>(t.data);
  for (int64_t r = 0; r < rows; ++r) {
    cpu::ConvertRowToF32(src + r * t.row_bytes(), t.dtype, cols, data + r * cols);
  }
  TensorView v = t;
  v.dtype = DType::kF32;
  v.data = data;
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> DequantizedTwin(const ModelWeights& w) {
  auto twin = std::make_unique<ModelWeights>();
  twin->config = w.config;
  twin->format = w.format;
  twin->source_path = w.source_path;
  twin->layers.resize(w.layers.size());
  std::vector<std::pair<const TensorView*, TensorView*>> views = {
      {&w.token_embedding, &twin->token_embedding},
      {&w.final_norm, &twin->final_norm},
      {&w.rope_freqs, &twin->rope_freqs}};
  const bool tied = w.output.data == w.token_embedding.data;
  if (!tied) views.emplace_back(&w.output, &twin->output);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& s = w.layers[l];
    LayerWeights& d = twin->layers[l];
    views.insert(views.end(), {{&s.attn_norm, &d.attn_norm},
                               {&s.wq, &d.wq},
                               {&s.wk, &d.wk},
                               {&s.wv, &d.wv},
                               {&s.bq, &d.bq},
                               {&s.bk, &d.bk},
                               {&s.bv, &d.bv},
                               {&s.wo, &d.wo},
                               {&s.bo, &d.bo},
                               {&s.q_norm, &d.q_norm},
                               {&s.k_norm, &d.k_norm},
                               {&s.ffn_norm, &d.ffn_norm},
                               {&s.w_gate, &d.w_gate},
                               {&s.w_up, &d.w_up},
                               {&s.w_down, &d.w_down},
                               {&s.router, &d.router},
                               {&s.router_bias, &d.router_bias},
                               {&s.shared.w_gate, &d.shared.w_gate},
                               {&s.shared.w_up, &d.shared.w_up},
                               {&s.shared.w_down, &d.shared.w_down},
                               {&s.wq_a, &d.wq_a},
                               {&s.q_a_norm, &d.q_a_norm},
                               {&s.wq_b, &d.wq_b},
                               {&s.wkv_a, &d.wkv_a},
                               {&s.kv_a_norm, &d.kv_a_norm},
                               {&s.wkv_b, &d.wkv_b}});
    d.experts.resize(s.experts.size());
    for (size_t e = 0; e < s.experts.size(); ++e) {
      views.insert(views.end(), {{&s.experts[e].w_gate, &d.experts[e].w_gate},
                                 {&s.experts[e].w_up, &d.experts[e].w_up},
                                 {&s.experts[e].w_down, &d.experts[e].w_down}});
    }
  }
  for (auto [from, to] : views) {
    absl::StatusOr<TensorView> v = ToF32(*from, twin.get());
    if (!v.ok()) return v.status();
    *to = *std::move(v);
  }
  if (tied) twin->output = twin->token_embedding;
  return twin;
}

}  // namespace kvserve
