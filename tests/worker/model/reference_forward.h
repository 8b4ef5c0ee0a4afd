#ifndef KVSERVE_TESTS_WORKER_MODEL_REFERENCE_FORWARD_H_
#define KVSERVE_TESTS_WORKER_MODEL_REFERENCE_FORWARD_H_

// A plain reference forward pass for the model tests (qwen3_test, moe_test): the decoder as the
// Hugging Face model descriptions state it, in loops over f32 weights with double accumulation,
// sharing nothing with the engine's kernels. Covers Llama, Qwen3 (per-head q/k RMSNorm before
// rotate_half RoPE, explicit head_dim, q/k/v/o biases when present) and the mixture-of-experts
// MLP of Mixtral and Qwen3-MoE (softmax over every router logit, the k most probable experts
// with a tie going to the lower index, renormalised when norm_topk_prob).

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/weights.h"

namespace kvserve::testing_model {

inline const float* F32(const TensorView& t) { return static_cast<const float*>(t.data); }

/// y[out] = W[out, in] x (+ b when `bias` is present), W row-major [out, in], f32.
inline std::vector<double> MatVec(const TensorView& w, const std::vector<double>& x,
                                  const TensorView* bias = nullptr) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  EXPECT_EQ(cols, static_cast<int64_t>(x.size())) << w.name;
  EXPECT_EQ(w.dtype, DType::kF32) << w.name;
  std::vector<double> y(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += double{F32(w)[r * cols + c]} * x[c];
    y[r] = acc + (bias != nullptr && bias->present() ? F32(*bias)[r] : 0.0);
  }
  return y;
}

/// RMSNorm of x[begin, begin + n) in place with weight [n].
inline void RmsNormInPlace(std::vector<double>& x, int64_t begin, int64_t n,
                           const TensorView& weight, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[begin + i] * x[begin + i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[begin + i] = x[begin + i] * inv * F32(weight)[i];
}

/// Hugging Face rotate_half RoPE on the head at x[begin, begin + d): dimension i pairs with
/// i + d/2 and turns by position * theta^(-2i/d).
inline void RotateHalf(std::vector<double>& x, int64_t begin, int d, int position, double theta) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = position * std::pow(theta, -2.0 * i / d);
    const double a = x[begin + i], b = x[begin + i + half];
    x[begin + i] = a * std::cos(angle) - b * std::sin(angle);
    x[begin + i + half] = b * std::cos(angle) + a * std::sin(angle);
  }
}

/// A SwiGLU MLP: down(silu(gate x) * up x).
inline std::vector<double> SwiGlu(const TensorView& gate_w, const TensorView& up_w,
                                  const TensorView& down_w, const std::vector<double>& x) {
  const std::vector<double> gate = MatVec(gate_w, x);
  const std::vector<double> up = MatVec(up_w, x);
  std::vector<double> act(gate.size());
  for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return MatVec(down_w, act);
}

/// The mixture-of-experts MLP for one token: softmax over all router logits, the k largest
/// probabilities (a tie goes to the lower expert index), renormalised to sum 1 when
/// norm_topk_prob, and the weighted sum of those experts' outputs.
inline std::vector<double> MoeBlock(const ModelConfig& c, const LayerWeights& l,
                                    const std::vector<double>& x) {
  const std::vector<double> logits = MatVec(l.router, x);
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(logits.size());
  double sum = 0;
  for (size_t e = 0; e < logits.size(); ++e) sum += (probs[e] = std::exp(logits[e] - top));
  for (double& p : probs) p /= sum;
  std::vector<int> order(probs.size());
  for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int>(e);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
  order.resize(c.num_experts_per_tok);
  double picked = 0;
  for (int e : order) picked += probs[e];
  std::vector<double> out(x.size(), 0.0);
  for (int e : order) {
    const double weight = c.norm_topk_prob ? probs[e] / picked : probs[e];
    const ExpertWeights& expert = l.experts[e];
    const std::vector<double> y = SwiGlu(expert.w_gate, expert.w_up, expert.w_down, x);
    for (size_t i = 0; i < out.size(); ++i) out[i] += weight * y[i];
  }
  return out;
}

/// Logits of the last token of `prompt`, every token attending causally to those before it.
inline std::vector<float> ReferenceLogits(const ModelWeights& w,
                                          const std::vector<TokenId>& prompt) {
  const ModelConfig& c = w.config;
  const int d = c.head_dim;
  const int group = c.num_heads / c.num_kv_heads;
  const double eps = c.rms_norm_eps;
  const int64_t tokens = static_cast<int64_t>(prompt.size());
  std::vector<std::vector<double>> x(tokens, std::vector<double>(c.hidden_size));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < c.hidden_size; ++i) {
      x[t][i] = F32(w.token_embedding)[int64_t{prompt[t]} * c.hidden_size + i];
    }
  }
  for (const LayerWeights& l : w.layers) {
    std::vector<std::vector<double>> q(tokens), k(tokens), v(tokens);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> xn = x[t];
      RmsNormInPlace(xn, 0, c.hidden_size, l.attn_norm, eps);
      q[t] = MatVec(l.wq, xn, &l.bq);
      k[t] = MatVec(l.wk, xn, &l.bk);
      v[t] = MatVec(l.wv, xn, &l.bv);
      for (int h = 0; h < c.num_heads; ++h) {
        if (c.qk_norm) RmsNormInPlace(q[t], int64_t{h} * d, d, l.q_norm, eps);
        RotateHalf(q[t], int64_t{h} * d, d, static_cast<int>(t), c.rope_theta);
      }
      for (int h = 0; h < c.num_kv_heads; ++h) {
        if (c.qk_norm) RmsNormInPlace(k[t], int64_t{h} * d, d, l.k_norm, eps);
        RotateHalf(k[t], int64_t{h} * d, d, static_cast<int>(t), c.rope_theta);
      }
    }
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> attn(int64_t{c.num_heads} * d, 0.0);
      for (int h = 0; h < c.num_heads; ++h) {
        const int64_t qo = int64_t{h} * d, ko = int64_t{h / group} * d;
        std::vector<double> score(t + 1);
        double top = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int i = 0; i < d; ++i) dot += q[t][qo + i] * k[j][ko + i];
          score[j] = dot / std::sqrt(static_cast<double>(d));
          top = std::max(top, score[j]);
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - top));
        for (int64_t j = 0; j <= t; ++j) {
          for (int i = 0; i < d; ++i) attn[qo + i] += score[j] / sum * v[j][ko + i];
        }
      }
      const std::vector<double> o = MatVec(l.wo, attn, &l.bo);
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += o[i];
    }
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> xn = x[t];
      RmsNormInPlace(xn, 0, c.hidden_size, l.ffn_norm, eps);
      const std::vector<double> mlp =
          c.num_experts > 0 ? MoeBlock(c, l, xn) : SwiGlu(l.w_gate, l.w_up, l.w_down, xn);
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += mlp[i];
    }
  }
  std::vector<double> last = x.back();
  RmsNormInPlace(last, 0, c.hidden_size, w.final_norm, eps);
  const std::vector<double> logits = MatVec(w.output, last);
  return std::vector<float>(logits.begin(), logits.end());
}

/// A prompt of `n` tokens for the small synthetic vocabularies (600 pieces): BOS, then a spread.
inline std::vector<TokenId> SpreadPrompt(int n) {
  std::vector<TokenId> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(static_cast<TokenId>(3 + (i * 37) % 590));
  return p;
}

}  // namespace kvserve::testing_model

#endif  // KVSERVE_TESTS_WORKER_MODEL_REFERENCE_FORWARD_H_
