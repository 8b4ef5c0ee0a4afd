#include "worker/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"

namespace kvserve {
namespace {

const float* F32(const TensorView& t) { return static_cast<const float*>(t.data); }

// Bytes rounded up to a multiple of 256 (keeps every workspace slice aligned).
int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Makes `buffer` hold at least `bytes`; contents are not kept. Sets *moved when it reallocated.
absl::Status Grow(Backend& backend, DeviceBuffer* buffer, int64_t bytes, bool* moved = nullptr) {
  if (static_cast<int64_t>(buffer->bytes()) >= bytes) return absl::OkStatus();
  if (moved != nullptr) *moved = true;
  buffer->reset();
  absl::StatusOr<DeviceBuffer> b = backend.AllocBuffer(static_cast<size_t>(bytes));
  if (!b.ok()) return b.status();
  *buffer = std::move(*b);
  return absl::OkStatus();
}

// Where the staged batch arrays lie in one buffer. Part i (StagedAt's numbering) is
// slot_mapping (int64), tokens, positions, q_start, q_len, context_len, block_tables, logits_rows
// (int32); each is 256-byte aligned, and the block tables come last, so a decode graph's padded
// batch needs only the buffer's prefix up to its own rows of them.
constexpr int kBlockTablesPart = 6;

struct StagingLayout {
  int64_t bytes[8];
  int64_t offsets[8];
  int64_t total;
};

StagingLayout LayoutStaging(int64_t tokens, int64_t seqs, int64_t table_entries, int64_t rows) {
  StagingLayout layout{{tokens * 8, tokens * 4, tokens * 4, seqs * 4, seqs * 4, seqs * 4,
                        table_entries * 4, rows * 4},
                       {},
                       0};
  for (int i : {0, 1, 2, 3, 4, 5, 7, kBlockTablesPart}) {
    layout.offsets[i] = layout.total;
    layout.total += Aligned(layout.bytes[i]);
  }
  return layout;
}

}  // namespace

std::vector<int32_t> DecodeGraphBatchSizes(int32_t max_batch) {
  std::vector<int32_t> sizes;
  for (int32_t b : {1, 2, 4}) {
    if (b < max_batch) sizes.push_back(b);
  }
  for (int32_t b = 8; b < max_batch; b += 8) sizes.push_back(b);
  if (max_batch >= 1) sizes.push_back(max_batch);
  return sizes;
}

std::vector<float> ComputeRopeInvFreq(const ModelConfig& config, const TensorView& rope_freqs) {
  const int dim = config.rotary_dim();
  const int half = dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    // Same float32 arithmetic as the reference implementations: theta^(-2i/d).
    inv_freq[i] =
        1.0f / std::pow(config.rope_theta, static_cast<float>(2 * i) / static_cast<float>(dim));
  }
  const RopeScaling& s = config.rope_scaling;
  if (s.type == RopeScaling::Type::kYarn) {
    // DeepSeek's yarn: frequencies that turn fewer than beta_slow times over the original
    // context are interpolated (divided by factor), those turning more than beta_fast times
    // kept, and a linear ramp over the pair index blends the band between.
    const double log_theta = std::log(static_cast<double>(config.rope_theta));
    auto correction_dim = [&](double rotations) {
      return dim *
             std::log(s.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
             (2 * log_theta);
    };
    const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(s.beta_slow)), dim - 1.0);
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const float base =
          std::pow(config.rope_theta, static_cast<float>(2 * i) / static_cast<float>(dim));
      const float extrapolated = 1.0f / base;
      const float interpolated = 1.0f / (s.factor * base);
      const float ramp = std::clamp(
          (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
          1.0f);
      const float keep = 1.0f - ramp;  // weight of the extrapolated (unscaled) frequency
      inv_freq[i] = interpolated * (1.0f - keep) + extrapolated * keep;
    }
  } else if (s.type == RopeScaling::Type::kLinear) {
    for (float& f : inv_freq) f /= s.factor;
  } else if (s.type == RopeScaling::Type::kLlama3) {
    // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band between
    // is interpolated smoothly.
    const float old_len = static_cast<float>(s.original_max_position_embeddings);
    const float low_freq_wavelen = old_len / s.low_freq_factor;
    const float high_freq_wavelen = old_len / s.high_freq_factor;
    for (float& f : inv_freq) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      if (wavelen > low_freq_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const float smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0f - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  if (rope_freqs.present()) {
    const float* div = F32(rope_freqs);
    for (int i = 0; i < half && i < rope_freqs.numel(); ++i) inv_freq[i] /= div[i];
  }
  return inv_freq;
}

namespace {

// Every layer of a mixture-of-experts model has a router and num_experts complete experts.
absl::Status CheckExperts(const ModelWeights& weights) {
  const ModelConfig& c = weights.config;
  if (!c.is_moe()) return absl::OkStatus();
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    if (!c.is_moe_layer(static_cast<int>(i))) continue;
    const LayerWeights& l = weights.layers[i];
    bool complete = l.router.present() && l.router.shape.size() == 2 &&
                    l.router.shape[0] == c.num_experts &&
                    static_cast<int>(l.experts.size()) == c.num_experts;
    for (size_t e = 0; complete && e < l.experts.size(); ++e) {
      const ExpertWeights& x = l.experts[e];
      complete = x.w_gate.present() && x.w_up.present() && x.w_down.present();
    }
    if (c.n_shared_experts > 0) {
      complete = complete && l.shared.w_gate.present() && l.shared.w_up.present() &&
                 l.shared.w_down.present();
    }
    if (!complete) {
      return absl::InvalidArgumentError(
          absl::StrCat("LlamaModel: layer ", i, " needs a router of ", c.num_experts, " rows and ",
                       c.num_experts, " experts with gate, up and down weights",
                       c.n_shared_experts > 0 ? " (and the shared experts')" : ""));
    }
    if (c.moe_topk == MoeTopk::kNoAuxTc &&
        (l.router_bias.numel() != c.num_experts || l.router_bias.dtype != DType::kF32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("LlamaModel: layer ", i, " needs an f32 router correction bias of ",
                       c.num_experts, " elements (noaux_tc routing)"));
    }
  }
  return absl::OkStatus();
}

// Every layer of an MLA model has its latent projections, in the shapes the config gives.
absl::Status CheckMla(const ModelWeights& weights) {
  const ModelConfig& c = weights.config;
  if (!c.is_mla()) return absl::OkStatus();
  const int64_t heads = c.num_heads;
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& l = weights.layers[i];
    auto shaped = [](const TensorView& t, std::vector<int64_t> shape) {
      return t.present() && t.shape == shape;
    };
    const bool q_ok = c.q_lora_rank > 0 ? shaped(l.wq_a, {c.q_lora_rank, c.hidden_size}) &&
                                              shaped(l.q_a_norm, {c.q_lora_rank}) &&
                                              l.q_a_norm.dtype == DType::kF32 &&
                                              shaped(l.wq_b, {heads * c.head_dim, c.q_lora_rank})
                                        : shaped(l.wq, {heads * c.head_dim, c.hidden_size});
    const bool ok =
        q_ok && shaped(l.wkv_a, {c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size}) &&
        shaped(l.kv_a_norm, {c.kv_lora_rank}) && l.kv_a_norm.dtype == DType::kF32 &&
        shaped(l.wkv_b, {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}) &&
        shaped(l.wo, {c.hidden_size, heads * c.v_head_dim});
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("LlamaModel: layer ", i,
                       " lacks multi-head latent attention weights of the config's "
                       "shapes (q_a/q_b or q, kv_a, kv_a_norm, kv_b, o)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

LlamaModel::LlamaModel(const ModelWeights* weights, cpu::ThreadPool* pool, AllReduceFn all_reduce)
    : weights_(weights), pool_(pool), all_reduce_(std::move(all_reduce)) {}

LlamaModel::~LlamaModel() = default;

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelWeights* weights,
                                                               cpu::ThreadPool* pool,
                                                               AllReduceFn all_reduce,
                                                               Backend* backend,
                                                               bool all_reduce_enqueues) {
  if (weights == nullptr) return absl::InvalidArgumentError("LlamaModel: no weights");
  if (absl::Status s = weights->config.Validate(); !s.ok()) return s;
  if (static_cast<int>(weights->layers.size()) != weights->config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LlamaModel: ", weights->layers.size(),
                                                   " layers loaded, config says ",
                                                   weights->config.num_layers));
  }
  if (weights->config.qk_norm) {
    const int64_t head_dim = weights->config.head_dim;
    for (size_t i = 0; i < weights->layers.size(); ++i) {
      const LayerWeights& l = weights->layers[i];
      if (l.q_norm.numel() != head_dim || l.k_norm.numel() != head_dim ||
          l.q_norm.dtype != DType::kF32 || l.k_norm.dtype != DType::kF32) {
        return absl::InvalidArgumentError(absl::StrCat("LlamaModel: layer ", i,
                                                       " needs f32 q_norm and k_norm weights of ",
                                                       head_dim, " elements (head_dim)"));
      }
    }
  }
  if (absl::Status s = CheckExperts(*weights); !s.ok()) return s;
  if (absl::Status s = CheckMla(*weights); !s.ok()) return s;
  std::unique_ptr<LlamaModel> model(new LlamaModel(weights, pool, std::move(all_reduce)));
  model->all_reduce_enqueues_ = model->all_reduce_ != nullptr && all_reduce_enqueues;
  if (backend == nullptr) {
    model->owned_backend_ = std::make_unique<cpu::CpuBackend>(pool);
    backend = model->owned_backend_.get();
  }
  model->backend_ = backend;
  model->act_dtype_ = backend->activation_dtype();
  if (model->act_dtype_ != DType::kF32 && model->act_dtype_ != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("LlamaModel: activations in ",
                                                   std::string(DTypeName(model->act_dtype_)),
                                                   " are not supported (f32 or bf16)"));
  }
  model->act_bytes_ = model->act_dtype_ == DType::kF32 ? 4 : 2;
  model->inv_freq_ = ComputeRopeInvFreq(weights->config, weights->rope_freqs);
  if (absl::Status s = model->PrepareWeights(); !s.ok()) return s;
  return model;
}

