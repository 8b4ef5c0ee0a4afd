// DeepSeek-V2/V3 models: multi-head latent attention (MLA) and DeepSeek's mixture of experts.
// Tiny random models written by `kvserve synth --arch deepseek2|deepseek3` load from their Hugging
// Face directories and GGUF files (llama.cpp's deepseek2, kv_b whole or split), and their logits
// match a plain reference forward pass written here from
// modeling_deepseek.py's description: attention in the expanded form (k_nope and v decompressed
// from the latent for every head, the rope part de-interleaved and turned by rotate_half, yarn
// frequencies and its softmax mscale), experts scored by softmax (V2) or sigmoid plus the
// correction bias (V3), group-limited selection, shared experts, dense first layers, every
// expert evaluated per token and summed in double. The engine runs the absorbed form; its greedy
// tokens are identical alone, batched, chunked, preempted and over two tensor-parallel ranks;
// the cache holds one latent row per token and layer in every KV dtype, and its bytes per token
// are what `kvserve plan` counts.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/io/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util/scratch_dir.h"
#include "tests/worker/engine/engine_test_util.h"
#include "tests/worker/model/hf_config_util.h"
#include "tests/worker/model/model_test_util.h"
#include "tests/worker/model/reference_forward.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_cache.h"
#include "worker/loader/hf_config.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synth_writer.h"
#include "worker/planner/capacity_planner.h"
#include "worker/planner/model_spec_loader.h"

