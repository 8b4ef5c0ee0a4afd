#include "worker/model/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

// Splits quantized rows into 32-element blocks: fp16 scale then the packed values.
void QuantizeRowQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = FloatToHalf(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 32; ++j) {
      out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[b * 32 + j] * inv)));
    }
    out += 34;
  }
}

void QuantizeRowQ4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + b * 32;
    float max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(v[j]) > std::fabs(max)) max = v[j];
    }
    const float d = max / -8.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = FloatToHalf(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(v[j] * inv + 8.5f));
      const int hi = std::min(15, static_cast<int>(v[j + 16] * inv + 8.5f));
      out[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    out += 18;
  }
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
      Store(row.data(), cols, dtype, data + r * row_bytes);
    }
    t.data = data;
    return t;
  }

  absl::StatusOr<TensorView> Ones(std::string name, int64_t n) {
    TensorView t{std::move(name), DType::kF32, {n}, nullptr};
    auto* data = reinterpret_cast<float*>(Allocate(n * 4));
    if (data == nullptr) return absl::ResourceExhaustedError("synthetic model: out of memory");
    for (int64_t i = 0; i < n; ++i) data[i] = 1.0f;
    t.data = data;
    return t;
  }

 private:
  uint8_t* Allocate(int64_t bytes) {
    std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[bytes]);
    uint8_t* p = buf.get();
    if (p != nullptr) weights_->owned_buffers.push_back(std::move(buf));
    return p;
  }

  static void Store(const float* x, int64_t n, DType dtype, uint8_t* out) {
    switch (dtype) {
      case DType::kF32: std::memcpy(out, x, n * 4); break;
      case DType::kF16:
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t h = FloatToHalf(x[i]);
          std::memcpy(out + 2 * i, &h, 2);
        }
        break;
      case DType::kBF16:
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t h = FloatToBF16(x[i]);
          std::memcpy(out + 2 * i, &h, 2);
        }
        break;
      case DType::kQ8_0: QuantizeRowQ8_0(x, n, out); break;
      case DType::kQ4_0: QuantizeRowQ4_0(x, n, out); break;
    }
  }

  ModelWeights* weights_;
  std::mt19937_64 rng_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> MakeSyntheticModel(const SyntheticModelOptions& o) {
  auto weights = std::make_unique<ModelWeights>();
  ModelConfig& c = weights->config;
  c.architecture = "llama";
  c.hidden_size = o.hidden_size;
  c.intermediate_size = o.intermediate_size;
  c.num_layers = o.num_layers;
  c.num_heads = o.num_heads;
  c.num_kv_heads = o.num_kv_heads;
  c.head_dim = o.num_heads > 0 ? o.hidden_size / o.num_heads : 0;
  c.vocab_size = o.vocab_size;
  c.max_position_embeddings = o.max_position_embeddings;
  c.tie_word_embeddings = o.tie_word_embeddings;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  const int64_t block = DTypeBlockElems(o.dtype);
  if (o.hidden_size % block != 0 || o.intermediate_size % block != 0 ||
      (c.num_heads * c.head_dim) % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic model: sizes must be multiples of ",
                                                   block, " for ", std::string(DTypeName(o.dtype))));
  }
  weights->format = "synthetic";
  Builder b(weights.get(), o.seed);
  const int64_t h = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
#define KVSERVE_ASSIGN(lhs, expr)            \
  do {                                       \
    absl::StatusOr<TensorView> t_ = (expr);  \
    if (!t_.ok()) return t_.status();        \
    lhs = std::move(*t_);                    \
  } while (0)
  KVSERVE_ASSIGN(weights->token_embedding, b.Random("token_embd", o.dtype, c.vocab_size, h));
  weights->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = weights->layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    KVSERVE_ASSIGN(w.attn_norm, b.Ones(p + "attn_norm", h));
    KVSERVE_ASSIGN(w.wq, b.Random(p + "attn_q", o.dtype, q_dim, h));
    KVSERVE_ASSIGN(w.wk, b.Random(p + "attn_k", o.dtype, kv_dim, h));
    KVSERVE_ASSIGN(w.wv, b.Random(p + "attn_v", o.dtype, kv_dim, h));
    KVSERVE_ASSIGN(w.wo, b.Random(p + "attn_output", o.dtype, h, q_dim));
    KVSERVE_ASSIGN(w.ffn_norm, b.Ones(p + "ffn_norm", h));
    KVSERVE_ASSIGN(w.w_gate, b.Random(p + "ffn_gate", o.dtype, c.intermediate_size, h));
    KVSERVE_ASSIGN(w.w_up, b.Random(p + "ffn_up", o.dtype, c.intermediate_size, h));
    KVSERVE_ASSIGN(w.w_down, b.Random(p + "ffn_down", o.dtype, h, c.intermediate_size));
  }
  KVSERVE_ASSIGN(weights->final_norm, b.Ones("output_norm", h));
  if (o.tie_word_embeddings) {
    weights->output = weights->token_embedding;
  } else {
    KVSERVE_ASSIGN(weights->output, b.Random("output", o.dtype, c.vocab_size, h));
  }
#undef KVSERVE_ASSIGN
  return weights;
}

}  // namespace kvserve