absl::Status LlamaModel::PrepareWeights() {
  Backend& b = *backend_;
  auto matrix = [&b](const TensorView& t, PreparedMatrix* out,
                     MatrixUse use = MatrixUse::kMatmul) -> absl::Status {
    if (t.shape.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("weight '", t.name, "' is not a matrix"));
    }
    absl::StatusOr<PreparedMatrix> m =
        b.PrepareMatrix(t.data, t.dtype, t.shape[0], t.shape[1], use);
    if (!m.ok()) return m.status();
    *out = std::move(*m);
    return absl::OkStatus();
  };
  auto vector = [&b](const TensorView& t, PreparedVector* out) -> absl::Status {
    if (!t.present()) return absl::OkStatus();  // absent bias
    absl::StatusOr<PreparedVector> v = b.PrepareVector(static_cast<const float*>(t.data),
                                                       t.numel());
    if (!v.ok()) return v.status();
    *out = std::move(*v);
    return absl::OkStatus();
  };
  const ModelConfig& c = weights_->config;
  // A pipeline stage holds the embedding only when it embeds tokens or computes logits with it.
  if (weights_->token_embedding.present()) {
    if (absl::Status s = matrix(weights_->token_embedding, &embedding_, MatrixUse::kEmbedding);
        !s.ok()) {
      return s;
    }
  } else if (c.first_stage()) {
    return absl::InvalidArgumentError("LlamaModel: no token embedding");
  }
  if (!c.last_stage()) {
    // No output layer: the stage hands its stream on.
  } else if (!weights_->output.present()) {
    return absl::InvalidArgumentError("LlamaModel: no output layer");
  } else if (weights_->output.data == weights_->token_embedding.data && !b.host_memory()) {
    // Tied embedding: one device copy serves the gather and the vocabulary projection.
    output_.data = embedding_.data;
    output_.dtype = embedding_.dtype;
    output_.rows = embedding_.rows;
    output_.cols = embedding_.cols;
  } else if (absl::Status s = matrix(weights_->output, &output_, MatrixUse::kMatmulKeepPrecision);
             !s.ok()) {
    return s;
  }
  if (absl::Status s = vector(weights_->final_norm, &final_norm_); !s.ok()) return s;
  absl::StatusOr<PreparedVector> f =
      b.PrepareVector(inv_freq_.data(), static_cast<int64_t>(inv_freq_.size()));
  if (!f.ok()) return f.status();
  inv_freq_dev_ = std::move(*f);
  // Device backends copy the weights anyway: stack q/k/v and gate/up so each takes one GEMM.
  // (The CPU reads the mapped file in place, so it keeps them apart.)
  const bool stack = !b.host_memory();
  auto stackable = [](std::initializer_list<const TensorView*> parts) {
    const TensorView& first = **parts.begin();
    for (const TensorView* p : parts) {
      if (!p->present() || p->shape.size() != 2 || p->dtype != first.dtype ||
          p->shape[1] != first.shape[1]) {
        return false;
      }
    }
    return true;
  };
  auto stacked = [&b](std::initializer_list<const TensorView*> parts,
                      PreparedMatrix* out) -> absl::Status {
    const TensorView& first = **parts.begin();
    int64_t rows = 0;
    for (const TensorView* p : parts) rows += p->shape[0];
    std::vector<uint8_t> host(static_cast<size_t>(rows * first.row_bytes()));
    size_t at = 0;
    for (const TensorView* p : parts) {
      std::memcpy(host.data() + at, p->data, static_cast<size_t>(p->nbytes()));
      at += static_cast<size_t>(p->nbytes());
    }
    absl::StatusOr<PreparedMatrix> m =
        b.PrepareMatrix(host.data(), first.dtype, rows, first.shape[1], MatrixUse::kMatmul);
    if (!m.ok()) return m.status();
    *out = std::move(*m);
    return absl::OkStatus();
  };
  layers_.resize(weights_->layers.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerWeights& w = weights_->layers[i];
    Layer& l = layers_[i];
    const bool biases = w.bq.present() && w.bk.present() && w.bv.present();
    const bool no_biases = !w.bq.present() && !w.bk.present() && !w.bv.present();
    if (stack && !c.is_mla() && !c.qk_norm && (biases || no_biases) &&
        stackable({&w.wq, &w.wk, &w.wv})) {
      if (absl::Status s = stacked({&w.wq, &w.wk, &w.wv}, &l.w_qkv); !s.ok()) return s;
      if (biases) {
        std::vector<float> bias;
        for (const TensorView* t : {&w.bq, &w.bk, &w.bv}) {
          const float* f = static_cast<const float*>(t->data);
          bias.insert(bias.end(), f, f + t->numel());
        }
        absl::StatusOr<PreparedVector> v =
            b.PrepareVector(bias.data(), static_cast<int64_t>(bias.size()));
        if (!v.ok()) return v.status();
        l.b_qkv = std::move(*v);
      }
    }
    const bool qkv_stacked = l.w_qkv.rows > 0;
    for (auto [t, v] : {std::pair{&w.attn_norm, &l.attn_norm},
                        {&w.ffn_norm, &l.ffn_norm},
                        {qkv_stacked ? nullptr : &w.bq, &l.bq},
                        {qkv_stacked ? nullptr : &w.bk, &l.bk},
                        {qkv_stacked ? nullptr : &w.bv, &l.bv},
                        {&w.bo, &l.bo},
                        {&w.q_norm, &l.q_norm},
                        {&w.k_norm, &l.k_norm},
                        {&w.q_a_norm, &l.q_a_norm},
                        {&w.kv_a_norm, &l.kv_a_norm}}) {
      if (t == nullptr) continue;
      if (absl::Status s = vector(*t, v); !s.ok()) return s;
    }
    // Absent matrices (MLA's wk / wv, its wq or q_a / q_b) stay empty.
    for (auto [t, m] : {std::pair{qkv_stacked ? nullptr : &w.wq, &l.wq},
                        {qkv_stacked ? nullptr : &w.wk, &l.wk},
                        {qkv_stacked ? nullptr : &w.wv, &l.wv},
                        {&w.wo, &l.wo},
                        {&w.wq_a, &l.wq_a},
                        {&w.wq_b, &l.wq_b},
                        {&w.wkv_a, &l.wkv_a}}) {
      if (t == nullptr || !t->present()) continue;
      if (absl::Status s = matrix(*t, m); !s.ok()) return s;
    }
    if (weights_->config.is_mla()) {
      if (absl::Status s = PrepareMla(w, l); !s.ok()) return s;
    }
    l.moe = weights_->config.is_moe_layer(static_cast<int>(i));
    if (!l.moe) {
      if (stack && stackable({&w.w_gate, &w.w_up})) {
        if (absl::Status s = stacked({&w.w_gate, &w.w_up}, &l.w_gate_up); !s.ok()) return s;
        if (absl::Status s = matrix(w.w_down, &l.w_down); !s.ok()) return s;
        continue;
      }
      for (auto [t, m] :
           {std::pair{&w.w_gate, &l.w_gate}, {&w.w_up, &l.w_up}, {&w.w_down, &l.w_down}}) {
        if (absl::Status s = matrix(*t, m); !s.ok()) return s;
      }
      continue;
    }
    if (absl::Status s = matrix(w.router, &l.router, MatrixUse::kMatmulKeepPrecision); !s.ok()) {
      return s;
    }
    l.router_bias = w.router_bias.present() ? F32(w.router_bias) : nullptr;
    if (w.shared.w_gate.present()) {
      for (auto [t, m] : {std::pair{&w.shared.w_gate, &l.shared.w_gate},
                          {&w.shared.w_up, &l.shared.w_up},
                          {&w.shared.w_down, &l.shared.w_down}}) {
        if (absl::Status s = matrix(*t, m); !s.ok()) return s;
      }
    }
    l.experts.resize(w.experts.size());
    for (size_t e = 0; e < w.experts.size(); ++e) {
      const ExpertWeights& x = w.experts[e];
      Expert& y = l.experts[e];
      for (auto [t, m] :
           {std::pair{&x.w_gate, &y.w_gate}, {&x.w_up, &y.w_up}, {&x.w_down, &y.w_down}}) {
        if (absl::Status s = matrix(*t, m); !s.ok()) return s;
      }
    }
  }
  return b.Synchronize();
}