namespace kvserve {
namespace {

using testing_model::F32;
using testing_model::LastLogits;
using testing_model::MatVec;
using testing_model::MaxRelativeError;
using testing_model::RmsNormInPlace;
using testing_model::SwiGlu;

constexpr int kHidden = 64;
constexpr int kHeads = 4;

/// A deepseek_v2 or deepseek_v3 model: 3 layers (the first dense), 8 experts of which each
/// token runs 2, one shared expert, latent rank 32, q/k heads 16 + 8 wide, v heads 16.
SynthWriteOptions DeepseekOptions(const std::string& arch, const std::string& name) {
  SynthWriteOptions o;
  o.model.architecture = arch;
  o.model.num_layers = 3;
  o.model.hidden_size = kHidden;
  o.model.num_heads = kHeads;
  o.model.intermediate_size = 96;
  o.model.num_experts = 8;
  o.model.num_experts_per_tok = 2;
  o.model.moe_intermediate_size = 32;
  o.model.n_shared_experts = 1;
  o.model.first_k_dense_replace = 1;
  o.model.kv_lora_rank = 32;
  o.model.q_lora_rank = arch == "deepseek_v3" ? 48 : 0;
  o.model.qk_nope_head_dim = 16;
  o.model.qk_rope_head_dim = 8;
  o.model.v_head_dim = 16;
  if (arch == "deepseek_v3") {
    o.model.n_group = 4;
    o.model.topk_group = 2;
    o.model.routed_scaling_factor = 2.5f;
  }
  o.model.vocab_size = 600;
  o.model.max_position_embeddings = 256;
  o.model.seed = 11;
  o.out_dir = test_util::ScratchPath(name);
  o.format = SynthFormat::kHf;
  return o;
}

SynthOutputs Write(const SynthWriteOptions& o) {
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : SynthOutputs{};
}

using testing_model::ReadConfig;
using testing_model::WriteConfig;

std::vector<TokenId> Prompt(int n) { return testing_model::SpreadPrompt(n); }

// ---- The reference, from modeling_deepseek.py ----

double YarnMscaleRef(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

/// RoPE inverse frequencies of the rope part: theta^(-2i/d), and DeepSeek's yarn when the config
/// has it (frequencies blended between extrapolation and interpolation by a linear ramp over the
/// pair index between the correction dimensions of beta_fast and beta_slow rotations).
std::vector<double> InvFreq(const ModelConfig& c) {
  const int d = c.qk_rope_head_dim;
  std::vector<double> f(d / 2);
  const RopeScaling& s = c.rope_scaling;
  auto correction = [&](double rotations) {
    return d * std::log(s.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(static_cast<double>(c.rope_theta)));
  };
  const double low = std::max(std::floor(correction(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction(s.beta_slow)), d - 1.0);
  if (low == high) high += 0.001;
  for (int i = 0; i < d / 2; ++i) {
    const double extra = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / d);
    if (s.type != RopeScaling::Type::kYarn) {
      f[i] = extra;
      continue;
    }
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    f[i] = extra / s.factor * ramp + extra * (1.0 - ramp);
  }
  return f;
}

/// The reference's rope on x[begin, begin + d): view the pairs (2i, 2i+1) as halves (i, i + d/2)
/// (modeling_deepseek.py's de-interleave), rotate_half, and write back in that de-interleaved
/// order. q and k get the same permutation, so their dot products are those of the model.
void DeepseekRope(std::vector<double>& x, int64_t begin, int d, int position,
                  const std::vector<double>& inv_freq) {
  std::vector<double> y(d);
  for (int i = 0; i < d / 2; ++i) {
    y[i] = x[begin + 2 * i];
    y[i + d / 2] = x[begin + 2 * i + 1];
  }
  for (int i = 0; i < d / 2; ++i) {
    const double angle = position * inv_freq[i];
    const double a = y[i], b = y[i + d / 2];
    x[begin + i] = a * std::cos(angle) - b * std::sin(angle);
    x[begin + i + d / 2] = b * std::cos(angle) + a * std::sin(angle);
  }
}

/// DeepSeek's MoE block for one token (MoEGate + moe_infer + shared experts).
std::vector<double> DeepseekMoe(const ModelConfig& c, const LayerWeights& l,
                                const std::vector<double>& x) {
  const std::vector<double> logits = MatVec(l.router, x);
  const int n = c.num_experts;
  std::vector<double> scores(n);
  if (c.moe_scoring == MoeScoring::kSigmoid) {
    for (int e = 0; e < n; ++e) scores[e] = 1.0 / (1.0 + std::exp(-logits[e]));
  } else {
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int e = 0; e < n; ++e) sum += (scores[e] = std::exp(logits[e] - top));
    for (double& s : scores) s /= sum;
  }
  std::vector<double> choice = scores;
  if (l.router_bias.present()) {
    for (int e = 0; e < n; ++e) choice[e] += F32(l.router_bias)[e];
  }
  auto descending = [](const std::vector<double>& v) {
    std::vector<int> order(v.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b]; });
    return order;
  };
  if (c.moe_topk != MoeTopk::kGreedy) {
    const int per = n / c.n_group;
    std::vector<double> group(c.n_group);
    for (int g = 0; g < c.n_group; ++g) {
      std::vector<double> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(members.rbegin(), members.rend());
      group[g] = c.moe_topk == MoeTopk::kNoAuxTc ? members[0] + members[1] : members[0];
    }
    std::vector<int> groups = descending(group);
    for (int g = c.topk_group; g < c.n_group; ++g) {
      for (int e = groups[g] * per; e < (groups[g] + 1) * per; ++e) choice[e] = -INFINITY;
    }
  }
  std::vector<int> chosen = descending(choice);
  chosen.resize(c.num_experts_per_tok);
  double sum = 0;
  for (int e : chosen) sum += scores[e];
  const bool v3 = c.architecture == "deepseek_v3";
  std::vector<double> out(x.size(), 0.0);
  for (int e : chosen) {
    double w = scores[e];
    if (c.num_experts_per_tok > 1 && c.norm_topk_prob) w /= sum + 1e-20;
    // V3 always scales; V2 only the weights it did not renormalize.
    if (v3 || !(c.num_experts_per_tok > 1 && c.norm_topk_prob)) w *= c.routed_scaling_factor;
    const ExpertWeights& ex = l.experts[e];
    const std::vector<double> y = SwiGlu(ex.w_gate, ex.w_up, ex.w_down, x);
    for (size_t i = 0; i < out.size(); ++i) out[i] += w * y[i];
  }
  if (l.shared.w_gate.present()) {
    const std::vector<double> y = SwiGlu(l.shared.w_gate, l.shared.w_up, l.shared.w_down, x);
    for (size_t i = 0; i < out.size(); ++i) out[i] += y[i];
  }
  return out;
}

