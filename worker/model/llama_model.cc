#include "worker/model/llama_model.h"

#include <cmath>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"

namespace kvserve {
namespace {

const float* F32(const TensorView& t) { return static_cast<const float*>(t.data); }

// y[m, n] = x[m, k] . W^T (+ bias), x and y densely packed.
void Linear(const float* x, const TensorView& w, const TensorView& bias, float* y, int64_t m,
            cpu::ThreadPool* pool) {
  const int64_t n = w.shape[0];
  const int64_t k = w.shape[1];
  cpu::MatmulArgs args{};
  args.x = x;
  args.x_stride = k;
  args.w = w.data;
  args.w_dtype = w.dtype;
  args.bias = bias.present() ? F32(bias) : nullptr;
  args.y = y;
  args.y_stride = n;
  args.m = m;
  args.n = n;
  args.k = k;
  cpu::Matmul(args, pool);
}

void Norm(float* x, const float* residual, const TensorView& weight, float* y, int64_t rows,
          int64_t dim, float eps, cpu::ThreadPool* pool) {
  cpu::RmsNormArgs args{};
  args.x = x;
  args.residual = residual;
  args.weight = F32(weight);
  args.y = y;
  args.rows = rows;
  args.dim = dim;
  args.eps = eps;
  args.x_stride = dim;
  args.y_stride = dim;
  cpu::RmsNorm(args, pool);
}

}  // namespace

std::vector<float> ComputeRopeInvFreq(const ModelConfig& config, const TensorView& rope_freqs) {
  const int half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    // Same float32 arithmetic as the reference implementations: theta^(-2i/d).
    inv_freq[i] = 1.0f / std::pow(config.rope_theta,
                                  static_cast<float>(2 * i) / static_cast<float>(config.head_dim));
  }
  const RopeScaling& s = config.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
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

LlamaModel::LlamaModel(const ModelWeights* weights, cpu::ThreadPool* pool, AllReduceFn all_reduce)
    : weights_(weights), pool_(pool), all_reduce_(std::move(all_reduce)) {}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelWeights* weights,
                                                               cpu::ThreadPool* pool,
                                                               AllReduceFn all_reduce) {
  if (weights == nullptr) return absl::InvalidArgumentError("LlamaModel: no weights");
  if (absl::Status s = weights->config.Validate(); !s.ok()) return s;
  if (static_cast<int>(weights->layers.size()) != weights->config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LlamaModel: ", weights->layers.size(),
                                                   " layers loaded, config says ",
                                                   weights->config.num_layers));
  }
  std::unique_ptr<LlamaModel> model(new LlamaModel(weights, pool, std::move(all_reduce)));
  model->inv_freq_ = ComputeRopeInvFreq(weights->config, weights->rope_freqs);
  return model;
}

void LlamaModel::EnsureWorkspace(int64_t num_tokens) {
  if (num_tokens <= workspace_tokens_) return;
  const ModelConfig& c = weights_->config;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  hidden_.resize(num_tokens * c.hidden_size);
  delta_.resize(num_tokens * c.hidden_size);
  normed_.resize(num_tokens * c.hidden_size);
  q_.resize(num_tokens * q_dim);
  k_.resize(num_tokens * kv_dim);
  v_.resize(num_tokens * kv_dim);
  attn_out_.resize(num_tokens * q_dim);
  gate_.resize(num_tokens * c.intermediate_size);
  up_.resize(num_tokens * c.intermediate_size);
  final_rows_.resize(num_tokens * c.hidden_size);
  workspace_tokens_ = num_tokens;
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

absl::Status LlamaModel::Forward(const ForwardBatch& batch, KvCache& cache, float* logits) {
  if (absl::Status s = CheckBatch(batch, cache); !s.ok()) return s;
  const ModelConfig& c = weights_->config;
  const int64_t t = static_cast<int64_t>(batch.tokens.size());
  const int64_t h = c.hidden_size;
  EnsureWorkspace(t);

  cpu::EmbeddingGather(weights_->token_embedding.data, weights_->token_embedding.dtype, h,
                       batch.tokens.data(), t, hidden_.data());
  for (int layer = 0; layer < c.num_layers; ++layer) {
    if (absl::Status s = RunLayer(layer, batch, cache, t); !s.ok()) return s;
  }

  // Only the rows that need logits go through the final norm and the vocabulary projection.
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  if (rows == 0 || logits == nullptr) return absl::OkStatus();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = batch.logits_rows[i];
    const float* src_h = hidden_.data() + r * h;
    const float* src_d = delta_.data() + r * h;
    float* dst = final_rows_.data() + i * h;
    for (int64_t j = 0; j < h; ++j) dst[j] = src_h[j] + src_d[j];
  }
  Norm(final_rows_.data(), nullptr, weights_->final_norm, normed_.data(), rows, h, c.rms_norm_eps,
       pool_);
  Linear(normed_.data(), weights_->output, TensorView{}, logits, rows, pool_);
  return absl::OkStatus();
}