absl::Status LlamaModel::PrepareMla(const LayerWeights& w, Layer& l) {
  const ModelConfig& c = weights_->config;
  const int64_t rank = c.kv_lora_rank;
  const int64_t rope = c.qk_rope_head_dim;
  const int64_t nope = c.qk_nope_head_dim;
  const int64_t v_dim = c.v_head_dim;
  const TensorView& kv_b = w.wkv_b;  // per head: nope rows of W_UK, then v_dim rows of W_UV
  // The absorbed-query matrices keep kv_b's dtype when it holds plain floats (the identity and
  // zeros are exact in each), else f32: a quantized copy would change W_UK's values.
  const DType dtype =
      kv_b.dtype == DType::kBF16 || kv_b.dtype == DType::kF16 ? kv_b.dtype : DType::kF32;
  const int64_t rows = rank + rope;
  const int64_t cols = nope + rope;
  const int64_t row_bytes = DTypeRowBytes(dtype, cols);
  const auto* src = static_cast<const uint8_t*>(kv_b.data);
  std::vector<float> uk(static_cast<size_t>(nope * rank));  // one head's W_UK, [nope, rank]
  std::vector<float> row(static_cast<size_t>(cols));
  l.w_q_absorb.clear();
  l.w_uv.clear();
  for (int64_t h = 0; h < c.num_heads; ++h) {
    const int64_t first = h * (nope + v_dim);
    for (int64_t j = 0; j < nope; ++j) {
      cpu::ConvertRowToF32(src + (first + j) * kv_b.row_bytes(), kv_b.dtype, rank,
                           uk.data() + j * rank);
    }
    std::vector<uint8_t>& storage = absorb_storage_.emplace_back(rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(row.begin(), row.end(), 0.0f);
      if (r < rank) {
        for (int64_t j = 0; j < nope; ++j) row[j] = uk[j * rank + r];
      } else {
        row[nope + (r - rank)] = 1.0f;
      }
      cpu::ConvertRowFromF32(row.data(), cols, dtype, storage.data() + r * row_bytes);
    }
    absl::StatusOr<PreparedMatrix> absorb =
        backend_->PrepareMatrix(storage.data(), dtype, rows, cols, MatrixUse::kMatmul);
    if (!absorb.ok()) return absorb.status();
    l.w_q_absorb.push_back(std::move(*absorb));
    absl::StatusOr<PreparedMatrix> uv = backend_->PrepareMatrix(
        src + (first + nope) * kv_b.row_bytes(), kv_b.dtype, v_dim, rank, MatrixUse::kMatmul);
    if (!uv.ok()) return uv.status();
    l.w_uv.push_back(std::move(*uv));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::EnsureWorkspace(int64_t num_tokens) {
  if (num_tokens <= workspace_tokens_) return absl::OkStatus();
  const ModelConfig& c = weights_->config;
  const int64_t heads = c.num_heads;
  const bool mla = c.is_mla();
  // MLA: q_ holds the absorbed queries and k_ the new latent rows (both cache-row wide), v_
  // nothing, attn_out_ the heads' values after W_UV.
  const int64_t row = c.kv_cache_dim();
  const int64_t q_dim = mla ? heads * row : heads * c.head_dim;
  const int64_t k_dim = mla ? row : int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t v_dim = mla ? 0 : k_dim;
  const int64_t out_dim = mla ? heads * c.v_head_dim : q_dim;
  int64_t ffn = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    ffn = std::max<int64_t>(ffn, c.is_moe_layer(layer) ? int64_t{c.moe_intermediate_size} *
                                                             std::max(1, c.n_shared_experts)
                                                       : c.intermediate_size);
  }
  const int64_t moe_in = c.is_moe() ? int64_t{c.num_experts_per_tok} * c.hidden_size : 0;
  const int64_t moe_out =
      c.is_moe() ? int64_t{c.num_experts_per_tok + (c.n_shared_experts > 0 ? 1 : 0)} * c.hidden_size
                 : 0;
  const int64_t q_lora = mla ? c.q_lora_rank : 0;
  const int64_t q_heads = mla ? heads * c.head_dim : 0;
  const int64_t latent_out = mla ? heads * row : 0;
  const int64_t sizes[] = {
      c.hidden_size, c.hidden_size, c.hidden_size, q_dim,  k_dim,   v_dim,  out_dim, ffn,       ffn,
      c.hidden_size, c.hidden_size, c.num_experts, moe_in, moe_out, q_lora, q_heads, latent_out};
  float** slices[] = {&hidden_,      &delta_,         &normed_,    &q_,          &k_,
                      &v_,           &attn_out_,      &gate_,      &up_,         &final_rows_,
                      &final_delta_, &router_logits_, &expert_in_, &expert_out_, &q_lora_,
                      &q_heads_,     &latent_out_};
  // The residual stream, what adds into it, and the router logits are f32 on every backend; the
  // rest holds activations (act_dtype_).
  auto element_bytes = [this](float** slice) -> int64_t {
    const bool f32 = slice == &hidden_ || slice == &delta_ || slice == &final_rows_ ||
                     slice == &final_delta_ || slice == &router_logits_ || slice == &expert_out_;
    return f32 ? int64_t{sizeof(float)} : act_bytes_;
  };
  int64_t bytes = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    bytes += Aligned(num_tokens * sizes[i] * element_bytes(slices[i]));
  }
  if (absl::Status s = GrowTracked(&workspace_, bytes); !s.ok()) return s;
  auto* base = workspace_.as<uint8_t>();
  for (size_t i = 0; i < std::size(sizes); ++i) {
    *slices[i] = reinterpret_cast<float*>(base);
    base += Aligned(num_tokens * sizes[i] * element_bytes(slices[i]));
  }
  workspace_tokens_ = num_tokens;
  return absl::OkStatus();
}