/// Logits of the last token of `prompt`, with attention in the expanded form.
std::vector<float> ReferenceDeepseekLogits(const ModelWeights& w,
                                           const std::vector<TokenId>& prompt) {
  const ModelConfig& c = w.config;
  const int heads = c.num_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int vd = c.v_head_dim, rank = c.kv_lora_rank, qk = nope + rope;
  const double eps = c.rms_norm_eps;
  const std::vector<double> inv_freq = InvFreq(c);
  double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (c.rope_scaling.type == RopeScaling::Type::kYarn && c.rope_scaling.mscale_all_dim != 0) {
    const double m = YarnMscaleRef(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  const int64_t tokens = static_cast<int64_t>(prompt.size());
  std::vector<std::vector<double>> x(tokens, std::vector<double>(c.hidden_size));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < c.hidden_size; ++i) {
      x[t][i] = F32(w.token_embedding)[int64_t{prompt[t]} * c.hidden_size + i];
    }
  }
  for (size_t layer = 0; layer < w.layers.size(); ++layer) {
    const LayerWeights& l = w.layers[layer];
    // Per token: q [heads][qk], k [heads][qk] (k_nope per head, k_pe shared), v [heads][vd].
    std::vector<std::vector<double>> q(tokens), k(tokens), v(tokens);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> xn = x[t];
      RmsNormInPlace(xn, 0, c.hidden_size, l.attn_norm, eps);
      if (c.q_lora_rank > 0) {
        std::vector<double> qa = MatVec(l.wq_a, xn);
        RmsNormInPlace(qa, 0, c.q_lora_rank, l.q_a_norm, eps);
        q[t] = MatVec(l.wq_b, qa);
      } else {
        q[t] = MatVec(l.wq, xn);
      }
      std::vector<double> ckv = MatVec(l.wkv_a, xn);  // [rank + rope]
      std::vector<double> k_pe(ckv.begin() + rank, ckv.end());
      ckv.resize(rank);
      RmsNormInPlace(ckv, 0, rank, l.kv_a_norm, eps);
      const std::vector<double> kv = MatVec(l.wkv_b, ckv);  // [heads][nope + vd]
      DeepseekRope(k_pe, 0, rope, static_cast<int>(t), inv_freq);
      k[t].assign(int64_t{heads} * qk, 0.0);
      v[t].assign(int64_t{heads} * vd, 0.0);
      for (int h = 0; h < heads; ++h) {
        DeepseekRope(q[t], int64_t{h} * qk + nope, rope, static_cast<int>(t), inv_freq);
        for (int i = 0; i < nope; ++i) k[t][h * qk + i] = kv[h * (nope + vd) + i];
        for (int i = 0; i < rope; ++i) k[t][h * qk + nope + i] = k_pe[i];
        for (int i = 0; i < vd; ++i) v[t][h * vd + i] = kv[h * (nope + vd) + nope + i];
      }
    }
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> attn(int64_t{heads} * vd, 0.0);
      for (int h = 0; h < heads; ++h) {
        std::vector<double> score(t + 1);
        double top = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int i = 0; i < qk; ++i) dot += q[t][h * qk + i] * k[j][h * qk + i];
          score[j] = dot * scale;
          top = std::max(top, score[j]);
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - top));
        for (int64_t j = 0; j <= t; ++j) {
          for (int i = 0; i < vd; ++i) attn[h * vd + i] += score[j] / sum * v[j][h * vd + i];
        }
      }
      const std::vector<double> o = MatVec(l.wo, attn);
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += o[i];
    }
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> xn = x[t];
      RmsNormInPlace(xn, 0, c.hidden_size, l.ffn_norm, eps);
      const std::vector<double> mlp = c.is_moe_layer(static_cast<int>(layer))
                                          ? DeepseekMoe(c, l, xn)
                                          : SwiGlu(l.w_gate, l.w_up, l.w_down, xn);
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += mlp[i];
    }
  }
  std::vector<double> last = x.back();
  RmsNormInPlace(last, 0, c.hidden_size, w.final_norm, eps);
  const std::vector<double> logits = MatVec(w.output, last);
  return std::vector<float>(logits.begin(), logits.end());
}

