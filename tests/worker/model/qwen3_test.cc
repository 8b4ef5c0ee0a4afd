// Qwen3 dense models: a tiny random Qwen3 written by `kvserve synth --arch qwen3` (head_dim 32,
// not hidden / heads = 16) loads from its Hugging Face directory and its GGUF file alike, and
// its logits match a plain reference forward pass written here from the Qwen3 description
// (per-head q/k RMSNorm before rotate_half RoPE, GQA, SwiGLU). Greedy decoding is identical
// alone, batched, chunked and over two tensor-parallel ranks; a head_dim that contradicts the
// projections is refused by name; and the engine's KV pool spends what `kvserve plan` counts per
// token.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf_writer.h"
#include "common/io/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util/scratch_dir.h"
#include "tests/worker/engine/engine_test_util.h"
#include "tests/worker/model/model_test_util.h"
#include "tests/worker/model/reference_forward.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synth_writer.h"
#include "worker/model/synthetic_model.h"
#include "worker/planner/capacity_planner.h"
#include "worker/planner/model_spec_loader.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using testing_model::LastLogits;

constexpr int kHidden = 64;
constexpr int kHeads = 4;
constexpr int kKvHeads = 2;
constexpr int kHeadDim = 32;  // != kHidden / kHeads

SynthWriteOptions Qwen3Options(const std::string& name, bool tied) {
  SynthWriteOptions o;
  o.model.architecture = "qwen3";
  o.model.num_layers = 2;
  o.model.hidden_size = kHidden;
  o.model.num_heads = kHeads;
  o.model.num_kv_heads = kKvHeads;
  o.model.head_dim = kHeadDim;
  o.model.intermediate_size = 96;
  o.model.vocab_size = 600;
  o.model.max_position_embeddings = 128;
  o.model.tie_word_embeddings = tied;
  o.model.seed = 11;
  o.out_dir = test_util::ScratchPath(name);
  return o;
}

/// Writes the model once per test (the scratch directory is per test).
SynthOutputs WriteQwen3(const std::string& name, bool tied = false) {
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(Qwen3Options(name, tied));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : SynthOutputs{};
}

// The reference forward pass: tests/worker/model/reference_forward.h.
using testing_model::ReferenceLogits;

std::vector<TokenId> Prompt(int n) { return testing_model::SpreadPrompt(n); }

// ---- Loading ----