absl::Status LlamaModel::CheckBatch(const ForwardBatch& b, const KvCache& cache) const {
  const int64_t t = static_cast<int64_t>(b.tokens.size());
  if (t == 0) return absl::InvalidArgumentError("ForwardBatch: no tokens");
  if (b.positions.size() != b.tokens.size() || b.slot_mapping.size() != b.tokens.size()) {
    return absl::InvalidArgumentError("ForwardBatch: positions/slot_mapping size != tokens size");
  }
  if (b.q_len.size() != b.q_start.size() || b.context_len.size() != b.q_start.size()) {
    return absl::InvalidArgumentError("ForwardBatch: per-sequence arrays differ in size");
  }
  if (cache.num_layers() != weights_->config.num_layers) {
    return absl::InvalidArgumentError("ForwardBatch: KV cache made for another model");
  }
  const int vocab = weights_->config.vocab_size;
  for (TokenId id : b.tokens) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary of ",
                                                     vocab));
    }
  }
  const int64_t slots = cache.num_blocks() * cache.block_size();
  for (int64_t slot : b.slot_mapping) {
    if (slot < 0 || slot >= slots) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: slot ", slot, " outside the cache"));
    }
  }
  for (int32_t row : b.logits_rows) {
    if (row < 0 || row >= t) return absl::InvalidArgumentError("ForwardBatch: bad logits row");
  }
  for (size_t s = 0; s < b.q_start.size(); ++s) {
    if (b.q_start[s] < 0 || b.q_len[s] <= 0 || b.q_start[s] + b.q_len[s] > t ||
        b.context_len[s] < b.q_len[s] || b.context_len[s] > weights_->config.max_position_embeddings ||
        (b.context_len[s] + cache.block_size() - 1) / cache.block_size() > b.block_table_stride) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: sequence ", s, " is inconsistent"));
    }
  }
  return absl::OkStatus();
}

LlamaModel::StagedBatch LlamaModel::StagedAt(const uint8_t* base, const int64_t* offsets) {
  auto i32 = [&](int i) { return reinterpret_cast<const int32_t*>(base + offsets[i]); };
  return StagedBatch{i32(1), i32(2), reinterpret_cast<const int64_t*>(base + offsets[0]),
                     i32(3), i32(4), i32(5), i32(6), i32(7)};
}

absl::Status LlamaModel::GrowTracked(DeviceBuffer* buffer, int64_t bytes) {
  bool moved = false;
  absl::Status s = Grow(*backend_, buffer, bytes, &moved);
  if (moved) ++buffers_epoch_;
  return s;
}

absl::StatusOr<LlamaModel::StagedBatch> LlamaModel::Stage(const ForwardBatch& b) {
  const int64_t seqs = static_cast<int64_t>(b.q_start.size());
  const int64_t table_entries = seqs * b.block_table_stride;
  if (backend_->host_memory()) {
    return StagedBatch{b.tokens.data(),  b.positions.data(), b.slot_mapping.data(),
                       b.q_start.data(), b.q_len.data(),     b.context_len.data(),
                       b.block_tables,   b.logits_rows.data()};
  }
  // One host staging area, one copy.
  const int64_t tokens = static_cast<int64_t>(b.tokens.size());
  const int64_t rows = static_cast<int64_t>(b.logits_rows.size());
  const StagingLayout layout = LayoutStaging(tokens, seqs, table_entries, rows);
  const void* sources[8] = {b.slot_mapping.data(), b.tokens.data(),  b.positions.data(),
                            b.q_start.data(),      b.q_len.data(),   b.context_len.data(),
                            b.block_tables,        b.logits_rows.data()};
  std::vector<uint8_t> host(static_cast<size_t>(layout.total));
  for (int i = 0; i < 8; ++i) {
    if (layout.bytes[i] > 0) {
      std::memcpy(host.data() + layout.offsets[i], sources[i], layout.bytes[i]);
    }
  }
  if (absl::Status s = Grow(*backend_, &staging_, layout.total); !s.ok()) return s;
  if (absl::Status s = backend_->CopyToDevice(staging_.get(), host.data(), layout.total);
      !s.ok()) {
    return s;
  }
  return StagedAt(staging_.as<uint8_t>(), layout.offsets);
}

void LlamaModel::Linear(const float* x, const PreparedMatrix& w, const PreparedVector& bias,
                        float* y, int64_t m, Out out) {
  LinearStrided(x, w.cols, w, y, w.rows, m, bias, out);
}

void LlamaModel::LinearStrided(const float* x, int64_t x_stride, const PreparedMatrix& w, float* y,
                               int64_t y_stride, int64_t m, const PreparedVector& bias, Out out) {
  cpu::MatmulArgs args{};
  args.x = x;
  args.x_stride = x_stride;
  args.w = w.data;
  args.w_dtype = w.dtype;
  args.w_packed = w.packed;
  args.w_scale = w.scales;
  args.bias = bias.data;
  args.y = y;
  args.y_stride = y_stride;
  args.m = m;
  args.n = w.rows;
  args.k = w.cols;
  args.x_dtype = act_dtype_;
  args.y_dtype = out == Out::kF32 ? DType::kF32 : act_dtype_;
  backend_->Matmul(args);
}

void LlamaModel::SwiGluStacked(const float* x, const PreparedMatrix& gate_up,
                               const PreparedMatrix& down, float* out, int64_t rows) {
  const int64_t width = gate_up.rows / 2;
  LinearStrided(x, gate_up.cols, gate_up, gate_, 2 * width, rows, PreparedVector{});
  backend_->SiluMul({gate_, ActAt(gate_, width), gate_, rows, width, 2 * width, 2 * width,
                     2 * width, act_dtype_});
  LinearStrided(gate_, 2 * width, down, out, down.rows, rows, PreparedVector{}, Out::kF32);
}

void LlamaModel::SwiGlu(const float* x, const PreparedMatrix& gate, const PreparedMatrix& up,
                        const PreparedMatrix& down, float* out, int64_t rows) {
  const int64_t width = gate.rows;
  Linear(x, gate, PreparedVector{}, gate_, rows);
  Linear(x, up, PreparedVector{}, up_, rows);
  backend_->SiluMul({gate_, up_, gate_, rows, width, width, width, width, act_dtype_});
  Linear(gate_, down, PreparedVector{}, out, rows, Out::kF32);
}

void LlamaModel::Norm(float* x, const float* residual, const PreparedVector& weight, float* y,
                      int64_t rows) {
  const ModelConfig& c = weights_->config;
  cpu::RmsNormArgs args{};
  args.x = x;
  args.residual = residual;
  args.weight = weight.data;
  args.y = y;
  args.rows = rows;
  args.dim = c.hidden_size;
  args.eps = c.rms_norm_eps;
  args.x_stride = c.hidden_size;
  args.y_stride = c.hidden_size;
  args.y_dtype = act_dtype_;  // x and the residual are the f32 stream
  backend_->RmsNorm(args);
}

void LlamaModel::NormRows(float* x, int64_t stride, const PreparedVector& weight, int64_t dim,
                          int64_t rows) {
  // Each row is normed alone, so its result depends on that row only, whatever the batch.
  cpu::RmsNormArgs args{};
  args.x = x;
  args.weight = weight.data;
  args.y = x;
  args.rows = rows;
  args.dim = dim;
  args.eps = weights_->config.rms_norm_eps;
  args.x_stride = stride;
  args.y_stride = stride;
  args.x_dtype = act_dtype_;
  args.y_dtype = act_dtype_;
  backend_->RmsNorm(args);
}

AttentionPlan LlamaModel::Plan(int64_t seqs, int64_t max_q_len, int64_t max_context_len,
                               const KvCache& cache) const {
  AttentionShape shape;
  shape.num_seqs = seqs;
  shape.num_heads = weights_->config.num_heads;
  shape.max_q_len = max_q_len;
  shape.max_context_len = max_context_len;
  shape.layout = cache.layout();
  shape.context_capacity = weights_->config.max_position_embeddings;
  return backend_->PlanAttention(shape);
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, KvCache& cache, float* logits,
                                 const StageIo& io) {
  return ForwardTo(batch, cache, LogitsTarget{logits, false}, io);
}

absl::Status LlamaModel::ForwardKeepingLogits(const ForwardBatch& batch, KvCache& cache) {
  if (backend_->host_memory()) {
    return absl::FailedPreconditionError(
        "logits stay on the device only on a backend with device memory");
  }
  return ForwardTo(batch, cache, LogitsTarget{nullptr, true}, StageIo{});
}