// ---- Loading ----

TEST(MlaTest, SynthWritesDeepseekConfigsThatLoad) {
  for (const std::string arch : {"deepseek_v2", "deepseek_v3"}) {
    SCOPED_TRACE(arch);
    const SynthOutputs out = Write(DeepseekOptions(arch, arch));
    const nlohmann::json j = ReadConfig(out.hf_dir);
    EXPECT_EQ(j["model_type"], arch);
    EXPECT_EQ(j["architectures"][0],
              arch == "deepseek_v2" ? "DeepseekV2ForCausalLM" : "DeepseekV3ForCausalLM");
    EXPECT_EQ(j["kv_lora_rank"], 32);
    EXPECT_EQ(j["n_routed_experts"], 8);
    EXPECT_EQ(j["topk_method"], arch == "deepseek_v2" ? "greedy" : "noaux_tc");
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = m->config();
    EXPECT_TRUE(c.is_mla());
    EXPECT_EQ(c.head_dim, 24);
    EXPECT_EQ(c.kv_cache_dim(), 40);
    EXPECT_EQ(c.kv_cache_heads(), 1);
    EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
    EXPECT_FALSE(c.is_moe_layer(0));
    EXPECT_TRUE(c.is_moe_layer(1));
    EXPECT_EQ(c.n_shared_experts, 1);
    const LayerWeights& dense = m->weights->layers[0];
    EXPECT_TRUE(dense.w_gate.present());
    EXPECT_TRUE(dense.experts.empty());
    const LayerWeights& l = m->weights->layers[2];
    EXPECT_EQ(l.wkv_a.shape, (std::vector<int64_t>{40, kHidden}));
    EXPECT_EQ(l.wkv_b.shape, (std::vector<int64_t>{kHeads * (16 + 16), 32}));
    EXPECT_EQ(l.wo.shape, (std::vector<int64_t>{kHidden, kHeads * 16}));
    EXPECT_EQ(l.shared.w_down.shape, (std::vector<int64_t>{kHidden, 32}));
    EXPECT_FALSE(l.wk.present());
    if (arch == "deepseek_v3") {
      EXPECT_EQ(c.moe_scoring, MoeScoring::kSigmoid);
      EXPECT_EQ(c.moe_topk, MoeTopk::kNoAuxTc);
      EXPECT_EQ(c.routed_scaling_factor, 2.5f);
      EXPECT_EQ(l.router_bias.numel(), 8);
      EXPECT_EQ(l.wq_a.shape, (std::vector<int64_t>{48, kHidden}));
      EXPECT_FALSE(l.wq.present());
    } else {
      EXPECT_EQ(c.moe_scoring, MoeScoring::kSoftmax);
      EXPECT_FALSE(l.router_bias.present());
      EXPECT_EQ(l.wq.shape, (std::vector<int64_t>{kHeads * 24, kHidden}));
    }
  }
}