TEST(Qwen3Test, SynthWritesAQwen3Config) {
  const SynthOutputs out = WriteQwen3("model");
  std::string text = *ReadFileToString(out.hf_dir + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["model_type"], "qwen3");
  EXPECT_EQ(j["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(j["head_dim"], kHeadDim);
  EXPECT_EQ(j["attention_bias"], false);
  for (const std::string& path : {out.hf_dir, out.gguf_path}) {
    absl::StatusOr<LoadedModel> m = LoadModel(path);
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = m->config();
    EXPECT_EQ(c.architecture, "qwen3") << path;
    EXPECT_EQ(c.head_dim, kHeadDim) << path;
    EXPECT_TRUE(c.qk_norm) << path;
    EXPECT_FALSE(c.qkv_bias) << path;
    EXPECT_EQ(c.rope_style, RopeStyle::kHalfSplit) << path;
    ASSERT_EQ(m->weights->layers.size(), 2u);
    EXPECT_EQ(m->weights->layers[1].q_norm.numel(), kHeadDim) << path;
    EXPECT_EQ(m->weights->layers[1].k_norm.numel(), kHeadDim) << path;
    EXPECT_EQ(m->weights->layers[0].wq.shape, (std::vector<int64_t>{kHeads * kHeadDim, kHidden}));
    EXPECT_EQ(m->weights->layers[0].wo.shape, (std::vector<int64_t>{kHidden, kHeads * kHeadDim}));
  }
}

TEST(Qwen3Test, HeadDimContradictingTheProjectionsIsRefused) {
  const SynthOutputs out = WriteQwen3("model");
  const std::string config_path = out.hf_dir + "/config.json";
  nlohmann::json j = nlohmann::json::parse(*ReadFileToString(config_path));
  j.erase("head_dim");  // falls back to hidden / heads = 16: q_proj has 128 rows, not 64
  ASSERT_TRUE(WriteStringToFile(config_path, j.dump()).ok());
  absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(m.status().message());
  EXPECT_NE(msg.find("self_attn.q_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("head_dim 16"), std::string::npos) << msg;

  j["head_dim"] = 48;
  ASSERT_TRUE(WriteStringToFile(config_path, j.dump()).ok());
  m = LoadModel(out.hf_dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("head_dim 48"), std::string::npos) << m.status();
}

TEST(Qwen3Test, UnsupportedConfigsAreRefusedByName) {
  const SynthOutputs out = WriteQwen3("model");
  const std::string config_path = out.hf_dir + "/config.json";
  const nlohmann::json base = nlohmann::json::parse(*ReadFileToString(config_path));
  nlohmann::json j = base;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 64;
  ASSERT_TRUE(WriteStringToFile(config_path, j.dump()).ok());
  absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("use_sliding_window"), std::string::npos)
      << m.status();

  // attention_bias true is honoured, so a checkpoint without the biases is missing tensors.
  j = base;
  j["attention_bias"] = true;
  ASSERT_TRUE(WriteStringToFile(config_path, j.dump()).ok());
  m = LoadModel(out.hf_dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("self_attn.q_proj.bias"), std::string::npos)
      << m.status();

  // model_type and architectures must agree.
  j = base;
  j["architectures"] = {"Qwen2ForCausalLM"};
  ASSERT_TRUE(WriteStringToFile(config_path, j.dump()).ok());
  m = LoadModel(out.hf_dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("does not match"), std::string::npos)
      << m.status();
}

// ---- Logits ----

TEST(Qwen3Test, LogitsMatchThePlainReference) {
  for (bool tied : {false, true}) {
    const SynthOutputs out = WriteQwen3(tied ? "tied" : "untied", tied);
    absl::StatusOr<LoadedModel> hf = LoadModel(out.hf_dir);
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_EQ(hf->config().tie_word_embeddings, tied);
    const std::vector<TokenId> prompt = Prompt(23);
    const std::vector<float> ref = ReferenceLogits(*hf->weights, prompt);
    const std::vector<float> got = LastLogits(*hf, prompt, 2);
    ASSERT_EQ(got.size(), ref.size());
    float max_ref = 0.0f, max_err = 0.0f;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(ref[i]));
      max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
    }
    // f32 activations against a double reference: 1e-4 of the logits' scale.
    const float tolerance = 1e-4f * std::max(1.0f, max_ref);
    std::printf("qwen3 %s: max |logit| %.4f, max error %.3g (tolerance %.3g)\n",
                tied ? "tied" : "untied", max_ref, max_err, tolerance);
    EXPECT_LE(max_err, tolerance);
    // The q/k norm weights are not all ones: a model that skipped them would be far off.
    EXPECT_GT(max_ref, 0.1f);
  }
}

// attention_bias: q/k/v and o biases (random here) go where the reference puts them.
TEST(Qwen3Test, AttentionBiasesMatchThePlainReference) {
  SyntheticModelOptions o = Qwen3Options("unused", false).model;
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = MakeSyntheticModel(o);
  ASSERT_TRUE(w.ok()) << w.status();
  ModelConfig& c = (*w)->config;
  c.qkv_bias = c.o_bias = true;
  std::vector<std::unique_ptr<float[]>> buffers;
  auto bias = [&](int64_t n, float seed) {
    buffers.push_back(std::make_unique<float[]>(n));
    for (int64_t i = 0; i < n; ++i) buffers.back()[i] = 0.3f * std::sin(seed + 0.7f * i);
    return TensorView{"bias", DType::kF32, {n}, buffers.back().get()};
  };
  for (LayerWeights& l : (*w)->layers) {
    l.bq = bias(int64_t{kHeads} * kHeadDim, 1);
    l.bk = bias(int64_t{kKvHeads} * kHeadDim, 2);
    l.bv = bias(int64_t{kKvHeads} * kHeadDim, 3);
    l.bo = bias(kHidden, 4);
  }
  LoadedModel m{std::move(*w), nullptr};
  const std::vector<TokenId> prompt = Prompt(15);
  const std::vector<float> ref = ReferenceLogits(*m.weights, prompt);
  const std::vector<float> got = LastLogits(m, prompt);
  float max_ref = 0.0f, max_err = 0.0f;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
  }
  EXPECT_LE(max_err, 1e-4f * std::max(1.0f, max_ref));
  // Without the o bias the logits move well past that.
  for (LayerWeights& l : m.weights->layers) l.bo = TensorView{};
  const std::vector<float> no_bo = LastLogits(m, prompt);
  float moved = 0.0f;
  for (size_t i = 0; i < ref.size(); ++i) moved = std::max(moved, std::fabs(no_bo[i] - ref[i]));
  EXPECT_GT(moved, 1e-2f);
}