absl::Status LlamaModel::ForwardTo(const ForwardBatch& batch, KvCache& cache, LogitsTarget logits,
                                   const StageIo& io) {
  if (absl::Status s = CheckBatch(batch, cache); !s.ok()) return s;
  const ModelConfig& config = weights_->config;
  if (!config.first_stage() && io.input == nullptr && io.link == nullptr) {
    return absl::InvalidArgumentError("pipeline stage: no hand-over from the previous stage");
  }
  if (!config.last_stage() && logits.wanted()) {
    return absl::InvalidArgumentError("pipeline stage: only the last stage computes logits");
  }
  const bool decode = std::all_of(batch.q_len.begin(), batch.q_len.end(),
                                  [](int32_t n) { return n == 1; });
  // Tensor-parallel ranks after the first compute no logits: their graphs hold the layers alone.
  const bool graph_rank = logits.wanted() || (all_reduce_enqueues_ && config.last_stage());
  if (graphs_enabled_ && graph_rank && decode) {
    if (GraphableDecode(batch)) {
      // A failed capture switches graphs off (graph_error_ says why) after the step ran eagerly.
      return ForwardDecodeGraph(batch, cache, logits);
    } else {
      ++graph_stats_.eager_decodes;
    }
  }
  const ModelConfig& c = weights_->config;
  const int64_t t = static_cast<int64_t>(batch.tokens.size());
  if (absl::Status s = EnsureWorkspace(t); !s.ok()) return s;
  absl::StatusOr<StagedBatch> staged = Stage(batch);
  if (!staged.ok()) return staged.status();

  Step step;
  step.staged = *staged;
  step.tokens = t;
  step.seqs = static_cast<int64_t>(batch.q_start.size());
  step.table_stride = batch.block_table_stride;
  step.logits_rows = logits.wanted() ? static_cast<int64_t>(batch.logits_rows.size()) : 0;
  int64_t max_q_len = 0;
  int64_t max_context_len = 0;
  for (size_t s = 0; s < batch.q_start.size(); ++s) {
    max_q_len = std::max<int64_t>(max_q_len, batch.q_len[s]);
    max_context_len = std::max<int64_t>(max_context_len, batch.context_len[s]);
  }
  step.plan = Plan(step.seqs, max_q_len, max_context_len, cache);

  if (step.logits_rows == 0) {
    if (absl::Status s = Enqueue(step, cache, nullptr, io); !s.ok()) return s;
    if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
    if (config.last_stage()) return absl::OkStatus();
    if (io.link != nullptr) {
      // Straight to the next stage's device, in the order its Enqueue receives them.
      if (absl::Status s = io.link->Send(hidden_, t * c.hidden_size); !s.ok()) return s;
      return io.link->Send(delta_, t * c.hidden_size);
    }
    if (io.output == nullptr) return absl::OkStatus();
    const size_t rows = static_cast<size_t>(t * c.hidden_size) * sizeof(float);
    if (absl::Status s = backend_->CopyToHost(io.output, hidden_, rows); !s.ok()) return s;
    return backend_->CopyToHost(io.output + t * c.hidden_size, delta_, rows);
  }
  if (backend_->host_memory()) {
    if (absl::Status s = Enqueue(step, cache, logits.host, io); !s.ok()) return s;
    return backend_->Synchronize();
  }
  const int64_t bytes = step.logits_rows * c.vocab_size * int64_t{sizeof(float)};
  if (absl::Status s = GrowTracked(&device_logits_, bytes); !s.ok()) return s;
  if (absl::Status s = Enqueue(step, cache, device_logits_.as<float>(), io); !s.ok()) return s;
  if (logits.host == nullptr) return backend_->Synchronize();  // kept on the device
  return backend_->CopyToHost(logits.host, device_logits_.get(), static_cast<size_t>(bytes));
}

absl::Status LlamaModel::Enqueue(const Step& step, KvCache& cache, float* device_logits,
                                 const StageIo& io) {
  const ModelConfig& c = weights_->config;
  const int64_t h = c.hidden_size;
  const int64_t t = step.tokens;
  if (c.first_stage()) {
    backend_->Embedding({embedding_.data, embedding_.dtype, h, step.staged.tokens, t, hidden_});
  } else if (io.link != nullptr) {
    // The previous stage's stream and pending block output, device to device; the first layer
    // adds them. Synchronous: nothing on this stream reads them before they are here.
    if (absl::Status s = io.link->Recv(hidden_, t * h); !s.ok()) return s;
    if (absl::Status s = io.link->Recv(delta_, t * h); !s.ok()) return s;
  } else {
    // The previous stage's stream and pending block output; the first layer adds them.
    const size_t rows = static_cast<size_t>(t * h) * sizeof(float);
    if (absl::Status s = backend_->CopyToDevice(hidden_, io.input, rows); !s.ok()) return s;
    if (absl::Status s = backend_->CopyToDevice(delta_, io.input + t * h, rows); !s.ok()) return s;
  }
  for (int layer = 0; layer < c.num_layers; ++layer) {
    if (absl::Status s = RunLayer(layer, step, cache); !s.ok()) return s;
  }
  // Only the rows that need logits go through the final norm and the vocabulary projection:
  // gather them (an f32 "embedding" of the stream), then add the last MLP output in the norm.
  const int64_t rows = step.logits_rows;
  if (rows == 0 || device_logits == nullptr) return absl::OkStatus();
  backend_->Embedding({hidden_, DType::kF32, h, step.staged.logits_rows, rows, final_rows_});
  backend_->Embedding({delta_, DType::kF32, h, step.staged.logits_rows, rows, final_delta_});
  Norm(final_rows_, final_delta_, final_norm_, normed_, rows);
  Linear(normed_, output_, PreparedVector{}, device_logits, rows, Out::kF32);
  return absl::OkStatus();
}

bool LlamaModel::GraphableDecode(const ForwardBatch& b) const {
  const int64_t n = static_cast<int64_t>(b.q_start.size());
  if (n > graph_options_.max_batch || static_cast<int64_t>(b.tokens.size()) != n ||
      static_cast<int64_t>(b.logits_rows.size()) != n) {
    return false;
  }
  for (int64_t s = 0; s < n; ++s) {
    if (b.q_start[s] != s || b.logits_rows[s] != s ||
        b.context_len[s] > graph_options_.max_context_len) {
      return false;
    }
  }
  return true;
}