TEST(MlaTest, BadConfigsAreRefusedByName) {
  const SynthOutputs out = Write(DeepseekOptions("deepseek_v3", "bad_configs"));
  const nlohmann::json base = ReadConfig(out.hf_dir);
  auto load_error = [&](const nlohmann::json& j) {
    WriteConfig(out.hf_dir, j);
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    EXPECT_FALSE(m.ok());
    return m.ok() ? std::string() : std::string(m.status().message());
  };
  nlohmann::json j = base;
  j["topk_method"] = "greedy";
  std::string msg = load_error(j);
  EXPECT_NE(msg.find("unsupported 'topk_method' \"greedy\" (supported: noaux_tc)"),
            std::string::npos)
      << msg;
  j = base;
  j["n_group"] = 3;
  msg = load_error(j);
  EXPECT_NE(msg.find("n_group 3 must divide the 8 routed experts"), std::string::npos) << msg;
  j = base;
  j["qk_rope_head_dim"] = 7;
  msg = load_error(j);
  EXPECT_NE(msg.find("qk_rope_head_dim 7 must be even"), std::string::npos) << msg;
  j = base;
  j["kv_lora_rank"] = 16;  // the checkpoint's kv_a rows say 32 + 8
  msg = load_error(j);
  EXPECT_NE(msg.find("kv_a_proj_with_mqa.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kv_lora_rank 16"), std::string::npos) << msg;
  j = base;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.5}};
  msg = load_error(j);
  EXPECT_NE(msg.find("yarn 'mscale' 1 differing from 'mscale_all_dim' 0.5"), std::string::npos)
      << msg;
  WriteConfig(out.hf_dir, base);
  EXPECT_TRUE(LoadModel(out.hf_dir).ok());
}

// ---- Logits ----

struct Case {
  std::string name;
  std::string arch;
  int n_group = 1;
  int topk_group = 1;
  bool yarn = false;
};

TEST(MlaTest, LogitsMatchTheExpandedReference) {
  for (const Case& k :
       {Case{"v2_greedy", "deepseek_v2"}, Case{"v2_group_limited", "deepseek_v2", 4, 2},
        Case{"v3_noaux_tc", "deepseek_v3", 4, 2}, Case{"v3_yarn", "deepseek_v3", 2, 1, true}}) {
    SCOPED_TRACE(k.name);
    SynthWriteOptions o = DeepseekOptions(k.arch, k.name);
    o.model.n_group = k.n_group;
    o.model.topk_group = k.topk_group;
    const SynthOutputs out = Write(o);
    if (k.yarn) {
      nlohmann::json j = ReadConfig(out.hf_dir);
      j["rope_scaling"] = {{"type", "yarn"},
                           {"factor", 8.0},
                           {"beta_fast", 32},
                           {"beta_slow", 1},
                           {"mscale", 0.707},
                           {"mscale_all_dim", 0.707},
                           {"original_max_position_embeddings", 32}};
      WriteConfig(out.hf_dir, j);
    }
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->config().moe_topk == MoeTopk::kGroupLimited, k.name == "v2_group_limited");
    const std::vector<TokenId> prompt = Prompt(37);
    const std::vector<float> ref = ReferenceDeepseekLogits(*m->weights, prompt);
    const std::vector<float> got = LastLogits(*m, prompt, 2);
    ASSERT_EQ(got.size(), ref.size());
    float max_ref = 0.0f;
    const float err = MaxRelativeError(got, ref, &max_ref);
    // f32 activations against a double reference: 1e-4 of the logits' scale.
    std::printf("%s: max |logit| %.4f, relative error %.3g\n", k.name.c_str(), max_ref, err);
    EXPECT_LE(err, 1e-4f);
    EXPECT_GT(max_ref, 0.1f);
  }
}