TEST(Qwen3Test, HfAndGgufGiveTheSameLogits) {
  const SynthOutputs out = WriteQwen3("model");
  absl::StatusOr<LoadedModel> hf = LoadModel(out.hf_dir);
  absl::StatusOr<LoadedModel> gguf = LoadModel(out.gguf_path);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  EXPECT_EQ(gguf->weights->format, "gguf");
  const std::vector<TokenId> prompt = Prompt(17);
  // Same f32 weights in the same row order and the same RoPE layout: the same bits.
  EXPECT_EQ(LastLogits(*hf, prompt), LastLogits(*gguf, prompt));
}

// ---- Batch invariance through the engine ----

using testing_engine::RunAlone;
EngineOptions EngineOpts() { return testing_engine::SmallModelOptions(); }

TEST(Qwen3Test, GreedyIsTheSameAloneBatchedChunkedAndPreempted) {
  const SynthOutputs out = WriteQwen3("model");
  absl::StatusOr<LoadedModel> m = LoadModel(out.gguf_path);
  ASSERT_TRUE(m.ok()) << m.status();
  const EngineRequest a = testing_engine::Greedy("a", Prompt(29), 12);
  EngineRequest b = testing_engine::Greedy("b", Prompt(9), 20);
  b.prompt_ids[3] = 77;
  const testing_engine::Collected alone = RunAlone(*m, a);
  ASSERT_EQ(alone.tokens.size(), 12u);

  // Under tensor parallelism the q/k norms are replicated and the heads split.
  testing_engine::ExpectSameBatchedChunkedAndTp(*m, a, {b}, alone, EngineOpts());
  // The HF copy decodes the same tokens.
  absl::StatusOr<LoadedModel> hf = LoadModel(out.hf_dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(RunAlone(*hf, a).tokens, alone.tokens);
  // Requests sharing a prefix in a pool that forces preemption keep their tokens.
  testing_engine::ExpectPrefixSharingAndPreemptionKeepTheTokens(*m, Prompt);
}

// ---- KV bytes: engine pool against the planner ----

TEST(Qwen3Test, KvBytesPerTokenMatchThePlanner) {
  const SynthOutputs out = WriteQwen3("model");
  absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  for (const std::string& path : {out.hf_dir, out.hf_dir + "/config.json", out.gguf_path}) {
    absl::StatusOr<ModelSpec> spec = LoadModelSpec(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->model_type, "qwen3") << path;
    EXPECT_FALSE(spec->assumed_llama_like) << path;
    EXPECT_EQ(spec->head_dim, kHeadDim) << path;
    EXPECT_TRUE(spec->qk_norm) << path;
    for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kBF16, KvCacheDType::kInt8}) {
      absl::StatusOr<int64_t> planned = KvBytesPerToken(*spec, dtype, 1);
      ASSERT_TRUE(planned.ok()) << planned.status();
      EXPECT_EQ(*planned, KvCache::BytesPerToken(m->config(), dtype)) << path;
    }
    // 2 layers x (k + v) x 2 kv heads x head_dim 32 x 4 bytes: the explicit head_dim counts.
    EXPECT_EQ(*KvBytesPerToken(*spec, KvCacheDType::kF32, 1), 2 * 2 * kKvHeads * kHeadDim * 4);
  }
  // The parameter count from config.json alone matches the tensors written (q/k norms included).
  absl::StatusOr<ModelSpec> config_only = LoadModelSpec(out.hf_dir + "/config.json");
  ASSERT_TRUE(config_only.ok());
  EXPECT_EQ(CountParameters(*config_only).total(), WriteQwen3("again").num_params);
}

}  // namespace
}  // namespace kvserve