absl::Status LlamaModel::ForwardDecodeGraph(const ForwardBatch& b, KvCache& cache,
                                            LogitsTarget logits) {
  const ModelConfig& c = weights_->config;
  const int64_t n = static_cast<int64_t>(b.q_start.size());
  const size_t index = static_cast<size_t>(
      std::lower_bound(graph_sizes_.begin(), graph_sizes_.end(), n) - graph_sizes_.begin());
  const int64_t padded = graph_sizes_[index];
  const int64_t stride = graph_options_.block_table_stride;

  // The padded batch, written into the fixed staging image: real sequences first, then padding
  // sequences of one token at position 0 whose K/V lands in (and whose attention reads) slot 0
  // of the null block.
  uint8_t* host = graph_host_.data();
  auto at = [&](int part) { return host + graph_offsets_[part]; };
  auto* slots = reinterpret_cast<int64_t*>(at(0));
  auto* tokens = reinterpret_cast<int32_t*>(at(1));
  auto* positions = reinterpret_cast<int32_t*>(at(2));
  auto* q_start = reinterpret_cast<int32_t*>(at(3));
  auto* q_len = reinterpret_cast<int32_t*>(at(4));
  auto* context_len = reinterpret_cast<int32_t*>(at(5));
  auto* tables = reinterpret_cast<int32_t*>(at(6));
  auto* rows = reinterpret_cast<int32_t*>(at(7));
  const int64_t copied = std::min(stride, b.block_table_stride);
  for (int64_t s = 0; s < padded; ++s) {
    const bool real = s < n;
    slots[s] = real ? b.slot_mapping[s] : 0;
    tokens[s] = real ? b.tokens[s] : 0;
    positions[s] = real ? b.positions[s] : 0;
    q_start[s] = static_cast<int32_t>(s);
    q_len[s] = 1;
    context_len[s] = real ? b.context_len[s] : 1;
    rows[s] = static_cast<int32_t>(s);
    int32_t* table = tables + s * stride;
    std::fill(table, table + stride, 0);
    if (real) std::copy_n(b.block_tables + s * b.block_table_stride, copied, table);
  }
  // Everything but the block tables, then this batch's rows of them (the last part).
  const int64_t used =
      graph_offsets_[kBlockTablesPart] + padded * stride * int64_t{sizeof(int32_t)};
  if (absl::Status s = backend_->CopyToDevice(graph_staging_.get(), host, used); !s.ok()) {
    return s;
  }

  Step step;
  step.staged = StagedAt(graph_staging_.as<uint8_t>(), graph_offsets_);
  step.tokens = padded;
  step.seqs = padded;
  step.table_stride = stride;
  step.logits_rows = logits.wanted() ? padded : 0;
  step.plan = Plan(padded, 1, graph_options_.max_context_len, cache);
  float* out = logits.wanted() ? device_logits_.as<float>() : nullptr;

  DecodeGraph& graph = graphs_[index];
  bool ran_eagerly = false;
  if (graph.handle < 0 || graph.backend_epoch != backend_->memory_epoch() ||
      graph.buffers_epoch != buffers_epoch_ || graph.cache != &cache) {
    if (graph.handle >= 0) backend_->DestroyGraph(graph.handle);
    graph = DecodeGraph{};
    // Run the step eagerly first: the backend sizes its scratch for this shape now, since
    // nothing may be allocated while capturing. That run is this step's result: the graph is
    // not launched for it (a tensor-parallel rank would run its collectives twice).
    if (absl::Status s = Enqueue(step, cache, out); !s.ok()) return s;
    if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
    ran_eagerly = true;
    absl::Status captured = backend_->BeginCapture();
    if (captured.ok()) {
      captured = Enqueue(step, cache, out);
      absl::StatusOr<int> handle = backend_->EndCapture();
      if (captured.ok()) captured = handle.status();
      if (captured.ok()) {
        graph = DecodeGraph{*handle, backend_->memory_epoch(), buffers_epoch_, &cache};
        ++graph_stats_.captures;
      }
    }
    if (!captured.ok()) {
      // The eager run above stands as this step's result; later steps run eagerly.
      graphs_enabled_ = false;
      graph_error_ = absl::StrCat("capturing the decode graph of batch ", padded,
                                  " failed: ", std::string(captured.message()));
    }
  }
  if (!ran_eagerly) {
    if (absl::Status s = backend_->LaunchGraph(graph.handle); !s.ok()) return s;
    ++graph_stats_.replays;
  }
  if (logits.host == nullptr) return backend_->Synchronize();  // none, or kept on the device
  return backend_->CopyToHost(logits.host, out,
                              static_cast<size_t>(n * c.vocab_size * int64_t{sizeof(float)}));
}

absl::Status LlamaModel::EnableDecodeGraphs(const DecodeGraphOptions& options) {
  const ModelConfig& c = weights_->config;
  if (!backend_->supports_graphs()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", std::string(backend_->name()), " backend cannot capture graphs"));
  }
  if (c.is_moe()) {
    return absl::FailedPreconditionError(
        "decode graphs are not available to mixture-of-experts models (routing reads the "
        "router's logits on the host between kernels)");
  }
  if (all_reduce_ && !all_reduce_enqueues_) {
    return absl::FailedPreconditionError(
        "decode graphs are not available to tensor-parallel ranks whose all-reduce synchronizes "
        "on the host between layers (CPU groups)");
  }
  if (!c.first_stage() || !c.last_stage()) {
    return absl::FailedPreconditionError(
        "decode graphs are not available to pipeline stages (their hand-over goes through the "
        "host)");
  }
  if (options.max_batch < 1 || options.max_batch > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode graph max_batch must be in [1, 4096], got ", options.max_batch));
  }
  if (options.max_context_len < 1 || options.max_context_len > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode graph max_context_len must be in [1, ", c.max_position_embeddings, "], got ",
        options.max_context_len));
  }
  if (options.block_table_stride < 1) {
    return absl::InvalidArgumentError("decode graph block_table_stride must be >= 1");
  }
  for (const DecodeGraph& g : graphs_) {
    if (g.handle >= 0) backend_->DestroyGraph(g.handle);
  }
  graph_options_ = options;
  graph_sizes_ = DecodeGraphBatchSizes(options.max_batch);
  graphs_.assign(graph_sizes_.size(), DecodeGraph{});
  const int64_t max_batch = options.max_batch;
  const StagingLayout layout =
      LayoutStaging(max_batch, max_batch, max_batch * options.block_table_stride, max_batch);
  std::copy_n(layout.offsets, 8, graph_offsets_);
  graph_host_.assign(static_cast<size_t>(layout.total), 0);
  // Sized for the largest graph up front, so capturing sizes one by one moves nothing.
  if (absl::Status s = Grow(*backend_, &graph_staging_, layout.total); !s.ok()) return s;
  if (absl::Status s = EnsureWorkspace(max_batch); !s.ok()) return s;
  if (absl::Status s =
          GrowTracked(&device_logits_, max_batch * c.vocab_size * int64_t{sizeof(float)});
      !s.ok()) {
    return s;
  }
  graph_error_.clear();
  graphs_enabled_ = true;
  return absl::OkStatus();
}

void LlamaModel::DisableDecodeGraphs() {
  for (DecodeGraph& g : graphs_) {
    if (g.handle >= 0) backend_->DestroyGraph(g.handle);
  }
  graphs_.clear();
  graphs_enabled_ = false;
}

absl::Status LlamaModel::RunLayer(int layer, const Step& step, KvCache& cache) {
  const ModelConfig& c = weights_->config;
  const int64_t t = step.tokens;
  const Layer& w = layers_[layer];
  const int64_t h = c.hidden_size;

  // Pre-attention norm; from layer 1 on it first adds the previous MLP output to the stream.
  Norm(hidden_, layer == 0 && c.first_stage() ? nullptr : delta_, w.attn_norm, normed_, t);

  if (c.is_mla()) {
    MlaAttention(layer, step, cache);
  } else {
    Attention(layer, step, cache);
  }
  Linear(attn_out_, w.wo, w.bo, delta_, t, Out::kF32);
  // Under tensor parallelism each rank holds some heads: their output projections add up.
  if (all_reduce_) {
    if (!all_reduce_enqueues_) {
      if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
    }
    if (absl::Status s = all_reduce_(delta_, t * h); !s.ok()) return s;
  }

  // Residual add fused into the post-attention norm.
  Norm(hidden_, delta_, w.ffn_norm, normed_, t);

  if (w.moe) {
    if (absl::Status s = MoeMlp(w, t); !s.ok()) return s;
  } else {
    DenseMlp(w, t);
  }
  // Each rank holds some MLP rows: their down projections add up.
  if (all_reduce_) {
    if (!all_reduce_enqueues_) {
      if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
    }
    return all_reduce_(delta_, t * h);
  }
  return absl::OkStatus();
}