// llama.cpp's deepseek2 GGUF: the synthesizer's copy (kv_b_proj whole as attn_kv_b) loads to the
// same model as the Hugging Face directory, and so does a copy rewritten the way newer
// converters split it (attn_k_b = per-head W_UK^T [heads, rank, nope], attn_v_b = W_UV
// [heads, v, rank]).
TEST(MlaTest, GgufCopiesMatchTheReference) {
  for (const std::string arch : {"deepseek_v2", "deepseek_v3"}) {
    SCOPED_TRACE(arch);
    SynthWriteOptions o = DeepseekOptions(arch, arch + "_gguf");
    o.format = SynthFormat::kBoth;
    const SynthOutputs out = Write(o);
    absl::StatusOr<LoadedModel> hf = LoadModel(out.hf_dir);
    ASSERT_TRUE(hf.ok()) << hf.status();
    absl::StatusOr<LoadedModel> gguf = LoadModel(out.gguf_path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    const ModelConfig& a = hf->config();
    const ModelConfig& b = gguf->config();
    EXPECT_EQ(b.architecture, arch);
    EXPECT_EQ(b.kv_cache_dim(), a.kv_cache_dim());
    EXPECT_EQ(b.q_lora_rank, a.q_lora_rank);
    EXPECT_EQ(b.v_head_dim, a.v_head_dim);
    EXPECT_EQ(b.moe_topk, a.moe_topk);
    EXPECT_EQ(b.n_group, a.n_group);
    EXPECT_EQ(b.routed_scaling_factor, a.routed_scaling_factor);
    EXPECT_EQ(b.norm_topk_prob, a.norm_topk_prob);
    EXPECT_EQ(b.n_shared_experts, a.n_shared_experts);
    EXPECT_EQ(b.first_k_dense_replace, a.first_k_dense_replace);
    const std::vector<TokenId> prompt = Prompt(31);
    const std::vector<float> ref = ReferenceDeepseekLogits(*hf->weights, prompt);
    float max_ref = 0.0f;
    EXPECT_LE(MaxRelativeError(LastLogits(*gguf, prompt, 2), ref, &max_ref), 1e-4f);

    // The split layout.
    absl::StatusOr<GgufFile> file = GgufFile::Open(out.gguf_path);
    ASSERT_TRUE(file.ok()) << file.status();
    GgufWriter w;
    for (const auto& [key, value] : file->metadata()) {
      if (key != "general.alignment") w.Set(key, value);
    }
    const int64_t heads = a.num_heads, nope = a.qk_nope_head_dim, v = a.v_head_dim;
    const int64_t rank = a.kv_lora_rank;
    for (const GgufTensorInfo& t : file->tensors()) {
      const absl::string_view bytes(reinterpret_cast<const char*>(t.data), t.nbytes);
      if (t.name.find("attn_kv_b") == std::string::npos) {
        w.AddTensor(t.name, t.type, t.dims, bytes);
        continue;
      }
      ASSERT_EQ(t.type, GgmlType::kF32);
      const float* kv_b = reinterpret_cast<const float*>(t.data);  // [heads * (nope + v), rank]
      std::vector<float> k_b(heads * rank * nope), v_b(heads * v * rank);
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < nope; ++j) {
          for (int64_t r = 0; r < rank; ++r) {
            k_b[(h * rank + r) * nope + j] = kv_b[(h * (nope + v) + j) * rank + r];
          }
        }
        for (int64_t i = 0; i < v; ++i) {
          for (int64_t r = 0; r < rank; ++r) {
            v_b[(h * v + i) * rank + r] = kv_b[(h * (nope + v) + nope + i) * rank + r];
          }
        }
      }
      const std::string layer = t.name.substr(0, t.name.find("attn_kv_b"));
      w.AddTensor(layer + "attn_k_b.weight", GgmlType::kF32, {nope, rank, heads},
                  absl::string_view(reinterpret_cast<const char*>(k_b.data()), k_b.size() * 4));
      w.AddTensor(layer + "attn_v_b.weight", GgmlType::kF32, {rank, v, heads},
                  absl::string_view(reinterpret_cast<const char*>(v_b.data()), v_b.size() * 4));
    }
    const std::string split_path = o.out_dir + "/split.gguf";
    ASSERT_TRUE(w.WriteFile(split_path).ok());
    absl::StatusOr<LoadedModel> split = LoadModel(split_path);
    ASSERT_TRUE(split.ok()) << split.status();
    const TensorView& joined = split->weights->layers[1].wkv_b;
    const TensorView& whole = hf->weights->layers[1].wkv_b;
    ASSERT_EQ(joined.shape, whole.shape);
    EXPECT_EQ(std::memcmp(joined.data, whole.data, whole.nbytes()), 0);
    EXPECT_LE(MaxRelativeError(LastLogits(*split, prompt, 2), ref, &max_ref), 1e-4f);
  }
}

