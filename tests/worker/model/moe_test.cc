// Mixture-of-experts models: tiny random Mixtral and Qwen3-MoE models written by `kvserve synth
// --arch mixtral|qwen3moe` (4 experts, top-2) load from their Hugging Face directories and GGUF
// files (experts stacked per role, as llama.cpp writes them), and their
// logits match a plain reference forward pass written here from the model descriptions (router
// softmax over all experts, top-k with ties to the lower index, renormalized for Mixtral and for
// Qwen3-MoE with norm_topk_prob, each token's experts evaluated one by one and summed in
// double). Greedy decoding is identical alone, batched, chunked and over two tensor-parallel
// ranks; inconsistent configs and missing expert tensors are refused by name; and the engine's
// KV pool spends what `kvserve plan` counts per token.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
#include "worker/loader/safetensors_file.h"
#include "worker/loader/safetensors_writer.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synth_writer.h"
#include "worker/planner/capacity_planner.h"
#include "worker/planner/model_spec_loader.h"

namespace kvserve {
namespace {

using testing_model::LastLogits;

constexpr int kHidden = 64;
constexpr int kExperts = 4;
constexpr int kTopK = 2;

/// "mixtral" or "qwen3_moe": 2 layers, 4 experts of which each token runs 2.
SynthWriteOptions MoeOptions(const std::string& arch, const std::string& name) {
  SynthWriteOptions o;
  o.model.architecture = arch;
  o.model.num_layers = 2;
  o.model.hidden_size = kHidden;
  o.model.num_heads = 4;
  o.model.num_kv_heads = 2;
  o.model.head_dim = arch == "qwen3_moe" ? 32 : 0;
  o.model.intermediate_size = 96;
  o.model.num_experts = kExperts;
  o.model.num_experts_per_tok = kTopK;
  o.model.moe_intermediate_size = arch == "qwen3_moe" ? 48 : 0;
  o.model.vocab_size = 600;
  o.model.max_position_embeddings = 128;
  o.model.seed = 5;
  o.out_dir = test_util::ScratchPath(name);
  o.format = SynthFormat::kHf;
  return o;
}

SynthOutputs WriteMoe(const std::string& arch, const std::string& name) {
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(MoeOptions(arch, name));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : SynthOutputs{};
}

using testing_model::ReadConfig;
using testing_model::WriteConfig;

// The reference forward pass: tests/worker/model/reference_forward.h.
using testing_model::ReferenceLogits;

std::vector<TokenId> Prompt(int n) { return testing_model::SpreadPrompt(n); }

// ---- Loading ----

TEST(MoeTest, SynthWritesMixtralAndQwen3MoeConfigs) {
  for (const std::string arch : {"mixtral", "qwen3_moe"}) {
    const SynthOutputs out = WriteMoe(arch, arch);
    const nlohmann::json j = ReadConfig(out.hf_dir);
    EXPECT_EQ(j["model_type"], arch);
    EXPECT_EQ(j["num_experts_per_tok"], kTopK);
    if (arch == "mixtral") {
      EXPECT_EQ(j["architectures"][0], "MixtralForCausalLM");
      EXPECT_EQ(j["num_local_experts"], kExperts);
    } else {
      EXPECT_EQ(j["architectures"][0], "Qwen3MoeForCausalLM");
      EXPECT_EQ(j["num_experts"], kExperts);
      EXPECT_EQ(j["moe_intermediate_size"], 48);
    }
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = m->config();
    EXPECT_EQ(c.architecture, arch);
    EXPECT_EQ(c.num_experts, kExperts);
    EXPECT_EQ(c.num_experts_per_tok, kTopK);
    EXPECT_EQ(c.moe_intermediate_size, arch == "mixtral" ? 96 : 48);
    EXPECT_EQ(c.qk_norm, arch == "qwen3_moe");
    const LayerWeights& l = m->weights->layers[1];
    EXPECT_FALSE(l.w_gate.present());
    EXPECT_EQ(l.router.shape, (std::vector<int64_t>{kExperts, kHidden}));
    ASSERT_EQ(l.experts.size(), size_t{kExperts});
    EXPECT_EQ(l.experts[3].w_down.shape, (std::vector<int64_t>{kHidden, c.moe_intermediate_size}));
  }
}

// The GGUF copy (llama.cpp's layout: Mixtral as architecture "llama" with an expert count,
// Qwen3-MoE as "qwen3moe", experts stacked per role) loads to the same model: its logits match
// the reference computed from the Hugging Face copy's weights. A q8_0 file matches its
// dequantized f32 twin.
TEST(MoeTest, GgufCopiesLoadAndMatchTheReference) {
  for (const std::string arch : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(arch);
    SynthWriteOptions o = MoeOptions(arch, arch + "_gguf");
    o.format = SynthFormat::kBoth;
    absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
    ASSERT_TRUE(out.ok()) << out.status();
    absl::StatusOr<LoadedModel> gguf = LoadModel(out->gguf_path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    absl::StatusOr<LoadedModel> hf = LoadModel(out->hf_dir);
    ASSERT_TRUE(hf.ok()) << hf.status();
    const ModelConfig& c = gguf->config();
    EXPECT_EQ(c.architecture, arch);
    EXPECT_EQ(c.num_experts, kExperts);
    EXPECT_EQ(c.num_experts_per_tok, kTopK);
    EXPECT_EQ(c.moe_intermediate_size, hf->config().moe_intermediate_size);
    EXPECT_EQ(c.norm_topk_prob, hf->config().norm_topk_prob);
    ASSERT_EQ(gguf->weights->layers[1].experts.size(), size_t{kExperts});
    // Expert 3's down projection is the 4th slab of the stacked tensor, bytes as in the HF file.
    const TensorView& down = gguf->weights->layers[1].experts[3].w_down;
    const TensorView& hf_down = hf->weights->layers[1].experts[3].w_down;
    ASSERT_EQ(down.shape, hf_down.shape);
    EXPECT_EQ(std::memcmp(down.data, hf_down.data, down.nbytes()), 0);
    const std::vector<TokenId> prompt = Prompt(23);
    const std::vector<float> ref = ReferenceLogits(*hf->weights, prompt);
    EXPECT_LE(testing_model::MaxRelativeError(LastLogits(*gguf, prompt, 2), ref), 1e-4f);
    // The planner reads the same shape from the file.
    absl::StatusOr<ModelSpec> spec = LoadModelSpec(out->gguf_path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->model_type, arch);
    EXPECT_EQ(spec->moe.num_routed_experts, kExperts);
    EXPECT_EQ(spec->moe.moe_intermediate_size, c.moe_intermediate_size);
    ASSERT_TRUE(spec->tensor_bytes.has_value());
    EXPECT_EQ(spec->tensor_bytes->total(), gguf->weights->TotalBytes());
  }
  SynthWriteOptions q = MoeOptions("mixtral", "mixtral_q8");
  q.format = SynthFormat::kGguf;
  q.model.dtype = DType::kQ8_0;
  q.dequantized_twin_path = q.out_dir + "/f32.gguf";
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(q);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<LoadedModel> quant = LoadModel(out->gguf_path);
  ASSERT_TRUE(quant.ok()) << quant.status();
  EXPECT_EQ(quant->weights->layers[0].experts[1].w_up.dtype, DType::kQ8_0);
  absl::StatusOr<LoadedModel> twin = LoadModel(out->dequantized_twin_path);
  ASSERT_TRUE(twin.ok()) << twin.status();
  const std::vector<TokenId> prompt = Prompt(19);
  float max_ref = 0.0f;
  const float err = testing_model::MaxRelativeError(LastLogits(*quant, prompt, 1),
                                                    LastLogits(*twin, prompt, 1), &max_ref);
  // q8_0 activations are quantized to 8 bits for the integer dot products: 2% of the scale.
  std::printf("mixtral q8_0 against its f32 twin: relative error %.3g (max |logit| %.3g)\n", err,
              max_ref);
  EXPECT_LE(err, 0.02f);
}

TEST(MoeTest, InconsistentConfigsAndMissingExpertsAreRefused) {
  const SynthOutputs out = WriteMoe("mixtral", "mixtral");
  const nlohmann::json base = ReadConfig(out.hf_dir);
  auto load_error = [&](const nlohmann::json& j) {
    WriteConfig(out.hf_dir, j);
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    EXPECT_FALSE(m.ok());
    return m.ok() ? std::string() : std::string(m.status().message());
  };
  nlohmann::json j = base;
  j["num_experts_per_tok"] = kExperts + 1;
  std::string msg = load_error(j);
  EXPECT_NE(msg.find("num_experts_per_tok 5 must be in [1, 4]"), std::string::npos) << msg;
  j = base;
  j.erase("num_local_experts");
  msg = load_error(j);
  EXPECT_NE(msg.find("num_local_experts"), std::string::npos) << msg;
  // More experts than the checkpoint holds: the router's shape says so first.
  j = base;
  j["num_local_experts"] = 5;
  msg = load_error(j);
  EXPECT_NE(msg.find("block_sparse_moe.gate.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("num_experts 5"), std::string::npos) << msg;
  WriteConfig(out.hf_dir, base);

  // A checkpoint missing one expert's matrix.
  const std::string st_path = out.hf_dir + "/model.safetensors";
  {
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(st_path);
    ASSERT_TRUE(f.ok()) << f.status();
    SafetensorsWriter w;
    for (const SafetensorsTensor& t : f->tensors()) {
      if (t.name == "model.layers.1.block_sparse_moe.experts.2.w3.weight") continue;
      w.AddTensor(t.name, t.dtype, t.shape,
                  absl::string_view(reinterpret_cast<const char*>(t.data), t.nbytes()));
    }
    ASSERT_TRUE(w.WriteFile(st_path + ".tmp").ok());
  }
  std::filesystem::rename(st_path + ".tmp", st_path);
  absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message())
                .find("missing tensor 'model.layers.1.block_sparse_moe.experts.2.w3.weight'"),
            std::string::npos)
      << m.status();

  // Qwen3-MoE layouts with dense layers among the MoE ones are refused by name.
  const SynthOutputs q = WriteMoe("qwen3_moe", "qwen3_moe");
  const nlohmann::json qbase = ReadConfig(q.hf_dir);
  for (const auto& [key, value] : {std::pair<std::string, nlohmann::json>{"decoder_sparse_step", 2},
                                   {"mlp_only_layers", nlohmann::json::array({0})}}) {
    nlohmann::json jq = qbase;
    jq[key] = value;
    WriteConfig(q.hf_dir, jq);
    absl::StatusOr<LoadedModel> mq = LoadModel(q.hf_dir);
    ASSERT_FALSE(mq.ok()) << key;
    EXPECT_NE(std::string(mq.status().message()).find(key), std::string::npos) << mq.status();
  }
}

// ---- Logits ----

struct Case {
  std::string arch;
  bool norm_topk_prob;
};

TEST(MoeTest, LogitsMatchThePlainReference) {
  for (const Case& k : {Case{"mixtral", true}, Case{"qwen3_moe", true}, Case{"qwen3_moe", false}}) {
    const std::string name = absl::StrCat(k.arch, k.norm_topk_prob ? "_norm" : "_raw");
    const SynthOutputs out = WriteMoe(k.arch, name);
    if (k.arch == "qwen3_moe") {
      nlohmann::json j = ReadConfig(out.hf_dir);
      j["norm_topk_prob"] = k.norm_topk_prob;
      WriteConfig(out.hf_dir, j);
    }
    absl::StatusOr<LoadedModel> hf = LoadModel(out.hf_dir);
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_EQ(hf->config().norm_topk_prob, k.norm_topk_prob);
    const std::vector<TokenId> prompt = Prompt(23);
    const std::vector<float> ref = ReferenceLogits(*hf->weights, prompt);
    float max_ref = 0.0f;
    const float err = testing_model::MaxRelativeError(LastLogits(*hf, prompt, 2), ref, &max_ref);
    // f32 activations against a double reference: 1e-4 of the logits' scale.
    std::printf("%s: max |logit| %.4f, relative error %.3g\n", name.c_str(), max_ref, err);
    EXPECT_LE(err, 1e-4f) << name;
    EXPECT_GT(max_ref, 0.1f) << name;
  }
}

// ---- Batch invariance through the engine ----

TEST(MoeTest, GreedyIsTheSameAloneBatchedChunkedAndPreempted) {
  for (const std::string arch : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(arch);
    const SynthOutputs out = WriteMoe(arch, arch);
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    // Batched, the other requests' tokens go to other experts in the same steps; under tensor
    // parallelism every expert is split over the ranks and the router replicated.
    testing_engine::ExpectFamilyBatchInvariance(*m, Prompt);
    // Requests sharing a prefix in a pool that forces preemption keep their tokens.
    testing_engine::ExpectPrefixSharingAndPreemptionKeepTheTokens(*m, Prompt);
  }
}

// ---- Planner ----

TEST(MoeTest, KvBytesAndParametersMatchThePlanner) {
  for (const std::string arch : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(arch);
    const SynthOutputs out = WriteMoe(arch, arch);
    absl::StatusOr<LoadedModel> m = LoadModel(out.hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    for (const std::string& path : {out.hf_dir, out.hf_dir + "/config.json"}) {
      absl::StatusOr<ModelSpec> spec = LoadModelSpec(path);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_EQ(spec->model_type, arch) << path;
      EXPECT_FALSE(spec->assumed_llama_like) << path;
      EXPECT_EQ(spec->moe.num_routed_experts, kExperts) << path;
      EXPECT_EQ(spec->NumMoeLayers(), 2) << path;
      for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kBF16, KvCacheDType::kInt8}) {
        absl::StatusOr<int64_t> planned = KvBytesPerToken(*spec, dtype, 1);
        ASSERT_TRUE(planned.ok()) << planned.status();
        EXPECT_EQ(*planned, KvCache::BytesPerToken(m->config(), dtype)) << path;
      }
    }
    // Every expert counts: the parameters from config.json alone are the tensors written, and
    // the bytes the directory's headers list are the bytes the engine loaded.
    absl::StatusOr<ModelSpec> config_only = LoadModelSpec(out.hf_dir + "/config.json");
    ASSERT_TRUE(config_only.ok());
    EXPECT_EQ(CountParameters(*config_only).total(), out.num_params);
    absl::StatusOr<ModelSpec> dir = LoadModelSpec(out.hf_dir);
    ASSERT_TRUE(dir.ok());
    ASSERT_TRUE(dir->tensor_bytes.has_value());
    EXPECT_EQ(dir->tensor_bytes->total(), m->weights->TotalBytes());
  }
}

}  // namespace
}  // namespace kvserve