void LlamaModel::Attention(int layer, const Step& step, KvCache& cache) {
  const ModelConfig& c = weights_->config;
  const StagedBatch& staged = step.staged;
  const int64_t t = step.tokens;
  const Layer& w = layers_[layer];
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;

  // q, k and v: three GEMMs, or one over the stacked matrix writing [t, q | k | v] over q_, k_
  // and v_ (adjacent in the workspace). On device backends their biases go to the RoPE + KV
  // write, which reads q/k/v anyway: no bias pass after the GEMM, and a bf16 q/k/v is rounded
  // once more there instead of in a kernel of its own (the CPU adds them in its matmul, as
  // before). Qwen3's qk-norm needs them before the norm, so it keeps them in the GEMMs.
  const bool bias_in_rope = !backend_->host_memory() && !c.qk_norm;
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const PreparedVector none;
  float* q = q_;
  float* k = k_;
  float* v = v_;
  int64_t q_stride = q_dim;
  int64_t kv_stride = kv_dim;
  if (w.w_qkv.rows > 0) {
    q_stride = kv_stride = q_dim + 2 * kv_dim;
    k = ActAt(q_, q_dim);
    v = ActAt(k, kv_dim);
    LinearStrided(normed_, c.hidden_size, w.w_qkv, q_, q_stride, t, bias_in_rope ? none : w.b_qkv);
    if (bias_in_rope && w.b_qkv.data != nullptr) {
      q_bias = w.b_qkv.data;
      k_bias = w.b_qkv.data + q_dim;
      v_bias = w.b_qkv.data + q_dim + kv_dim;
    }
  } else {
    Linear(normed_, w.wq, bias_in_rope ? none : w.bq, q_, t);
    Linear(normed_, w.wk, bias_in_rope ? none : w.bk, k_, t);
    Linear(normed_, w.wv, bias_in_rope ? none : w.bv, v_, t);
    if (bias_in_rope) {
      q_bias = w.bq.data;
      k_bias = w.bk.data;
      v_bias = w.bv.data;
    }
  }
  if (c.qk_norm) {
    // Qwen3: every (token, head) vector is one row.
    NormRows(q_, c.head_dim, w.q_norm, c.head_dim, t * c.num_heads);
    NormRows(k_, c.head_dim, w.k_norm, c.head_dim, t * c.num_kv_heads);
  }

  RopeKvWriteArgs rope{};
  rope.q = q;
  rope.k = k;
  rope.v = v;
  rope.num_tokens = t;
  rope.num_heads = c.num_heads;
  rope.q_stride = q_stride;
  rope.k_stride = kv_stride;
  rope.v_stride = kv_stride;
  rope.positions = staged.positions;
  rope.inv_freq = inv_freq_dev_.data;
  rope.rope_layout = c.rope_style == RopeStyle::kInterleaved ? cpu::RopeLayout::kInterleaved
                                                             : cpu::RopeLayout::kHalfSplit;
  rope.slot_mapping = staged.slot_mapping;
  rope.layout = cache.layout();
  rope.k_cache = cache.k(layer);
  rope.v_cache = cache.v(layer);
  rope.dtype = act_dtype_;
  rope.q_bias = q_bias;
  rope.k_bias = k_bias;
  rope.v_bias = v_bias;
  backend_->RopeKvWrite(rope);

  cpu::PagedAttentionArgs attn{};
  attn.q = q;
  attn.q_stride = q_stride;
  attn.out = attn_out_;
  attn.out_stride = q_dim;
  attn.num_seqs = step.seqs;
  attn.num_heads = c.num_heads;
  attn.q_start = staged.q_start;
  attn.q_len = staged.q_len;
  attn.context_len = staged.context_len;
  attn.block_tables = staged.block_tables;
  attn.block_table_stride = step.table_stride;
  attn.k_cache = cache.k(layer);
  attn.v_cache = cache.v(layer);
  attn.layout = cache.layout();
  attn.scale = c.attention_scale();
  attn.sliding_window = c.sliding_window;
  attn.act_dtype = act_dtype_;
  backend_->RunAttention(step.plan, attn);
}

// Multi-head latent attention (DeepSeek-V2/V3), in the absorbed form for prefill and decode
// alike, so a token's result does not depend on how its sequence was split into steps:
//  1. q per head (nope | rope) = q_b(q_a_norm(q_a x)), or q_proj x;
//  2. the new latent row = kv_a x: the first kv_lora_rank values RMS-normed (c_kv), then the
//     rope key k_pe;
//  3. per head, one matmul with [W_UK^T 0; 0 I] gives the absorbed query (W_UK^T q_nope | q_pe),
//     so q.k = q_nope.(W_UK c_kv) + q_pe.k_pe = q_absorbed.(c_kv | k_pe);
//  4. RoPE turns the rope parts of the absorbed queries and of the new rows, and the rows go to
//     the cache (one "kv head" shared by every query head);
//  5. attention reads each cached row as key and as value: a head's output is the
//     probability-weighted latent (its first kv_lora_rank values; the rope tail is unused);
//  6. per head, W_UV maps that latent to the head's v_head_dim values for o_proj.
void LlamaModel::MlaAttention(int layer, const Step& step, KvCache& cache) {
  const ModelConfig& c = weights_->config;
  const StagedBatch& staged = step.staged;
  const int64_t t = step.tokens;
  const Layer& w = layers_[layer];
  const int64_t heads = c.num_heads;
  const int64_t rank = c.kv_lora_rank;
  const int64_t row = c.kv_cache_dim();  // rank + rope
  const int64_t qk = c.head_dim;         // nope + rope
  const int64_t v_dim = c.v_head_dim;

  if (c.q_lora_rank > 0) {
    Linear(normed_, w.wq_a, PreparedVector{}, q_lora_, t);
    NormRows(q_lora_, c.q_lora_rank, w.q_a_norm, c.q_lora_rank, t);
    Linear(q_lora_, w.wq_b, PreparedVector{}, q_heads_, t);
  } else {
    Linear(normed_, w.wq, PreparedVector{}, q_heads_, t);
  }
  Linear(normed_, w.wkv_a, PreparedVector{}, k_, t);
  NormRows(k_, row, w.kv_a_norm, rank, t);  // the latent part of each new row
  for (int64_t h = 0; h < heads; ++h) {
    LinearStrided(ActAt(q_heads_, h * qk), heads * qk, w.w_q_absorb[h], ActAt(q_, h * row),
                  heads * row, t);
  }

  RopeKvWriteArgs rope{};
  rope.q = q_;
  rope.k = k_;
  rope.v = nullptr;
  rope.num_tokens = t;
  rope.num_heads = heads;
  rope.q_stride = heads * row;
  rope.k_stride = row;
  rope.v_stride = 0;
  rope.positions = staged.positions;
  rope.inv_freq = inv_freq_dev_.data;
  rope.rope_layout = c.rope_style == RopeStyle::kInterleaved ? cpu::RopeLayout::kInterleaved
                                                             : cpu::RopeLayout::kHalfSplit;
  rope.slot_mapping = staged.slot_mapping;
  rope.layout = cache.layout();
  rope.k_cache = cache.k(layer);
  rope.rotary_dim = c.qk_rope_head_dim;
  rope.dtype = act_dtype_;
  backend_->RopeKvWrite(rope);

  cpu::PagedAttentionArgs attn{};
  attn.q = q_;
  attn.q_stride = heads * row;
  attn.out = latent_out_;
  attn.out_stride = heads * row;
  attn.num_seqs = step.seqs;
  attn.num_heads = heads;
  attn.q_start = staged.q_start;
  attn.q_len = staged.q_len;
  attn.context_len = staged.context_len;
  attn.block_tables = staged.block_tables;
  attn.block_table_stride = step.table_stride;
  attn.k_cache = cache.k(layer);
  attn.v_cache = cache.k(layer);  // the latent row is the value too
  attn.layout = cache.layout();
  attn.scale = c.attention_scale();
  attn.sliding_window = 0;
  attn.act_dtype = act_dtype_;
  backend_->RunAttention(step.plan, attn);

  for (int64_t h = 0; h < heads; ++h) {
    LinearStrided(ActAt(latent_out_, h * row), heads * row, w.w_uv[h], ActAt(attn_out_, h * v_dim),
                  heads * v_dim, t);
  }
}

void LlamaModel::DenseMlp(const Layer& w, int64_t t) {
  if (w.w_gate_up.rows > 0) {
    SwiGluStacked(normed_, w.w_gate_up, w.w_down, delta_, t);
    return;
  }
  SwiGlu(normed_, w.w_gate, w.w_up, w.w_down, delta_, t);
}