// The latent row goes through every KV dtype: logits stay near the f32 cache's.
TEST(MlaTest, EveryKvDtypeHoldsTheLatentRows) {
  const SynthOutputs out = Write(DeepseekOptions("deepseek_v3", "kv_dtypes"));
  absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<TokenId> prompt = Prompt(29);
  const std::vector<float> f32 = LastLogits(*m, prompt, 1);
  for (KvCacheDType dtype :
       {KvCacheDType::kBF16, KvCacheDType::kF16, KvCacheDType::kInt8, KvCacheDType::kFp8E4M3}) {
    SCOPED_TRACE(KvCacheDTypeName(dtype));
    const std::vector<float> got = LastLogits(*m, prompt, 1, dtype);
    float max_ref = 0.0f;
    const float err = MaxRelativeError(got, f32, &max_ref);
    std::printf("%s cache: relative error %.3g against f32\n",
                std::string(KvCacheDTypeName(dtype)).c_str(), err);
    EXPECT_LE(err, dtype == KvCacheDType::kFp8E4M3 ? 0.1f : 0.03f);
    EXPECT_GT(err, 0.0f);  // the dtype really was used
  }
}

// ---- Through the engine ----

TEST(MlaTest, GreedyIsTheSameAloneBatchedChunkedAndOverTwoRanks) {
  for (const std::string arch : {"deepseek_v2", "deepseek_v3"}) {
    SCOPED_TRACE(arch);
    const SynthOutputs out = Write(DeepseekOptions(arch, arch));
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    // Under tensor parallelism the heads split over the ranks and the latent row is replicated.
    testing_engine::ExpectFamilyBatchInvariance(*m, Prompt);
  }
}

// Many requests sharing prefixes in a pool too small for all of them: prefix hits, preemption,
// and every request's tokens and log-probabilities as alone.
TEST(MlaTest, PrefixSharingAndPreemptionKeepTheTokens) {
  const SynthOutputs out = Write(DeepseekOptions("deepseek_v3", "prefix"));
  absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  testing_engine::ExpectPrefixSharingAndPreemptionKeepTheTokens(*m, Prompt);
}

// ---- Memory accounting ----

TEST(MlaTest, KvBytesAndParametersMatchThePlanner) {
  for (const std::string arch : {"deepseek_v2", "deepseek_v3"}) {
    SCOPED_TRACE(arch);
    const SynthOutputs out = Write(DeepseekOptions(arch, arch));
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    // One latent row of 32 + 8 values per layer: no V, no per-head K.
    EXPECT_EQ(KvCache::BytesPerToken(m->config(), KvCacheDType::kF32), 3 * 40 * 4);
    absl::StatusOr<std::unique_ptr<KvCache>> cache =
        KvCache::Create(m->config(), 4, 16, KvCacheDType::kBF16);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_EQ((*cache)->layout().num_kv_heads, 1);
    EXPECT_EQ((*cache)->layout().head_dim, 40);
    EXPECT_EQ((*cache)->v(0).data, nullptr);
    for (const std::string& path : {out.hf_dir, out.hf_dir + "/config.json"}) {
      absl::StatusOr<ModelSpec> spec = LoadModelSpec(path);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_TRUE(spec->IsMla()) << path;
      EXPECT_EQ(spec->NumMoeLayers(), 2) << path;
      for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kBF16, KvCacheDType::kInt8}) {
        absl::StatusOr<int64_t> planned = KvBytesPerToken(*spec, dtype, 1);
        ASSERT_TRUE(planned.ok()) << planned.status();
        EXPECT_EQ(*planned, KvCache::BytesPerToken(m->config(), dtype)) << path;
        // Every rank caches the whole latent row.
        absl::StatusOr<int64_t> planned2 = KvBytesPerToken(*spec, dtype, 2);
        ASSERT_TRUE(planned2.ok());
        EXPECT_EQ(*planned2, *planned);
      }
    }
    absl::StatusOr<ModelSpec> config_only = LoadModelSpec(out.hf_dir + "/config.json");
    ASSERT_TRUE(config_only.ok());
    EXPECT_EQ(CountParameters(*config_only).total(), out.num_params);
    absl::StatusOr<ModelSpec> dir = LoadModelSpec(out.hf_dir);
    ASSERT_TRUE(dir.ok());
    ASSERT_TRUE(dir->tensor_bytes.has_value());
    EXPECT_EQ(dir->tensor_bytes->total(), m->weights->TotalBytes());
  }
}