absl::Status LlamaModel::RunLayer(int layer, const ForwardBatch& b, KvCache& cache, int64_t t) {
  const ModelConfig& c = weights_->config;
  const LayerWeights& w = weights_->layers[layer];
  const int64_t h = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;

  // Pre-attention norm; from layer 1 on it first adds the previous MLP output to the stream.
  Norm(hidden_.data(), layer == 0 ? nullptr : delta_.data(), w.attn_norm, normed_.data(), t, h,
       c.rms_norm_eps, pool_);

  Linear(normed_.data(), w.wq, w.bq, q_.data(), t, pool_);
  Linear(normed_.data(), w.wk, w.bk, k_.data(), t, pool_);
  Linear(normed_.data(), w.wv, w.bv, v_.data(), t, pool_);

  const cpu::RopeLayout layout = c.rope_style == RopeStyle::kInterleaved
                                     ? cpu::RopeLayout::kInterleaved
                                     : cpu::RopeLayout::kHalfSplit;
  cpu::ApplyRope({q_.data(), t, c.num_heads, c.head_dim, q_dim, b.positions.data(),
                  inv_freq_.data(), layout});
  cpu::ApplyRope({k_.data(), t, c.num_kv_heads, c.head_dim, kv_dim, b.positions.data(),
                  inv_freq_.data(), layout});

  cpu::WriteKvCache(k_.data(), v_.data(), t, kv_dim, kv_dim, b.slot_mapping.data(), cache.layout(),
                    cache.k(layer), cache.v(layer));

  cpu::PagedAttentionArgs attn{};
  attn.q = q_.data();
  attn.q_stride = q_dim;
  attn.out = attn_out_.data();
  attn.out_stride = q_dim;
  attn.num_seqs = static_cast<int64_t>(b.q_start.size());
  attn.num_heads = c.num_heads;
  attn.q_start = b.q_start.data();
  attn.q_len = b.q_len.data();
  attn.context_len = b.context_len.data();
  attn.block_tables = b.block_tables;
  attn.block_table_stride = b.block_table_stride;
  attn.k_cache = cache.k(layer);
  attn.v_cache = cache.v(layer);
  attn.layout = cache.layout();
  attn.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  attn.sliding_window = c.sliding_window;
  cpu::PagedAttention(attn, pool_);

  Linear(attn_out_.data(), w.wo, TensorView{}, delta_.data(), t, pool_);
  // Under tensor parallelism each rank holds some heads: their output projections add up.
  if (all_reduce_) {
    if (absl::Status s = all_reduce_(delta_.data(), t * h); !s.ok()) return s;
  }

  // Residual add fused into the post-attention norm.
  Norm(hidden_.data(), delta_.data(), w.ffn_norm, normed_.data(), t, h, c.rms_norm_eps, pool_);

  Linear(normed_.data(), w.w_gate, TensorView{}, gate_.data(), t, pool_);
  Linear(normed_.data(), w.w_up, TensorView{}, up_.data(), t, pool_);
  const int64_t inter = c.intermediate_size;
  cpu::SiluMul(gate_.data(), up_.data(), gate_.data(), t, inter, inter, inter, inter, pool_);
  Linear(gate_.data(), w.w_down, TensorView{}, delta_.data(), t, pool_);
  // Each rank holds some MLP rows: their down projections add up.
  if (all_reduce_) return all_reduce_(delta_.data(), t * h);
  return absl::OkStatus();
}

}  // namespace kvserve