// Mixture of experts (Mixtral, Qwen3-MoE, DeepSeek-V2/V3):
//  1. router logits [T, E] = normed x router^T (one matmul);
//  2. per token, in f32 (Route): scores (softmax over all E logits, or DeepSeek-V3's per-expert
//     sigmoid), the k experts picked (see MoeTopk; one at a time by strict ">", so a tie goes to
//     the lower expert index, what torch.topk returns for the small ties these models meet in
//     practice), their scores renormalized to sum 1 when norm_topk_prob, times
//     routed_scaling_factor;
//  3. (MoeMlp) one gather lays the routed rows out expert after expert (each expert's tokens in
//     token order), and each expert runs its SwiGLU MLP once over its rows with the ordinary
//     matmul kernels; DeepSeek's shared experts run over every token;
//  4. MoeCombine: each token's row of delta_ is 0 + weight x output over its experts in
//     ascending expert order, then + the shared experts' output.
// Batch invariance: the matmul kernels keep each output row's reduction order independent of
// how many rows run together, and every token's sum has a fixed order, so a token's result
// does not depend on the other tokens in the step. Under tensor parallelism every rank routes
// identically (replicated router, identical normed rows) and holds a slice of every expert's width;
// delta_ is then a partial sum that the caller all-reduces, like the dense MLP's.
void LlamaModel::RouteTokens(const Layer& w, int64_t t, const float* all_logits) {
  const ModelConfig& c = weights_->config;
  const int num_experts = c.num_experts;
  const int k = c.num_experts_per_tok;
  const int per_group = num_experts / c.n_group;
  routes_.resize(num_experts);
  for (std::vector<Route>& r : routes_) r.clear();
  std::vector<float> scores(num_experts);
  std::vector<float> choice(num_experts);  // what selection compares (scores + bias for V3)
  std::vector<char> eligible(num_experts);
  std::vector<float> group_score(c.n_group);
  std::vector<char> group_open(c.n_group);  // not (yet) among the topk_group best
  std::vector<int> chosen(k);
  // The best of `values` whose flag in `allowed` is set, ties to the lower index; -1 if none.
  auto best_of = [](const std::vector<float>& values, const std::vector<char>& allowed) {
    int best = -1;
    for (int e = 0; e < static_cast<int>(values.size()); ++e) {
      if (allowed[e] && (best < 0 || values[e] > values[best])) best = e;
    }
    return best;
  };
  for (int64_t token = 0; token < t; ++token) {
    const float* logits = all_logits + token * num_experts;
    if (c.moe_scoring == MoeScoring::kSigmoid) {
      for (int e = 0; e < num_experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    } else {
      const float top = *std::max_element(logits, logits + num_experts);
      float sum = 0.0f;
      for (int e = 0; e < num_experts; ++e) sum += (scores[e] = std::exp(logits[e] - top));
      for (float& p : scores) p /= sum;
    }
    for (int e = 0; e < num_experts; ++e) {
      choice[e] = scores[e] + (w.router_bias != nullptr ? w.router_bias[e] : 0.0f);
    }
    std::fill(eligible.begin(), eligible.end(), 1);
    if (c.moe_topk != MoeTopk::kGreedy) {
      // Score the groups, keep the topk_group best, and allow only their experts.
      for (int g = 0; g < c.n_group; ++g) {
        const float* v = choice.data() + g * per_group;
        if (c.moe_topk == MoeTopk::kGroupLimited) {
          group_score[g] = *std::max_element(v, v + per_group);
        } else {  // noaux_tc: the sum of the group's two best
          int first = 0;
          for (int e = 1; e < per_group; ++e) first = v[e] > v[first] ? e : first;
          int second = first == 0 ? 1 : 0;
          for (int e = 0; e < per_group; ++e) {
            if (e != first && v[e] > v[second]) second = e;
          }
          group_score[g] = v[first] + v[second];
        }
      }
      std::fill(group_open.begin(), group_open.end(), 1);
      for (int j = 0; j < c.topk_group; ++j) group_open[best_of(group_score, group_open)] = 0;
      for (int e = 0; e < num_experts; ++e) eligible[e] = !group_open[e / per_group];
    }
    float picked_sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int best = best_of(choice, eligible);
      eligible[best] = 0;
      chosen[j] = best;
      picked_sum += scores[best];
    }
    const float scale = c.norm_topk_prob ? 1.0f / picked_sum : 1.0f;
    for (int j = 0; j < k; ++j) {
      routes_[chosen[j]].push_back(
          {static_cast<int32_t>(token), scores[chosen[j]] * scale * c.routed_scaling_factor});
    }
  }
}

absl::Status LlamaModel::MoeMlp(const Layer& w, int64_t t) {
  const ModelConfig& c = weights_->config;
  const int64_t h = c.hidden_size;
  const int k = c.num_experts_per_tok;
  Linear(normed_, w.router, PreparedVector{}, router_logits_, t, Out::kF32);
  const int64_t logit_count = t * c.num_experts;
  const float* logits = router_logits_;
  if (backend_->host_memory()) {
    if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  } else {
    host_logits_.resize(static_cast<size_t>(logit_count));
    if (absl::Status s =
            backend_->CopyToHost(host_logits_.data(), router_logits_, logit_count * sizeof(float));
        !s.ok()) {
      return s;
    }
    logits = host_logits_.data();
  }
  RouteTokens(w, t, logits);

  // Rows of expert_in_ / expert_out_: expert e's tokens (in token order) after those of the
  // experts before it; the shared experts' rows for every token last, at [t * k, t * k + t).
  // Each token's k (+1) slots in that order fix its sum's order.
  const bool shared = w.shared.w_gate.rows > 0;
  const int64_t slots_per_token = k + (shared ? 1 : 0);
  moe_gather_.resize(static_cast<size_t>(t * k));
  moe_slots_.resize(static_cast<size_t>(t * slots_per_token));
  moe_weights_.resize(moe_slots_.size());
  std::vector<int32_t> used(static_cast<size_t>(t), 0);
  int32_t row = 0;
  for (const std::vector<Route>& routes : routes_) {
    for (const Route& r : routes) {
      const int64_t at = int64_t{r.token} * slots_per_token + used[r.token]++;
      moe_gather_[row] = r.token;
      moe_slots_[at] = row++;
      moe_weights_[at] = r.weight;
    }
  }
  if (shared) {
    for (int64_t token = 0; token < t; ++token) {
      moe_slots_[token * slots_per_token + k] = static_cast<int32_t>(t * k + token);
      moe_weights_[token * slots_per_token + k] = 1.0f;
    }
  }
  const int32_t* gather = moe_gather_.data();
  const int32_t* slots = moe_slots_.data();
  const float* route_weights = moe_weights_.data();
  if (!backend_->host_memory()) {
    const int64_t gather_bytes = Aligned(t * k * int64_t{sizeof(int32_t)});
    const int64_t slot_bytes = Aligned(t * slots_per_token * int64_t{sizeof(int32_t)});
    if (absl::Status s = Grow(*backend_, &moe_staging_, gather_bytes + 2 * slot_bytes); !s.ok()) {
      return s;
    }
    auto* base = moe_staging_.as<uint8_t>();
    for (auto [dst, src, bytes] :
         {std::tuple{base, static_cast<const void*>(gather), t * k * sizeof(int32_t)},
          std::tuple{base + gather_bytes, static_cast<const void*>(slots),
                     moe_slots_.size() * sizeof(int32_t)},
          std::tuple{base + gather_bytes + slot_bytes, static_cast<const void*>(route_weights),
                     moe_weights_.size() * sizeof(float)}}) {
      if (absl::Status s = backend_->CopyToDevice(dst, src, bytes); !s.ok()) return s;
    }
    gather = reinterpret_cast<const int32_t*>(base);
    slots = reinterpret_cast<const int32_t*>(base + gather_bytes);
    route_weights = reinterpret_cast<const float*>(base + gather_bytes + slot_bytes);
  }

  // Gather every routed row once (an "embedding" of the normed activations), run each expert
  // over its rows, then each token's weighted sum (the experts' outputs are f32).
  backend_->Embedding({normed_, act_dtype_, h, gather, t * k, expert_in_, act_dtype_});
  int64_t offset = 0;
  for (size_t e = 0; e < routes_.size(); ++e) {
    const int64_t n = static_cast<int64_t>(routes_[e].size());
    if (n == 0) continue;
    const Expert& x = w.experts[e];
    SwiGlu(ActAt(expert_in_, offset * h), x.w_gate, x.w_up, x.w_down, expert_out_ + offset * h, n);
    offset += n;
  }
  if (shared) {
    SwiGlu(normed_, w.shared.w_gate, w.shared.w_up, w.shared.w_down, expert_out_ + t * k * h, t);
  }
  backend_->MoeCombine({expert_out_, slots, route_weights, delta_, t, slots_per_token, h});
  return absl::OkStatus();
}

}  // namespace kvserve