// DeepSeek-V3's published config.json: the engine's cache row and the planner agree on 576
// values (512 latent + 64 rope) per token and layer, 70,272 bytes per token in bf16.
TEST(MlaTest, DeepseekV3ShapedConfigMatchesThePlanner) {
  const nlohmann::json j = {{"architectures", {"DeepseekV3ForCausalLM"}},
                            {"model_type", "deepseek_v3"},
                            {"hidden_size", 7168},
                            {"intermediate_size", 18432},
                            {"moe_intermediate_size", 2048},
                            {"num_hidden_layers", 61},
                            {"num_attention_heads", 128},
                            {"num_key_value_heads", 128},
                            {"n_shared_experts", 1},
                            {"n_routed_experts", 256},
                            {"num_experts_per_tok", 8},
                            {"routed_scaling_factor", 2.5},
                            {"kv_lora_rank", 512},
                            {"q_lora_rank", 1536},
                            {"qk_rope_head_dim", 64},
                            {"qk_nope_head_dim", 128},
                            {"v_head_dim", 128},
                            {"n_group", 8},
                            {"topk_group", 4},
                            {"topk_method", "noaux_tc"},
                            {"scoring_func", "sigmoid"},
                            {"norm_topk_prob", true},
                            {"first_k_dense_replace", 3},
                            {"moe_layer_freq", 1},
                            {"max_position_embeddings", 163840},
                            {"rms_norm_eps", 1e-6},
                            {"rope_theta", 10000},
                            {"rope_scaling",
                             {{"type", "yarn"},
                              {"factor", 40},
                              {"beta_fast", 32},
                              {"beta_slow", 1},
                              {"mscale", 1.0},
                              {"mscale_all_dim", 1.0},
                              {"original_max_position_embeddings", 4096}}},
                            {"vocab_size", 129280},
                            {"tie_word_embeddings", false},
                            {"hidden_act", "silu"}};
  absl::StatusOr<ModelConfig> c = ParseHfConfig(j.dump(), "", "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_cache_dim(), 576);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kYarn);
  // softmax scale: 192^-0.5 x (0.1 ln 40 + 1)^2.
  EXPECT_NEAR(c->attention_scale(), std::pow(192.0, -0.5) * std::pow(0.1 * std::log(40.0) + 1, 2),
              1e-7);
  const int64_t engine_bf16 = KvCache::BytesPerToken(*c, KvCacheDType::kBF16);
  EXPECT_EQ(engine_bf16, 70272);
  const std::string dir = test_util::ScratchPath("v3_config");
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", j.dump()).ok());
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir + "/config.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (KvCacheDType dtype : {KvCacheDType::kBF16, KvCacheDType::kFp8E4M3}) {
    absl::StatusOr<int64_t> planned = KvBytesPerToken(*spec, dtype, 8);
    ASSERT_TRUE(planned.ok()) << planned.status();
    EXPECT_EQ(*planned, KvCache::BytesPerToken(*c, dtype));
    std::printf("DeepSeek-V3 KV bytes per token, %s: engine %lld, planner %lld\n",
                std::string(KvCacheDTypeName(dtype)).c_str(),
                static_cast<long long>(KvCache::BytesPerToken(*c, dtype)),
                static_cast<long long>(*planned));
  }
  // Against full multi-head K and V of the same heads: 2 x 61 x 128 x (192 + 128) / 2 x 2 bytes.
  std::printf("DeepSeek-V3 full-MHA K/V per token would be %lld bytes (%.1fx)\n",
              static_cast<long long>(int64_t{61} * 128 * (192 + 128) * 2),
              static_cast<double>(int64_t{61} * 128 * (192 + 128) * 2) / engine_bf16);
}

}  // namespace
}  // namespace kvserve
